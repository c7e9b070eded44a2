"""The one table of `experiments/device_check.sh`: the headline figures from its log's BENCH lines.

    python experiments/device_summary.py device_check.log [--out device_check.md]

Anakin's CartPole PPO at 4,096 environments (training, and the environment alone with a random policy) and
Sebulba's IMPALA on Breakout-v5 (frames/s = agent steps x the frame-skip of 4), beside Cleanba's IMPALA on one
A100 (about 24K frames/s, as Cleanba's README reports it). A measurement the log lacks is a "-"
row, so a partial run still gives a table.
"""

from __future__ import annotations

import argparse
import json

ANAKIN_ENVS = 4096
BREAKOUT = "Breakout-v5"
CLEANBA_IMPALA_FPS_PER_GPU = 24_000  # Cleanba's IMPALA on one A100, as its README reports


def bench_lines(log_text: str) -> list[dict]:
    """Every ``BENCH {...}`` JSON line of the log."""
    return [json.loads(line[len("BENCH ") :]) for line in log_text.splitlines() if line.startswith("BENCH ")]


def summary(rows: list[dict]) -> list[str]:
    """The markdown table (lines) of the headline measurements among ``rows``."""
    anakin = {r["mode"]: r for r in rows if r.get("mode") in ("train", "env") and r.get("num_envs") == ANAKIN_ENVS}
    impala = [
        r for r in rows if r.get("kind") == "train" and r.get("agent") == "impala" and r.get("env_id") == BREAKOUT
    ]
    backend = next((r["backend"] for r in rows if "backend" in r), "-")
    lines = [
        f"| measurement (backend {backend}) | agent steps/s | frames/s | compile s | reference |",
        "|---|---|---|---|---|",
    ]
    for mode, name in (("train", "training (PPO)"), ("env", "environment only (random policy)")):
        r = anakin.get(mode)
        cells = f"{r['sps']:,.0f} | {r['sps']:,.0f} | {r['compile_s']:.1f}" if r else "- | - | -"
        lines.append(f"| Anakin CartPole, {ANAKIN_ENVS:,} envs, {name} | {cells} | |")
    for r in impala or [None]:
        if r is None:
            lines.append("| Sebulba IMPALA Breakout-v5 | - | - | - | |")
            continue
        lines.append(
            f"| Sebulba IMPALA Breakout-v5, {r['actor_threads']} actor threads x {r['envs_per_thread']} envs, "
            f"learners {r['learner_devices']} | {r['sps']:,.0f} | {r['fps']:,.0f} | {r['compile_s']:.1f} | "
            f"Cleanba's IMPALA: about {CLEANBA_IMPALA_FPS_PER_GPU:,} frames/s on one A100 |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", help="device_check.sh's log")
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args()
    try:
        with open(args.log) as f:
            log_text = f.read()
    except OSError as error:
        parser.error(f"cannot read the log {args.log}: {error.strerror}")
    table = "\n".join(summary(bench_lines(log_text))) + "\n"
    print(table, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
