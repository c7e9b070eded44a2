"""``podracer tune``: measure a preset's layouts on this host and print (and save) the fastest."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile

from podracer.checkpoint import WRITE_FAILED_EXIT
from podracer.cli import trials
from podracer.cli.presets import ANAKIN_PRESETS, DEFAULT_ANAKIN_PRESET, DEFAULT_SEBULBA_PRESET, SEBULBA_PRESETS
from podracer.cli.terminal import Parser, cpu_device_count

PRESETS = {"sebulba": (SEBULBA_PRESETS, DEFAULT_SEBULBA_PRESET), "anakin": (ANAKIN_PRESETS, DEFAULT_ANAKIN_PRESET)}


def choose_preset(architecture: str, agent: str | None, env: str | None) -> str:
    """The preset for ``agent`` on ``env``: the one of both, else one of the agent on the same family of
    environments (Atari's ``-v5`` ids), else the architecture's default."""
    presets, default = PRESETS[architecture]
    if agent is None and env is None:
        return default
    for name, preset in presets.items():
        if preset["agent"] == (agent or preset["agent"]) and preset["env"] == (env or preset["env"]):
            return name
    for name, preset in presets.items():
        if preset["agent"] == agent and env and env.endswith("-v5") and preset["env"].endswith("-v5"):
            return name
    return default


def local_devices(cpu_devices: int | None) -> int:
    """How many devices a run here gets, asked of a fresh process (this one must not start JAX: on a GPU it would
    hold memory the trials need)."""
    if cpu_devices:
        return cpu_devices
    probe = [sys.executable, "-c", "import jax; print(jax.local_device_count())"]
    return int(subprocess.run(probe, capture_output=True, text=True, check=True, timeout=300).stdout.split()[-1])


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def _check_save_path(parser: argparse.ArgumentParser, path: str) -> None:
    """Refuses, before any trial, a ``--save`` path that cannot take the preset file: minutes of trials must not
    end in a file that cannot be written."""
    if not path.endswith(".json"):
        parser.error("--save takes a path ending in .json")
    if os.path.isdir(path):
        parser.error(f"--save {path}: that is a directory")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".podracer-tune-"):
            pass
    except OSError as error:
        parser.error(f"--save {path}: cannot write into {folder} ({error.strerror or error})")


def _verdict(ran: list[trials.Trial], best: trials.Trial) -> str:
    """What the trials found: the fastest layout against the preset's own, or that no alternative was measured
    (then nothing was compared, and nothing is claimed)."""
    measured = [t for t in ran[1:] if t.sps is not None]
    baseline = ran[0].sps
    if not measured:
        why = "; ".join(sorted({t.error for t in ran[1:] if t.error})) or "this host has no other layout to try"
        alone = f"the preset's own layout ran alone ({baseline:,.0f} steps/s)" if baseline else "nothing ran"
        return f"fastest: unknown: no alternative layout was measured ({why}); {alone}"
    flags = " ".join(best.flags) or f"(none: the preset's own layout is the fastest of {len(measured) + 1})"
    if baseline:
        gain = f", {best.sps / baseline:.2f}x the preset's {baseline:,.0f}"
    else:
        gain = f"; the preset's own layout was not measured ({ran[0].error}), so nothing says how much faster"
    return f"fastest: {flags}\n{best.sps:,.0f} steps/s{gain}"


def run_tune(argv: list[str]) -> int:
    parser = Parser(
        prog="podracer tune",
        description="Measure a preset's layouts on this host (Sebulba: device split, actor threads, envpool batches; "
        "Anakin: lanes, update loop), each a short run of its own, and print the fastest as flags.",
        epilog="Flags after -- are passed to every trial (e.g. -- --rollout-len 32).",
    )
    parser.add_argument("--architecture", choices=sorted(PRESETS), default="sebulba", help="(default: %(default)s)")
    parser.add_argument("--preset", default=None, help="the preset to tune (default: the one for --agent on --env)")
    parser.add_argument("--agent", default=None, help="the agent (default: the preset's)")
    parser.add_argument("--env", default=None, help="the environment (default: the preset's)")
    parser.add_argument("--minutes", type=_positive, default=5.0, help="time for all trials (default: %(default)s)")
    parser.add_argument(
        "--trial-seconds",
        type=_positive,
        default=20.0,
        help="training seconds per trial, after compiling (default: 20)",
    )
    parser.add_argument(
        "--cpu-devices", type=cpu_device_count, default=None, metavar="N", help="split the host CPU into N devices"
    )
    parser.add_argument("--save", default=None, metavar="PATH.json", help="write the fastest as a preset file")
    args, passed = parser.parse_known_args(argv)
    if passed and passed[0] == "--":
        passed = passed[1:]
    elif passed:
        parser.error(f"unrecognized arguments: {' '.join(passed)} (flags for the trials go after --)")
    presets, _ = PRESETS[args.architecture]
    name = args.preset or choose_preset(args.architecture, args.agent, args.env)
    if name not in presets:
        parser.error(f"--preset {name!r}: {args.architecture} has {', '.join(sorted(presets))}")
    if args.save:
        _check_save_path(parser, args.save)
    preset = presets[name]
    agent, env = args.agent or preset["agent"], args.env or preset["env"]
    try:
        devices = local_devices(args.cpu_devices)
    except (subprocess.SubprocessError, ValueError, IndexError) as error:
        print(f"podracer tune: error: could not count this host's devices with JAX ({error})", file=sys.stderr)
        return 2
    if args.architecture == "sebulba":
        group = preset["fit"](devices, os.cpu_count() or 1)
        candidates = trials.sebulba_candidates(group["sebulba"], devices, os.cpu_count() or 1)
    else:
        group = {"anakin": preset["anakin"], "agent_config": preset["agent_config"]}
        candidates = trials.anakin_candidates(group["anakin"], devices)
    base = [args.architecture, "--preset", name, "--agent", agent, "--env", env, *passed]
    if args.cpu_devices:
        base += ["--cpu-devices", str(args.cpu_devices)]
    print(
        f"podracer tune: {len(candidates)} layouts of --preset {name} ({agent} on {env}, {devices} device(s)), "
        f"{args.trial_seconds:g}s of training each, within {args.minutes:g} minutes",
        flush=True,
    )
    results = trials.tune(
        base, candidates, args.minutes, args.trial_seconds, report=lambda line: print(line, flush=True)
    )
    print("\n" + trials.table(results))
    best = trials.fastest(results)
    if best is None:
        print("podracer tune: error: no trial ran to the end; see the lines above", file=sys.stderr)
        return 1
    baseline = results[0].sps
    print("\n" + _verdict(results, best))
    if args.save:
        about = (
            f"--preset {name} with the layout podracer tune found fastest on {platform.node()}: {best.sps:,.0f} steps/s"
        )
        if agent != preset["agent"]:  # the trials ran the agent with its own defaults, not the preset's agent's
            group = {**group, "agent_config": {}}
        try:
            trials.save_preset(args.save, args.architecture, {**preset, "agent": agent, "env": env}, group, best, about)
        except OSError as error:  # checked at the start, so the disk filled or the folder went since
            print(
                f"podracer tune: error: could not write --save {args.save} ({error.strerror or error})", file=sys.stderr
            )
            return WRITE_FAILED_EXIT
        print(f"saved: {args.save} (train with: podracer {args.architecture} --preset {args.save})")
    measured = sum(t.sps is not None for t in results[1:])
    print(
        f"TUNE preset={name} fastest_sps={best.sps:.0f} preset_sps={baseline or 0:.0f} alternatives={measured} "
        f"flags={' '.join(best.flags)}"
    )
    return 0
