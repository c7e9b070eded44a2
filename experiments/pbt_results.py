"""Population-based training against the same population with its settings fixed, at equal env steps.

    python experiments/pbt_results.py                 # CartPole, learning rates 1e-5..8e-5, 3 seeds
    python experiments/pbt_results.py --preset minatar_ppo --env gymnax:Breakout-MinAtar --steps 2000000 \\
        --interval 100000 --name breakout-minatar

A population whose learning rates are all too low (PPO's CartPole preset takes 2.5e-4 and anneals it to 0): 4
learning rates x 2 seeds = 8 agents, trained twice from the same seed, as a plain ``--sweep`` (each agent keeps
its learning rate) and with ``--pbt-interval`` (the bottom quarter copies one of the top quarter every interval
and multiplies or divides its learning rate by 1.25). The whole experiment is repeated for ``--seeds`` seeds (the
runs' ``--seed``). Scores are final returns: the mean of an agent's last 3 log windows of training episodes.
Fixed: the best member (the mean of its 2 seeds). PBT: the population's mean, and its best agent. The section
goes into docs/results.md (``--out``), its figure into docs/results/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a file
from experiments import bench_process  # noqa: E402
from podracer.plot import FINAL_WINDOWS, read_metrics  # noqa: E402


def train(flags: list[str], run_dir: str) -> list[dict]:
    """Runs (or, when it finished before, reuses) one ``podracer anakin`` command; returns its records."""
    done = os.path.join(run_dir, "done")
    if not os.path.exists(done):
        command = [sys.executable, "-m", "podracer", "anakin", *flags, "--eval-episodes", "0", "--quiet"]
        command += ["--logdir", run_dir, "--resume-or-start"]
        out = subprocess.run(command, capture_output=True, text=True, timeout=7200)
        if out.returncode:
            raise RuntimeError(f"{' '.join(command)} failed: {out.stderr.strip()[-2000:]}")
        open(done, "w").close()
    return [r for r in read_metrics(run_dir) if r.get("episode_return_per_seed") is not None]


def finals(records: list[dict]) -> np.ndarray:
    """``[agents]`` final returns: the mean of the last log windows."""
    return np.mean([r["episode_return_per_seed"] for r in records[-FINAL_WINDOWS:]], axis=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cartpole_ppo")
    parser.add_argument("--env", default="cartpole")
    parser.add_argument("--name", default="cartpole", help="names the runs and the figure")
    parser.add_argument("--learning-rates", default="1e-5,2e-5,4e-5,8e-5")
    parser.add_argument("--num-seeds", type=bench_process.positive_int, default=2, help="seeds per learning rate")
    parser.add_argument("--steps", type=bench_process.positive_int, default=500_000, help="env steps per agent")
    parser.add_argument("--interval", type=bench_process.positive_int, default=50_000, help="--pbt-interval")
    parser.add_argument("--seeds", type=bench_process.positive_int, default=3, help="repeats of the experiment")
    parser.add_argument("--runs", default="runs/pbt", help="where the runs are kept (a rerun reuses finished ones)")
    parser.add_argument("--out", default="docs/results.md", help="markdown file for the section ('' for none)")
    args = parser.parse_args(argv)
    shown = " ".join(sys.argv[1:] if argv is None else argv)
    rates = args.learning_rates.split(",")
    base = ["--preset", args.preset, "--env", args.env, "--total-env-steps", str(args.steps)]
    base += ["--sweep", f"learning_rate={args.learning_rates}", "--num-seeds", str(args.num_seeds)]
    rows, curves = [], {"fixed": [], "pbt": []}
    for seed in range(args.seeds):
        flags = [*base, "--seed", str(seed)]
        fixed = train(flags, os.path.join(args.runs, f"{args.name}-fixed-seed{seed}"))
        pbt = train(
            [*flags, "--pbt-interval", str(args.interval)], os.path.join(args.runs, f"{args.name}-pbt-seed{seed}")
        )
        by_member = finals(fixed).reshape(len(rates), args.num_seeds).mean(axis=1)
        best = int(np.argmax(by_member))
        pbt_finals = finals(pbt)
        rows.append((seed, rates[best], by_member[best], pbt_finals.mean(), pbt_finals.max()))
        agents = slice(best * args.num_seeds, (best + 1) * args.num_seeds)  # the best member's seeds
        fixed_curve = [np.mean(r["episode_return_per_seed"][agents]) for r in fixed]
        curves["fixed"].append(([r["env_steps"] for r in fixed], fixed_curve))
        curves["pbt"].append(([r["env_steps"] for r in pbt], [np.mean(r["episode_return_per_seed"]) for r in pbt]))
        lrs = pbt[-1]["hyperparameters"]["learning_rate"]
        print(
            f"seed {seed}: fixed best {rates[best]} {by_member[best]:.1f}; pbt mean {pbt_finals.mean():.1f}, "
            f"best {pbt_finals.max():.1f}; final learning rates {', '.join(f'{v:.2g}' for v in lrs)}",
            flush=True,
        )
    figure = os.path.join("docs", "results", f"pbt-{args.name}.png")
    _plot(curves, figure, args.name)
    wins = sum(pbt_mean > fixed_best for _, _, fixed_best, pbt_mean, _ in rows)
    lines = [
        f"# Population-based training on {args.name}",
        "",
        f"`python experiments/pbt_results.py{' ' + shown if shown else ''}` (the script's docstring says what "
        "it compares). Final returns (mean of the last 3 log windows of training episodes), at "
        f"{args.steps:,} env steps per agent; population: `--preset {args.preset} --env {args.env} --sweep "
        f"learning_rate={args.learning_rates} --num-seeds {args.num_seeds}`, PBT with `--pbt-interval {args.interval}`.",
        "",
        "| seed | fixed: best member | its return | PBT: population mean | PBT: best agent |",
        "|---|---|---|---|---|",
        *(f"| {s} | lr {lr} | {fb:.1f} | {pm:.1f} | {pb:.1f} |" for s, lr, fb, pm, pb in rows),
        "",
        f"PBT's population mean beats the best fixed member on {wins} of {len(rows)} seeds "
        f"(means over seeds: {statistics.mean(r[3] for r in rows):.1f} against {statistics.mean(r[2] for r in rows):.1f}).",
        "",
        f"![PBT against the best fixed member]({os.path.relpath(figure, 'docs')})",
    ]
    bench_process.report(lines, args.out)
    return 0


def _plot(curves: dict, out: str, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(6, 4), constrained_layout=True)
    for label, color in (("fixed", "tab:blue"), ("pbt", "tab:orange")):
        for i, (steps, values) in enumerate(curves[label]):
            text = "best fixed member" if label == "fixed" else "PBT population mean"
            axis.plot(steps, values, color=color, alpha=0.8, label=text if i == 0 else None)
    axis.set_xlabel("environment steps per agent")
    axis.set_ylabel("training return")
    axis.set_title(f"PBT on {name}, one line per seed")
    axis.grid(alpha=0.3)
    axis.legend()
    os.makedirs(os.path.dirname(out), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
