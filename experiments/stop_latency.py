"""How long a run takes to stop after SIGTERM (a TPU VM's preemption notice gives about 30 s).

    python experiments/stop_latency.py            # prints a table and a STOP line per case

Each case starts a ``podracer`` command in a fresh process with a run directory of its own, sends SIGTERM a delay
after that directory appears (during start-up: building the environments and compiling; or during training), and
times the exit. The
exit code must be 143 and the run resumable (a checkpoint is written before it exits).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

CASES = (  # (name, seconds from the run directory's appearance to SIGTERM, podracer arguments)
    ("anakin, compiling", 1.0, ["anakin"]),
    ("anakin, training", 10.0, ["anakin", "--total-env-steps", "5000000"]),
    ("sebulba, starting", 1.0, ["sebulba"]),
    ("sebulba, training", 12.0, ["sebulba", "--total-env-steps", "3000000"]),
)


def stop_seconds(delay: float, args: list[str], run_dir: str) -> tuple[int, float, str]:
    """``(exit code, seconds from SIGTERM to exit, the run's last line)`` for ``podracer ARGS``."""
    command = [sys.executable, "-m", "podracer", *args, "--logdir", run_dir]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not os.path.isdir(run_dir) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the run directory appears once the command has read its flags and caught the signals
    time.sleep(delay)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    lines = err.strip().splitlines()
    return proc.returncode, time.monotonic() - sent, lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="run only the cases whose name contains this")
    args = parser.parse_args(argv)
    print("| case | SIGTERM after | exit code | seconds to exit |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for i, (name, delay, podracer_args) in enumerate(CASES):
            if args.only and args.only not in name:
                continue
            code, seconds, last = stop_seconds(delay, podracer_args, os.path.join(scratch, f"run{i}"))
            print(f"| {name} | {delay:.1f} s | {code} | {seconds:.1f} |")
            print(f"STOP case={name.replace(' ', '').replace(',', '-')} exit={code} seconds={seconds:.2f}", flush=True)
            if code not in (0, 143):
                print(f"  unexpected exit; its last line: {last}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
