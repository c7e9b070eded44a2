"""The ``podracer`` command: ``anakin`` runs, ``presets``, ``plot``.

Agent flags depend on the agent, so ``podracer anakin --agent impala --help``
lists IMPALA's; a ``--preset`` fills in defaults that explicit flags override.
"""

from __future__ import annotations

import argparse
import re
import sys
import time

from agents import AGENTS
from anakin.config import AnakinConfig
from experiments.presets import ANAKIN_PRESETS, DEFAULT_ANAKIN_PRESET
from podracer.config import add_flags, from_flags

DESCRIPTION = "podracer: the Podracer architectures (Anakin, Sebulba) for scalable RL in JAX."


def _default_run_dir(architecture: str, agent: str, env: str) -> str:
    env_name = re.sub(r"[^A-Za-z0-9_.-]+", "_", env)
    return f"runs/{architecture}-{agent}-{env_name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _preset_and_agent(argv: list[str]) -> tuple[str, str | None]:
    """Reads ``--preset`` and ``--agent`` first: they decide which flags exist."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--preset", choices=sorted(ANAKIN_PRESETS), default=DEFAULT_ANAKIN_PRESET)
    early.add_argument("--agent", choices=sorted(AGENTS))
    known, _ = early.parse_known_args(argv)
    return known.preset, known.agent


def anakin_parser(preset_name: str, agent_name: str | None) -> argparse.ArgumentParser:
    preset = ANAKIN_PRESETS[preset_name]
    agent_name = agent_name or preset["agent"]
    parser = argparse.ArgumentParser(
        prog="podracer anakin",
        description="Train an agent with Anakin: environments, acting and learning together on every device.",
        epilog="Batch sizes are global: --num-envs is split over devices x lanes and checked before compiling. "
        "Run 'podracer presets' for the presets.",
    )
    parser.add_argument("--preset", choices=sorted(ANAKIN_PRESETS), default=preset_name,
                        help=f"settings to start from (default: {DEFAULT_ANAKIN_PRESET})")
    parser.add_argument("--agent", choices=sorted(AGENTS), default=agent_name,
                        help="learning algorithm; its flags are listed below (default: %(default)s)")
    parser.add_argument("--env", default=preset["env"],
                        help="catch, cartpole or gymnax:<id>, e.g. gymnax:Breakout-MinAtar (default: %(default)s)")
    parser.add_argument("--logdir", default=None,
                        help="run directory for config.json, metrics.jsonl and TensorBoard events "
                        "(default: runs/anakin-<agent>-<env>-<time>)")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.add_argument("--cpu-devices", type=int, default=0, metavar="N",
                        help="split the host CPU into N devices, to try multi-device runs without accelerators")
    add_flags(parser.add_argument_group("Anakin"), AnakinConfig, preset["anakin"])
    agent_defaults = preset["agent_config"] if agent_name == preset["agent"] else {}
    add_flags(parser.add_argument_group(f"{agent_name} agent"), AGENTS[agent_name][0], agent_defaults)
    return parser


def run_anakin(argv: list[str]) -> int:
    preset, agent = _preset_and_agent(argv)
    args = anakin_parser(preset, agent).parse_args(argv)
    import jax

    if args.cpu_devices:
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    from anakin.run import NonFiniteLossError, train

    try:
        anakin_config = from_flags(AnakinConfig, args)
        agent_config = from_flags(AGENTS[args.agent][0], args)
        run_dir = args.logdir or _default_run_dir("anakin", args.agent, args.env)
        result = train(args.agent, agent_config, args.env, anakin_config, run_dir, quiet=args.quiet)
    except (ValueError, FileExistsError) as error:
        print(f"podracer anakin: error: {error}", file=sys.stderr)
        return 2
    except NonFiniteLossError as error:
        print(f"podracer anakin: stopped: {error}", file=sys.stderr)
        return 1
    final = result.records[-1] if result.records else {}
    if not args.quiet:
        print(f"run directory: {run_dir}")
    print(
        f"RESULT architecture=anakin agent={args.agent} env={args.env} env_steps={result.env_steps} "
        f"episode_return={final.get('episode_return')} sps={result.env_steps * anakin_config.num_seeds / result.train_seconds:.0f} "
        f"compile_s={result.compile_seconds:.1f}"
    )
    return 0


def run_presets(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="podracer presets", description="List the ready-made settings.").parse_args(argv)
    for name, preset in sorted(ANAKIN_PRESETS.items()):
        default = " (default)" if name == DEFAULT_ANAKIN_PRESET else ""
        print(f"anakin --preset {name}{default}\n    {preset['about']}")
    return 0


def run_plot(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="podracer plot",
        description="Draw episode return against env steps and against seconds for one or more runs (PNG).",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories holding metrics.jsonl")
    parser.add_argument("--out", default=None, help="output PNG (default: RUN_DIR/returns.png for one run, else returns.png)")
    parser.add_argument("--metric", default="episode_return", help="metric to draw (default: %(default)s)")
    args = parser.parse_args(argv)
    from podracer.plot import plot_runs

    out = args.out or (f"{args.run_dirs[0].rstrip('/')}/returns.png" if len(args.run_dirs) == 1 else "returns.png")
    try:
        print(plot_runs(args.run_dirs, out, args.metric))
    except (FileNotFoundError, ValueError) as error:
        print(f"podracer plot: error: {error}", file=sys.stderr)
        return 2
    return 0


COMMANDS = {"anakin": run_anakin, "presets": run_presets, "plot": run_plot}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(f"{DESCRIPTION}\n\nusage: podracer {{{','.join(COMMANDS)}}} ...\n")
        print("  anakin    train with Anakin (see 'podracer anakin --help')")
        print("  presets   list ready-made settings")
        print("  plot      draw learning curves of runs")
        known = not argv or argv[0] in ("-h", "--help")
        if not known:
            print(f"\npodracer: error: unknown command {argv[0]!r}", file=sys.stderr)
        return 0 if known else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
