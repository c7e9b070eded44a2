"""Anakin's throughput as one process and as two processes on this host (gloo collectives between them).

    python experiments/multiprocess.py             # catch_ppo, 3 runs of each layout, a table and a MULTIPROCESS line
    python experiments/multiprocess.py --preset minatar_ppo --steps 2000000

Layouts: one process with one CPU device, one process with two CPU devices (collectives inside the process), and two
processes with one CPU device each, started by hand on 127.0.0.1 (collectives through gloo over TCP). Every run is a
fresh ``podracer anakin`` command without evaluation; the figure is its ``RESULT`` line's steps/s (after compiling).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile

from podracer.cli.presets import ANAKIN_PRESETS

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a file
from experiments import bench_process  # noqa: E402

LAYOUTS = (("1 process x 1 device", 1, 1), ("1 process x 2 devices", 1, 2), ("2 processes x 1 device", 2, 1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def steps_per_second(processes: int, devices_each: int, podracer_args: list[str], run_dir: str) -> float:
    """Steps/s of process 0's ``RESULT`` line for one run of ``podracer anakin ARGS`` in the given layout."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # --cpu-devices sets the device count
    command = [sys.executable, "-m", "podracer", "anakin", *podracer_args, "--eval-episodes", "0"]
    command += ["--cpu-devices", str(devices_each), "--logdir", run_dir, "--quiet"]
    if processes > 1:
        command += ["--coordinator", f"127.0.0.1:{_free_port()}", "--num-processes", str(processes)]
    procs = [
        subprocess.Popen(
            command + (["--process-id", str(i)] if processes > 1 else []),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    outputs = [proc.communicate(timeout=1800) for proc in procs]
    out, err = outputs[0]
    found = re.search(r"\bsps=([0-9.]+)", out)
    if any(proc.returncode for proc in procs) or not found:
        raise RuntimeError(f"{' '.join(command)} failed: {err.strip()[-2000:]}")
    return float(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--preset", default="catch_ppo", choices=sorted(ANAKIN_PRESETS), help="an Anakin preset (default catch_ppo)"
    )
    parser.add_argument(
        "--steps", type=bench_process.positive_int, default=1_000_000, help="env steps per run (default 1,000,000)"
    )
    parser.add_argument(
        "--runs", type=bench_process.positive_int, default=3, help="runs of each layout, alternating (default 3)"
    )
    args = parser.parse_args(argv)
    podracer_args = ["--preset", args.preset, "--total-env-steps", str(args.steps)]
    measured: dict[str, list[float]] = {name: [] for name, _, _ in LAYOUTS}
    with tempfile.TemporaryDirectory() as scratch:
        for run in range(args.runs):
            for name, processes, devices_each in LAYOUTS:
                run_dir = os.path.join(scratch, f"{processes}x{devices_each}-{run}")
                try:
                    measured[name].append(steps_per_second(processes, devices_each, podracer_args, run_dir))
                except RuntimeError as error:
                    print(f"multiprocess.py: {error}", file=sys.stderr)
                    return 1
                print(f"  {name}, run {run + 1}: {measured[name][-1]:,.0f} steps/s", file=sys.stderr, flush=True)
    print(f"| {args.preset}, {args.steps:,} steps | steps/s (median of {args.runs}) | runs |\n|---|---|---|")
    for name, values in measured.items():
        print(f"| {name} | {statistics.median(values):,.0f} | {', '.join(f'{v:,.0f}' for v in values)} |")
    summary = {name: round(statistics.median(values)) for name, values in measured.items()}
    print("MULTIPROCESS " + json.dumps({"preset": args.preset, "steps": args.steps, **summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
