"""MuZero's ablations on Breakout-MinAtar: one change at a time, each a run of the same budget and seed.

    python experiments/muzero_ablation.py                       # every variant, seed 0, 300k steps
    python experiments/muzero_ablation.py --only rr16 rr16-reanalyse --seeds 0 1 2
    python experiments/muzero_ablation.py --report              # the section from the runs already here

Each variant is ``podracer anakin --preset minatar_muzero`` with its flags (see ``VARIANTS``), against the
variant it changes (its ``base``), at ``--steps`` env steps; Anakin runs are bit-reproducible, so one seed shows
a setting's effect on that seed's run (not its spread over seeds: ``--seeds`` for that). Scores: the training
return (the mean of the last 3 log windows, as on the results page), the greedy evaluation at the end, and the
training return at half the budget; beside them what the run logged about its targets (policy-target entropy,
the KL of the stored targets from Reanalyse's fresh ones, the sampled windows' age); what each costs per
gradient step is ``experiments/benchmark_muzero.py --learning``'s.
Finished runs are reused (``--runs``); the section goes into docs/results.md (``--out``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
from typing import NamedTuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a file
from experiments import bench_process  # noqa: E402
from podracer.plot import FINAL_WINDOWS, read_metrics  # noqa: E402


class Variant(NamedTuple):
    name: str
    flags: tuple[str, ...]  # after --preset minatar_muzero
    base: str | None  # the variant it changes ("" for the preset itself)
    change: str  # what differs from its base, in words


# Each variant names every setting the ablations change, so a later preset leaves its runs' meaning alone.
RR16 = ("--replay-ratio", "16", "--value-coef", "0.25")  # the preset's base until 2026-12-08
VARIANTS = (
    Variant("rr4", ("--replay-ratio", "4", "--value-coef", "0.25"), None, "4 sampled windows per new env step"),
    Variant("rr16", RR16, "rr4", "16 windows per env step (4x the gradient steps)"),
    Variant("rr32", (*RR16, "--replay-ratio", "32"), "rr16", "32 windows per env step"),
    Variant("rr16-reanalyse", (*RR16, "--reanalyse-fraction", "1"), "rr16", "Reanalyse every window's policy"),
    Variant("rr16-reanalyse-0.25", (*RR16, "--reanalyse-fraction", "0.25"), "rr16", "Reanalyse a quarter"),
    Variant(
        "rr16-reanalyse-value",
        (*RR16, "--reanalyse-fraction", "1", "--reanalyse-value"),
        "rr16-reanalyse",
        "Reanalyse's values too",
    ),
    Variant("rr16-consistency", (*RR16, "--consistency-coef", "2"), "rr16", "consistency loss, weight 2"),
    Variant("rr16-qfloor", (*RR16, "--q-floor", "0.1"), "rr16", "Q normalisation with a floor of 0.1"),
    Variant(
        "rr16-value1", (*RR16, "--value-coef", "1"), "rr16", "value weight 1 (not 0.25): the preset since 2026-12-08"
    ),
    Variant("rr16-td5", (*RR16, "--td-steps", "5"), "rr16", "n = 5 (not 10)"),
    Variant("rr16-prioritized", (*RR16, "--prioritized"), "rr16", "prioritised replay"),
)
BY_NAME = {v.name: v for v in VARIANTS}


def train(flags: list[str], run_dir: str) -> list[dict]:
    """Runs (or, when it finished before, reuses) one ``podracer anakin`` command; returns its records."""
    done = os.path.join(run_dir, "done")
    if not os.path.exists(done):
        command = [sys.executable, "-m", "podracer", "anakin", *flags, "--quiet"]
        command += ["--logdir", run_dir, "--resume-or-start"]
        out = subprocess.run(command, capture_output=True, text=True, timeout=4 * 3600)
        if out.returncode:
            raise RuntimeError(f"{' '.join(command)} failed: {out.stderr.strip()[-2000:]}")
        open(done, "w").close()
    return read_metrics(run_dir)


class Score(NamedTuple):
    final: float  # training return, mean of the last log windows
    half: float  # training return at half the budget (the same windowing)
    evaluation: float  # the greedy evaluation at the end (nan without one)
    entropy: float  # policy targets' entropy, last windows
    kl: float  # Reanalyse: KL(stored || fresh), last windows (nan without Reanalyse)
    age: float  # sampled windows' age in steps per env, last windows


def score(records: list[dict], steps: int) -> Score:
    trained = [r for r in records if r.get("episode_return") is not None]

    def last(key: str, until: int = steps) -> float:
        values = [r[key] for r in trained if r["env_steps"] <= until and key in r]
        return float(np.mean(values[-FINAL_WINDOWS:])) if values else float("nan")

    evals = [r["eval_return"] for r in records if "eval_return" in r]
    return Score(
        last("episode_return"),
        last("episode_return", steps // 2),
        evals[-1] if evals else float("nan"),
        last("policy_target_entropy"),
        last("reanalyse_kl"),
        last("sample_age"),
    )


def _own_flags(variant: Variant) -> tuple[str, ...]:
    """The flags a variant adds to the base of the rr16 family (all of them for the family's base)."""
    on_rr16 = variant.flags[: len(RR16)] == RR16 and len(variant.flags) > len(RR16)
    return variant.flags[len(RR16) :] if on_rr16 else variant.flags


def _stopped_row(variant: Variant, reached: int, args: argparse.Namespace, game: str) -> str:
    """The table row of a variant whose first seed's run stopped at ``reached`` env steps."""

    def at(name: str) -> Score:
        return score(read_metrics(os.path.join(args.runs, f"{game.lower()}-{name}-seed{args.seeds[0]}")), reached)

    got = at(variant.name)
    effect = f"{got.final - at(variant.base).final:+.1f} at {reached // 1000}k" if variant.base else "-"
    return (
        f"| {variant.name} | `{' '.join(_own_flags(variant))}` | {variant.base or '-'} | {variant.change} | "
        f"{_number(got.final)} (stopped at {reached // 1000}k, seed {args.seeds[0]}) | - | - | {effect} | "
        f"{_number(got.entropy, 2)} | {_number(got.kl, 3)} | {_number(got.age, 0)} |"
    )


def _number(x: float, digits: int = 1) -> str:
    return "-" if np.isnan(x) else f"{x:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(BY_NAME), help="variants to run (default: all)")
    parser.add_argument("--env", default="gymnax:Breakout-MinAtar")
    parser.add_argument("--steps", type=bench_process.positive_int, default=300_000, help="env steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--runs", default="runs/muzero_ablation", help="where the runs are kept (reused)")
    parser.add_argument(
        "--jobs", type=bench_process.positive_int, default=2, help="runs at a time (2 on 2 cores: 1.24x one)"
    )
    parser.add_argument("--out", default="docs/results.md", help="markdown file for the section ('' for none)")
    parser.add_argument(
        "--report", action="store_true", help="train nothing: the section from the runs already in --runs"
    )
    args = parser.parse_args(argv)
    chosen = [] if args.report else [BY_NAME[name] for name in args.only] if args.only else list(VARIANTS)
    game = args.env.split(":")[-1]
    scores: dict[str, list[Score]] = {}

    def one(variant: Variant, seed: int) -> Score:
        flags = ["--preset", "minatar_muzero", "--env", args.env, "--total-env-steps", str(args.steps)]
        flags += ["--eval-every", str(args.steps), "--seed", str(seed), *variant.flags]
        got = score(train(flags, os.path.join(args.runs, f"{game.lower()}-{variant.name}-seed{seed}")), args.steps)
        print(f"{variant.name} seed {seed}: {got}", flush=True)
        return got

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        runs = {(v.name, seed): pool.submit(one, v, seed) for v in chosen for seed in args.seeds}
        for (name, _), future in runs.items():
            scores.setdefault(name, []).append(future.result())
    # the section shows every variant with finished runs of this budget, also those run by an earlier call, and
    # runs stopped before the budget where they stopped
    stopped: dict[str, int] = {}  # variant: the env steps its (first seed's) run reached
    for variant in VARIANTS:
        if variant.name not in scores:
            runs = [os.path.join(args.runs, f"{game.lower()}-{variant.name}-seed{s}") for s in args.seeds]
            if all(os.path.exists(os.path.join(r, "done")) for r in runs):
                scores[variant.name] = [score(read_metrics(r), args.steps) for r in runs]
            elif os.path.exists(os.path.join(runs[0], "metrics.jsonl")) and read_metrics(runs[0]):
                stopped[variant.name] = read_metrics(runs[0])[-1]["env_steps"]

    def mean(name: str, field: str) -> float:
        return float(np.mean([getattr(s, field) for s in scores[name]]))

    lines = [
        f"# MuZero ablations on {game}",
        "",
        f"`python experiments/muzero_ablation.py` (its docstring says what it runs): `podracer anakin --preset "
        f"minatar_muzero --env {args.env} --total-env-steps {args.steps}` with each variant's flags, seed(s) "
        f"{', '.join(map(str, args.seeds))}; each row changes one thing from the row it names. Training return: "
        f"the mean of the last {FINAL_WINDOWS} log windows (at the end, and at half the budget); evaluation: "
        "the greedy policy at the end (8 episodes). Entropy: the policy targets' (ln 3 = 1.10 is uniform); KL: "
        "of the stored targets from Reanalyse's fresh ones; age: the sampled windows' age in env steps per env. "
        "A run stopped before the budget (to free the cores) shows its training return where it stopped, its "
        "effect against its base's at the same step. What each setting costs per gradient step is in "
        "[benchmarks](benchmarks.md#muzero-learning-per-env-step).",
        "",
        "| variant | flags | changes from | what changes | training return | at half | evaluation | effect on "
        "the training return | target entropy | KL stored/fresh | window age |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        if variant.name in stopped:
            lines.append(_stopped_row(variant, stopped[variant.name], args, game))
        if variant.name not in scores:
            continue
        final = mean(variant.name, "final")
        effect = "-"
        if variant.base in scores:
            effect = f"{final - mean(variant.base, 'final'):+.1f}"
        lines.append(
            f"| {variant.name} | `{' '.join(_own_flags(variant))}` | {variant.base or '-'} | {variant.change} | "
            f"{_number(final)} | {_number(mean(variant.name, 'half'))} | {_number(mean(variant.name, 'evaluation'))} "
            f"| {effect} | {_number(mean(variant.name, 'entropy'), 2)} | {_number(mean(variant.name, 'kl'), 3)} | "
            f"{_number(mean(variant.name, 'age'), 0)} |"
        )
    bench_process.report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
