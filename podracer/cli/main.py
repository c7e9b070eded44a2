"""The ``podracer`` command: ``anakin`` and ``sebulba`` runs, ``presets``, ``plot``.

Agent flags depend on the agent, so ``podracer anakin --agent impala --help``
lists IMPALA's; a ``--preset`` fills in defaults that explicit flags override.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import NamedTuple

from podracer.agents import AGENTS
from podracer.anakin.config import AnakinConfig
from podracer.checkpoint import WRITE_FAILED_EXIT, CheckpointConfig, CheckpointWriteFailed
from podracer.cli.presets import (
    ANAKIN_PRESETS,
    DEFAULT_ANAKIN_PRESET,
    DEFAULT_SEBULBA_PRESET,
    SEBULBA_PRESETS,
    read_preset_file,
)
from podracer.cli.terminal import Parser, cpu_device_count, ends_quietly_on_a_closed_pipe
from podracer.config import add_flags, flag_name, from_flags, given_flags, round_up
from podracer.distributed import CoordinatorUnreachable, say_goodbye
from podracer.envs.host import HostEnvConfig
from podracer.errors import NonFiniteLossError
from podracer.evaluation import EvalConfig
from podracer.lock import LOCK_FILE, held_elsewhere
from podracer.rundir import read_run_config
from podracer.runlog import CONFIG_FILE
from podracer.sebulba.actor import prefer_synchronous_cpu_dispatch
from podracer.sebulba.config import SebulbaConfig, topology
from podracer.sebulba.lifecycle import WorkerFailed
from podracer.signals import arrived, route_signals_to_main_thread

DESCRIPTION = "podracer: the Podracer architectures (Anakin, Sebulba) for scalable RL in JAX."


def _anakin_batch_multiple(args: argparse.Namespace) -> tuple[int, str]:
    """What ``--num-envs`` must be a multiple of on this host, and why."""
    from podracer.anakin.run import select_devices

    devices = len(select_devices(args.num_devices))
    lanes = max(1, args.lanes)  # a bad --lanes is reported by the Anakin checks
    return devices * lanes, f"{devices} device(s) x {lanes} lane(s)"


def _sebulba_batch_multiple(args: argparse.Namespace) -> tuple[int, str]:
    """What ``--envs-per-thread`` must be a multiple of on this host, and why."""
    learners = len(topology(from_flags(SebulbaConfig, args)).learner_devices)
    batches = max(1, args.env_batches)  # a bad --env-batches is reported by the Sebulba checks
    return math.lcm(learners, batches), f"{learners} learner device(s) and {batches} env batch(es)"


class Architecture(NamedTuple):
    name: str
    description: str
    presets: dict
    default_preset: str
    env_help: str
    config_groups: tuple[tuple[str, type], ...]  # (title, dataclass) of architecture-level flags
    batch_flag: str  # the field that sets how many environments each replica gets
    batch_multiple: Callable[[argparse.Namespace], tuple[int, str]]  # what it must divide into, and why


ANAKIN = Architecture(
    "anakin",
    "Train an agent with Anakin: environments, acting and learning together on every device.",
    ANAKIN_PRESETS,
    DEFAULT_ANAKIN_PRESET,
    "catch, cartpole, gymnax:<id> (e.g. gymnax:Breakout-MinAtar, gymnax:Pendulum-v1) or brax:<name>[:<backend>] "
    "(e.g. brax:ant; needs the brax extra)",
    (("Anakin", AnakinConfig), ("checkpoints", CheckpointConfig), ("evaluation", EvalConfig)),
    "num_envs",
    _anakin_batch_multiple,
)
SEBULBA = Architecture(
    "sebulba",
    "Train an agent with Sebulba: envpool environments on the host, actor threads on actor devices, "
    "a data-parallel learner on learner devices.",
    SEBULBA_PRESETS,
    DEFAULT_SEBULBA_PRESET,
    "an envpool id, e.g. CartPole-v1, Breakout-v5, Pong-v5",
    (
        ("Sebulba", SebulbaConfig),
        ("host environments", HostEnvConfig),
        ("checkpoints", CheckpointConfig),
        ("evaluation", EvalConfig),
    ),
    "envs_per_thread",
    _sebulba_batch_multiple,
)
SAVED_GROUPS = {  # flag group title -> its key in config.json: a resume takes them as its defaults
    "Anakin": "anakin",
    "Sebulba": "sebulba",
    "host environments": "host_env",
    "checkpoints": "checkpoint",
    "evaluation": "evaluation",
}


def _default_run_dir(architecture: str, agent: str, env: str) -> str:
    env_name = re.sub(r"[^A-Za-z0-9_.-]+", "_", env)
    return f"runs/{architecture}-{agent}-{env_name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _add_start_flags(parser: argparse.ArgumentParser, arch: Architecture, preset: str, agent: str | None) -> None:
    """The flags that must be read before the others exist: the preset and agent (which decide the other
    flags and their defaults), a resumed run's directory, and what starts JAX (devices, processes)."""
    parser.add_argument(
        "--preset",
        type=lambda text: _preset_name(arch, text),
        default=preset,
        metavar="{" + ",".join(sorted(arch.presets)) + "} or PATH.json",
        help=f"settings to start from, or a preset file of 'podracer tune --save' (default: {arch.default_preset})",
    )
    parser.add_argument(
        "--agent",
        choices=sorted(AGENTS),
        default=agent,
        help="learning algorithm; its flags are listed below (default: %(default)s)",
    )
    parser.add_argument(
        "--cpu-devices",
        type=cpu_device_count,
        default=None,
        metavar="N",
        help="split the host CPU into N devices, to try multi-device runs without accelerators",
    )
    parser.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue the run in DIR from its newest checkpoint, with its saved settings "
        "(flags that change them are refused); from scratch if it holds no checkpoint yet",
    )
    parser.add_argument(
        "--logdir",
        default=None,
        help="run directory for config.json, metrics.jsonl, TensorBoard events and checkpoints "
        f"(default: runs/{arch.name}-<agent>-<env>-<time>)",
    )
    parser.add_argument(
        "--resume-or-start",
        action="store_true",
        help="with --logdir DIR: continue the run in DIR if there is one, else start it there "
        "(one command to retry on a preemptible VM)",
    )
    group = parser.add_argument_group("multi-process (started automatically on TPU VM slices and under Slurm)")
    group.add_argument(
        "--coordinator", default=None, metavar="HOST:PORT", help="address of process 0, which serves the coordinator"
    )
    group.add_argument("--num-processes", type=int, default=None, help="processes in the run (one per host)")
    group.add_argument("--process-id", type=int, default=None, help="this process's index, 0..N-1")
    group.add_argument(
        "--coordinator-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds to wait for the coordinator and the other processes (default: 300)",
    )


def _preset_name(arch: Architecture, text: str) -> str:
    if text in arch.presets or text.endswith(".json"):
        return text
    raise argparse.ArgumentTypeError(
        f"invalid choice: {text!r} (choose from {', '.join(sorted(arch.presets))} or PATH.json)"
    )


def preset_named(arch: Architecture, name: str) -> dict:
    """The preset ``name``, or the preset file at ``name`` (``.json``)."""
    return read_preset_file(name, arch.name) if name.endswith(".json") else arch.presets[name]


def _early_flags(arch: Architecture, argv: list[str]) -> argparse.Namespace:
    """Reads the flags that decide which other flags exist (and their defaults)."""
    early = Parser(prog=f"podracer {arch.name}", add_help=False)
    _add_start_flags(early, arch, arch.default_preset, None)
    return early.parse_known_args(argv)[0]


def _preset_defaults(arch: Architecture, preset: dict) -> dict:
    """``{"config group": {...}, "agent_config": {...}}`` for ``preset``, fitting host-dependent presets."""
    if "fit" not in preset:
        return {"Anakin": preset["anakin"], "agent_config": preset["agent_config"]}
    import jax

    fitted = preset["fit"](jax.local_device_count(), os.cpu_count() or 1)
    groups = {"Sebulba": fitted["sebulba"], "host environments": fitted.get("host_env", {})}
    return {**groups, "agent_config": fitted["agent_config"]}


def _resumed_defaults(arch: Architecture, run_dir: str) -> dict:
    """The saved run's settings, as defaults: ``--resume DIR`` alone continues it unchanged."""
    try:
        saved = read_run_config(run_dir)
    except FileNotFoundError:
        raise FileNotFoundError(f"--resume {run_dir}: no {CONFIG_FILE} there, so no run to resume") from None
    except ValueError as error:
        raise ValueError(f"--resume {run_dir}: {error}") from None
    architecture = saved["architecture"]
    settings = {"agent": saved["agent"], "env": saved["env"], "agent_config": saved["agent_config"]}
    if architecture != arch.name:
        raise ValueError(
            f"--resume {run_dir}: it holds a {architecture} run; continue it with "
            f"'podracer {architecture} --resume {run_dir}'"
        )
    return {**settings, **{title: saved[key] for title, key in SAVED_GROUPS.items() if key in saved}}


def _check_writable(run_dir: str, flag: str) -> None:
    """Makes ``run_dir`` (if missing) and checks that files can be written there, naming the flag if not."""
    try:
        os.makedirs(run_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as error:
        raise ValueError(f"{flag} {run_dir}: cannot write there ({error.strerror or error})") from None


def _discard_if_unused(run_dir: str, made_here: bool) -> None:
    """Removes the run directory this command made for a run that was refused before it wrote anything, unless
    another run holds it now (the same command started twice at once: each saw no directory, and the one refused
    must not delete the one that goes on)."""
    if made_here and os.path.isdir(run_dir) and set(os.listdir(run_dir)) <= {LOCK_FILE} and not held_elsewhere(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)


def build_parser(
    arch: Architecture, preset_name: str, agent_name: str | None, resumed: dict | None = None
) -> argparse.ArgumentParser:
    preset = preset_named(arch, preset_name)
    if resumed is not None:
        preset = {**preset, "agent": resumed["agent"], "env": resumed["env"]}
    agent_name = agent_name or preset["agent"]
    defaults = resumed or _preset_defaults(arch, preset)
    parser = Parser(
        prog=f"podracer {arch.name}",
        description=arch.description,
        epilog="Batch sizes are global and checked before compiling. Run 'podracer presets' for the presets.",
    )
    _add_start_flags(parser, arch, preset_name, agent_name)
    parser.add_argument("--env", default=preset["env"], help=f"{arch.env_help} (default: %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors and the RESULT line")
    for title, cls in arch.config_groups:
        add_flags(parser.add_argument_group(title), cls, defaults.get(title, {}))
    agent_defaults = defaults["agent_config"] if agent_name == preset["agent"] else {}
    add_flags(parser.add_argument_group(f"{agent_name} agent"), AGENTS[agent_name][0], agent_defaults)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, refusing a flag of another agent as such, in one line."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(_unknown_flags(unknown, args.agent))
    return args


def _unknown_flags(unknown: list[str], agent: str) -> str:
    """Why ``unknown`` (the words argparse did not take) are refused: the first that is another agent's flag is
    named with the agents that take it (``--help`` lists only the chosen agent's flags)."""
    for word in unknown:
        flag = word.split("=", 1)[0]
        owners = [name for name, (cls, _) in AGENTS.items() if name != agent and flag in _agent_flags(cls)]
        if owners:
            return f"{flag} is a flag of --agent {' and '.join(owners)}; --agent {agent} does not take it"
    return f"unrecognized arguments: {' '.join(unknown)}"


def _agent_flags(config_class: type) -> set[str]:
    return {flag_name(field.name) for field in dataclasses.fields(config_class)}


def fit_batch(arch: Architecture, args: argparse.Namespace) -> str | None:
    """Raises a preset's batch to the next multiple this host's devices need; returns the note to print.

    A batch set on the command line is left as it is (a wrong one is refused with
    a message before compiling), and so is a resumed run's.
    """
    value = getattr(args, arch.batch_flag)
    if value < 1:
        return None  # the architecture's own checks name the bad flag
    multiple, why = arch.batch_multiple(args)
    fitted = round_up(value, multiple)
    if fitted == value:
        return None
    setattr(args, arch.batch_flag, fitted)
    flag = flag_name(arch.batch_flag)
    return f"{flag} {value} (from --preset {args.preset}) raised to {fitted}, a multiple of {why}; set {flag} to choose"


def _train_anakin(args, agent_config, run_dir):
    from podracer.anakin.run import train

    config = from_flags(AnakinConfig, args)
    result = train(
        args.agent,
        agent_config,
        args.env,
        config,
        run_dir,
        quiet=args.quiet,
        checkpoint=from_flags(CheckpointConfig, args),
        resume=args.resume is not None,
        evaluation=from_flags(EvalConfig, args),
    )
    sps = result.env_steps * result.agents / max(result.train_seconds, 1e-9)
    return result, f"sps={sps:.0f}", result.stopped_by


def _train_sebulba(args, agent_config, run_dir):
    from podracer.sebulba.run import train

    result = train(
        args.agent,
        agent_config,
        args.env,
        from_flags(SebulbaConfig, args),
        from_flags(HostEnvConfig, args),
        run_dir=run_dir,
        quiet=args.quiet,
        checkpoint=from_flags(CheckpointConfig, args),
        resume=args.resume is not None,
        evaluation=from_flags(EvalConfig, args),
    )
    seconds = max(result.train_seconds, 1e-9)
    rates = f"sps={result.env_steps / seconds:.0f} fps={result.frames / seconds:.0f}"
    return result, rates, result.stopped_by


SIGNAL_EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}
TRAINERS: dict[str, Callable] = {"anakin": _train_anakin, "sebulba": _train_sebulba}


def _resume_or_start(early: argparse.Namespace) -> None:
    """``--logdir DIR --resume-or-start``: resume DIR if it holds a run's settings (sets ``early.resume``)."""
    if not early.resume_or_start:
        return
    if early.resume is not None or early.logdir is None:
        raise ValueError("--resume-or-start goes with --logdir DIR (and without --resume)")
    if os.path.exists(os.path.join(early.logdir, CONFIG_FILE)):
        early.resume = early.logdir


def _train(
    arch: Architecture,
    parser: argparse.ArgumentParser,
    argv: list[str],
    args: argparse.Namespace,
    resumed: dict | None,
    run_dir: str,
):
    """Checks every flag, makes the run directory and trains: ``(result, rates text, stopped_by)``."""
    import jax

    if resumed is None and arch.batch_flag not in given_flags(parser, argv):
        note = fit_batch(arch, args)
        if note and not args.quiet and jax.process_index() == 0:
            print(f"podracer {arch.name}: {note}", file=sys.stderr)
    agent_config = from_flags(AGENTS[args.agent][0], args)
    for _, group in arch.config_groups:
        from_flags(group, args)  # checks every flag before the run directory is made
    _check_writable(run_dir, "--resume" if args.resume else "--logdir")
    return TRAINERS[arch.name](args, agent_config, run_dir)


def _split_the_cpu(cpu_devices: int | None) -> None:
    """``--cpu-devices N``: N host CPU devices, set before JAX starts its backends. Where JAX already started in
    this process (a notebook), the devices it has must be those N; ValueError otherwise."""
    import jax

    from podracer.parallel import backends_started

    if not cpu_devices:
        return
    if not backends_started():
        jax.config.update("jax_num_cpu_devices", cpu_devices)
    elif len(jax.devices("cpu")) != cpu_devices:
        raise ValueError(
            f"--cpu-devices {cpu_devices}: JAX already started in this process with {len(jax.devices('cpu'))} CPU "
            "device(s), and that number is fixed once it has; run podracer in a fresh process (or drop the flag)"
        )


def run_architecture(arch: Architecture, argv: list[str]) -> int:
    early = _early_flags(arch, argv)
    try:
        _split_the_cpu(early.cpu_devices)
        from podracer.distributed import initialize

        initialize(early.coordinator, early.num_processes, early.process_id, early.coordinator_timeout)
        _resume_or_start(early)
        resumed = _resumed_defaults(arch, early.resume) if early.resume else None
        parser = build_parser(arch, early.preset, early.agent, resumed)
    except (ValueError, FileNotFoundError, CoordinatorUnreachable) as error:
        print(f"podracer {arch.name}: error: {error}", file=sys.stderr)
        return 2
    args = _parse(parser, argv)
    args.resume = early.resume
    if resumed is not None and args.logdir not in (None, args.resume):
        print(f"podracer {arch.name}: error: --resume continues in its own directory; drop --logdir", file=sys.stderr)
        return 2
    run_dir = args.resume or args.logdir or _default_run_dir(arch.name, args.agent, args.env)
    made_run_dir = not os.path.exists(run_dir)
    try:
        result, rates, stopped_by = _train(arch, parser, argv, args, resumed, run_dir)
    except (ValueError, FileExistsError, FileNotFoundError) as error:
        _discard_if_unused(run_dir, made_run_dir)
        print(f"podracer {arch.name}: error: {error}", file=sys.stderr)
        return 2
    except (CheckpointWriteFailed, NonFiniteLossError, WorkerFailed) as error:
        if isinstance(error, WorkerFailed):
            traceback.print_exception(error.__cause__, file=sys.stderr)
        print(f"podracer {arch.name}: stopped: {error}", file=sys.stderr)
        return WRITE_FAILED_EXIT if isinstance(error, CheckpointWriteFailed) else 1
    except RuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        _discard_if_unused(run_dir, made_run_dir)
        first_line = str(error).strip().splitlines()[0]
        print(
            f"podracer {arch.name}: error: the devices ran out of memory ({first_line}): use smaller batches or "
            "networks",
            file=sys.stderr,
        )
        return 2
    say_goodbye()  # this process ends on purpose: its peers need not stop on its account
    final = result.records[-1] if result.records else {}
    if not args.quiet:
        print(f"run directory: {run_dir}")
    print(
        f"RESULT architecture={arch.name} agent={args.agent} env={args.env} env_steps={result.env_steps} "
        f"episode_return={final.get('episode_return')} {rates} compile_s={result.compile_seconds:.1f}"
        + (f" eval_return={result.evaluation.get('eval_return')}" if result.evaluation else "")
        + (f" stopped_by={stopped_by}" if stopped_by else "")
    )
    return SIGNAL_EXIT_CODES.get(stopped_by, 0)


def run_presets(argv: list[str]) -> int:
    Parser(prog="podracer presets", description="List the ready-made settings.").parse_args(argv)
    for arch in (ANAKIN, SEBULBA):
        for name, preset in sorted(arch.presets.items()):
            default = " (default)" if name == arch.default_preset else ""
            print(f"{arch.name} --preset {name}{default}\n    {preset['about']}")
    return 0


def run_plot(argv: list[str]) -> int:
    parser = Parser(
        prog="podracer plot",
        description="Draw episode return against env steps and against seconds for one or more runs (PNG).",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories holding metrics.jsonl")
    parser.add_argument(
        "--out", default=None, help="output PNG (default: RUN_DIR/returns.png for one run, else returns.png)"
    )
    parser.add_argument("--metric", default="episode_return", help="metric to draw (default: %(default)s)")
    parser.add_argument(
        "--aggregate",
        choices=("none", "mean", "iqm"),
        default="none",
        help="one curve per algorithm and env over its runs and seeds: the mean or the interquartile "
        "mean, with 95%% stratified bootstrap intervals, and the final scores; the numbers go "
        "to a .json beside the PNG (default: %(default)s, a curve per run)",
    )
    args = parser.parse_args(argv)
    from podracer.plot import plot_aggregate, plot_runs

    out = args.out or (f"{args.run_dirs[0].rstrip('/')}/returns.png" if len(args.run_dirs) == 1 else "returns.png")
    try:
        if args.aggregate == "none":
            print(plot_runs(args.run_dirs, out, args.metric))
        else:
            print(plot_aggregate(args.run_dirs, out, args.metric, args.aggregate))
    except (FileNotFoundError, ValueError) as error:
        print(f"podracer plot: error: {error}", file=sys.stderr)
        return 2
    return 0


def run_tune(argv: list[str]) -> int:
    from podracer.cli.tune import run_tune as measure_layouts

    return measure_layouts(argv)


def run_eval(argv: list[str]) -> int:
    from podracer.cli.eval import run_eval as evaluate  # imports JAX after it sets the device count

    return evaluate(argv)


COMMANDS = {
    "anakin": lambda argv: run_architecture(ANAKIN, argv),
    "sebulba": lambda argv: run_architecture(SEBULBA, argv),
    "presets": run_presets,
    "plot": run_plot,
    "eval": run_eval,
    "tune": run_tune,
}
SUMMARY = {
    "anakin": "train with Anakin: everything on the devices (see 'podracer anakin --help')",
    "sebulba": "train with Sebulba: envpool on the host, actor and learner devices (see 'podracer sebulba --help')",
    "presets": "list ready-made settings",
    "plot": "draw learning curves of runs",
    "eval": "evaluate a run's checkpoint and write a video of it playing (see 'podracer eval --help')",
    "tune": "measure a preset's layouts on this host and print the fastest (see 'podracer tune --help')",
}


def main(argv: list[str] | None = None) -> int:
    as_program = argv is None  # the podracer command itself, not a call from Python (tests, notebooks)
    argv = sys.argv[1:] if argv is None else argv
    return ends_quietly_on_a_closed_pipe(lambda: _run_command(argv, as_program))


def _usage(argv: list[str]) -> int:
    """The bare command's usage, or the one-line refusal of an unknown command."""
    if argv and argv[0] not in ("-h", "--help"):
        print(f"podracer: error: unknown command {argv[0]!r}: choose from {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    print(f"{DESCRIPTION}\n\nusage: podracer {{{','.join(COMMANDS)}}} ...\n")
    for name, text in SUMMARY.items():
        print(f"  {name:9s} {text}")
    return 0


def _run_command(argv: list[str], as_program: bool) -> int:
    """Runs the subcommand ``argv[0]`` with the signals handled as the module docstring says."""
    if not argv or argv[0] not in COMMANDS:
        return _usage(argv)
    prefer_synchronous_cpu_dispatch()  # before anything starts JAX's backends
    # A run's driver takes the signals over while it runs; before and after, either one ends the command.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    if as_program:
        route_signals_to_main_thread()  # before JAX starts the threads a signal must not land on
    try:
        return COMMANDS[argv[0]](argv[1:])
    except KeyboardInterrupt as interrupt:  # a signal before a run caught its signals
        name = interrupt.args[0] if interrupt.args else "SIGINT"
        print(f"podracer {argv[0]}: stopped by {name} before the run started", file=sys.stderr)
        return SIGNAL_EXIT_CODES[name]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(arrived(signum))


if __name__ == "__main__":
    sys.exit(main())
