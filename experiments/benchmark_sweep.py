"""A 12-member ``--sweep`` in one program against the same 12 settings run one by one.

    python experiments/benchmark_sweep.py                     # cartpole_ppo, 500k steps per member
    python experiments/benchmark_sweep.py --preset cartpole_ppo_wide --steps 1000000 --figure ''

The grid is ``learning_rate=1e-4,3e-4,1e-3 entropy_coef=0,0.01 clip_eps=0.1,0.2`` on one CPU device, seed 0. The
sweep is one ``podracer anakin --sweep ...`` command; the separate runs are 12 commands, one per member, at the
same seed, each a fresh process. Per side: compile seconds (summed over its commands), training seconds, steps/s
per member (env steps of one member over the side's training seconds) and the wall time of its commands. Each
member's final return (mean of its last 3 log windows) is printed beside its separate run's: they should agree
(the same seed and settings; the floats differ a little, the settings being traced values in the sweep). With
``--figure PATH`` (default docs/results/sweep-cartpole.png) the sweep's members are drawn with ``podracer plot
--aggregate mean``, one curve each.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a file
from experiments import bench_process  # noqa: E402
from podracer.plot import FINAL_WINDOWS, plot_aggregate, read_metrics  # noqa: E402

GRID = {"learning_rate": ("1e-4", "3e-4", "1e-3"), "entropy_coef": ("0", "0.01"), "clip_eps": ("0.1", "0.2")}


def run(flags: list[str], run_dir: str) -> dict:
    """One ``podracer anakin`` command: its RESULT line's steps/s and compile seconds, and its wall time."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # --cpu-devices sets the device count
    command = [sys.executable, "-m", "podracer", "anakin", *flags, "--cpu-devices", "1", "--eval-episodes", "0"]
    command += ["--logdir", run_dir, "--quiet"]
    start = time.perf_counter()
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    found = re.search(r"\benv_steps=(\d+) .*\bsps=([0-9.]+) .*\bcompile_s=([0-9.]+)", out.stdout)
    if out.returncode or not found:
        raise RuntimeError(f"{' '.join(command)} failed: {out.stderr.strip()[-2000:]}")
    steps, sps, compile_s = int(found.group(1)), float(found.group(2)), float(found.group(3))
    return {"steps": steps, "sps": sps, "compile_s": compile_s, "wall_s": wall}


def final_returns(run_dir: str) -> list[float]:
    """Each agent's final return in ``run_dir``: the mean of its last log windows."""
    records = [r for r in read_metrics(run_dir) if r.get("episode_return") is not None]
    per_agent = [r.get("episode_return_per_seed", [r["episode_return"]]) for r in records[-FINAL_WINDOWS:]]
    return [sum(column) / len(column) for column in zip(*per_agent)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cartpole_ppo", help="Anakin preset (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=500_000, help="env steps per member (default: %(default)s)")
    parser.add_argument("--figure", default="docs/results/sweep-cartpole.png", help="the members' curves ('' for none)")
    parser.add_argument("--out", default="docs/benchmarks.md", help="markdown file for the section ('' for none)")
    args = parser.parse_args(argv)
    shown = " ".join(sys.argv[1:] if argv is None else argv)
    base = ["--preset", args.preset, "--total-env-steps", str(args.steps), "--seed", "0"]
    members = [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]
    words = [f"{name}={','.join(values)}" for name, values in GRID.items()]
    with tempfile.TemporaryDirectory() as scratch:
        sweep_dir = os.path.join(scratch, "sweep")
        swept = run([*base, "--sweep", *words], sweep_dir)
        print(f"sweep of {len(members)}: {swept['sps']:,.0f} steps/s over all members", flush=True)
        alone, alone_returns = [], []
        for i, member in enumerate(members):
            run_dir = os.path.join(scratch, f"member{i}")
            flags = [f for name, value in member.items() for f in (f"--{name.replace('_', '-')}", value)]
            alone.append(run([*base, *flags], run_dir))
            alone_returns.append(final_returns(run_dir)[0])
            print(f"member {i} alone: {alone[-1]['sps']:,.0f} steps/s", flush=True)
        swept_returns = final_returns(sweep_dir)
        if args.figure:
            plot_aggregate([sweep_dir], args.figure, estimator="mean")
            print(f"figure: {args.figure}")
    steps = swept["steps"]
    train_swept = steps * len(members) / swept["sps"]
    train_alone = sum(steps / r["sps"] for r in alone)
    rows = [
        ("one program (--sweep)", 1, swept["compile_s"], train_swept, steps / train_swept, swept["wall_s"]),
        (
            f"{len(members)} runs one by one",
            len(members),
            sum(r["compile_s"] for r in alone),
            train_alone,
            steps / train_alone,
            sum(r["wall_s"] for r in alone),
        ),
    ]
    lines = [
        "# Hyperparameter sweeps",
        "",
        f"`python experiments/benchmark_sweep.py{' ' + shown if shown else ''}` on {platform.processor() or 'this CPU'} "
        f"({os.cpu_count()} cores): {len(members)} members x {steps:,} env steps, `--preset {args.preset}`, 1 CPU "
        "device, seed 0; the grid `" + " ".join(words) + "`. Training seconds exclude compilation; the wall time is "
        "every command's, start to exit.",
        "",
        "| how | compiles | compile s | training s | steps/s, all members | per member | wall s (commands) |",
        "|---|---|---|---|---|---|---|",
    ]
    for how, compiles, compile_s, train_s, per_member, wall in rows:
        total = per_member * len(members)
        lines.append(
            f"| {how} | {compiles} | {compile_s:.1f} | {train_s:.1f} | {total:,.0f} | {per_member:,.0f} | {wall:.1f} |"
        )
    lines += ["", "Each member's final return (mean of its last 3 log windows), in the sweep and run alone:", ""]
    lines += ["| member | in the sweep | alone |", "|---|---|---|"]
    for member, in_sweep, by_itself in zip(members, swept_returns, alone_returns):
        settings = " ".join(f"{k}={v}" for k, v in member.items())
        lines.append(f"| {settings} | {in_sweep:.1f} | {by_itself:.1f} |")
    if args.figure:
        lines += ["", f"![each member's curve]({os.path.relpath(args.figure, os.path.dirname(args.out) or '.')})"]
    bench_process.report(lines, args.out)
    summary = {
        "preset": args.preset,
        "members": len(members),
        "steps": steps,
        "sweep_sps_per_member": round(steps / train_swept),
        "alone_sps_per_member": round(steps / train_alone),
        "sweep_wall_s": round(swept["wall_s"], 1),
        "alone_wall_s": round(sum(r["wall_s"] for r in alone), 1),
    }
    print("SWEEP " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
