"""What a recurrent core costs: steps/s of PPO with ``--core none``, ``lstm`` and ``gru`` at the same batch, on
both architectures.

    python experiments/benchmark_recurrent.py            # 3 runs of each, a table and a RECURRENT line
    python experiments/benchmark_recurrent.py --runs 1 --core-size 64

Anakin: the ``cartpole_ppo_wide`` preset (CartPole, 64 envs x 128 steps, 4 epochs x 4 minibatches) for 1M steps.
Sebulba: the ``cartpole_ppo`` preset (envpool CartPole-v1, 16 envs x 64 steps) for 300k steps, one actor and one
learner CPU device. Every run is a fresh ``podracer`` command without evaluation, the kinds alternating; the figure
is its ``RESULT`` line's steps/s (after compiling) and compile seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a file
from experiments import bench_process  # noqa: E402

CORES = ("none", "lstm", "gru")
SETUPS = {
    "anakin": ["anakin", "--preset", "cartpole_ppo_wide", "--total-env-steps", "1000000", "--cpu-devices", "1"],
    "sebulba": ["sebulba", "--preset", "cartpole_ppo", "--total-env-steps", "300000", "--cpu-devices", "2"],
}


def measure(setup: str, core: str, core_size: int, run_dir: str) -> tuple[float, float]:
    """``(steps/s, compile seconds)`` of one run."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # --cpu-devices sets the device count
    command = [sys.executable, "-m", "podracer", *SETUPS[setup], "--core", core, "--core-size", str(core_size)]
    command += ["--eval-episodes", "0", "--logdir", run_dir, "--quiet"]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    found = re.search(r"\bsps=([0-9.]+) .*\bcompile_s=([0-9.]+)", out.stdout)
    if out.returncode or not found:
        raise RuntimeError(f"{' '.join(command)} failed: {out.stderr.strip()[-2000:]}")
    return float(found.group(1)), float(found.group(2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--runs", type=bench_process.positive_int, default=3, help="runs of each architecture and core (default 3)"
    )
    parser.add_argument(
        "--core-size", type=bench_process.positive_int, default=128, help="units of the core (default 128)"
    )
    args = parser.parse_args(argv)
    results = {(setup, core): [] for setup in SETUPS for core in CORES}
    with tempfile.TemporaryDirectory() as scratch:
        for run in range(args.runs):
            for setup in SETUPS:
                for core in CORES:
                    run_dir = os.path.join(scratch, f"{setup}-{core}-{run}")
                    results[setup, core].append(measure(setup, core, args.core_size, run_dir))
                    print(f"{setup} --core {core} run {run}: {results[setup, core][-1][0]:,.0f} steps/s", flush=True)
    print(f"\n| architecture | core | steps/s (median of {args.runs}) | vs none | compile s |")
    print("|---|---|---|---|---|")
    summary = {}
    for (setup, core), runs in results.items():
        sps = statistics.median(r[0] for r in runs)
        summary[f"{setup}_{core}"] = round(sps)
        base = statistics.median(r[0] for r in results[setup, "none"])
        compile_s = statistics.median(r[1] for r in runs)
        print(f"| {setup} | {core} | {sps:,.0f} | {sps / base:.2f}x | {compile_s:.1f} |")
    print("RECURRENT " + json.dumps({"core_size": args.core_size, "runs": args.runs, **summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
