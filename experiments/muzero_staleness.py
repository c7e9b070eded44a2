"""How stale MuZero's stored policy targets are: KL(stored target || a fresh search) against the target's age.

    python experiments/muzero_staleness.py RUN_DIR [RUN_DIR ...]   # Anakin MuZero runs, at their newest checkpoint

For each run, ``--samples`` stored steps are drawn uniformly from the first seed's replay (as training samples
them); each step's stored target (the search's action weights when it acted) is compared with a fresh search
from the same observation with the run's target parameters now, as Reanalyse would run it. Rows bin the steps by
age (env steps per env since they were stored, and the gradient steps taken since). The section goes into
docs/results.md (``--out``).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a file
from experiments import bench_process  # noqa: E402


def _entropy(p: np.ndarray) -> np.ndarray:
    return -np.sum(p * np.log(p + 1e-12), axis=-1)


def _kl(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return np.sum(p * (np.log(p + 1e-12) - np.log(q + 1e-12)), axis=-1)


def staleness(run_dir: str, samples: int, bins: int, seed: int = 0) -> list[dict]:
    """Rows ``{age_low, age_high, gradient_steps, kl, noise, stored_entropy, fresh_entropy, agree, count}`` of one
    run; ``noise``: the KL between two fresh searches with other keys (the search's own noise, the floor for
    ``kl``)."""
    import jax

    from podracer.agents.replay import replay_sample
    from podracer.anakin.load import load_run

    run = load_run(run_dir)
    learner = jax.tree.map(lambda x: x[0, 0, 0], run.state.learner)  # first device, seed and lane
    replay = learner.replay
    capacity = replay.action.shape[0]
    sample = replay_sample(replay, jax.random.key(seed), samples, 1)
    obs = jax.tree.map(lambda x: x[:, 0], sample.obs)
    search = jax.jit(lambda params, obs, key: run.agent.search(params, obs, key).action_weights)
    fresh = np.asarray(search(learner.target_params, obs, jax.random.key(seed + 1)))
    again = np.asarray(search(learner.target_params, obs, jax.random.key(seed + 2)))  # the search's own noise
    stored = np.asarray(sample.extras["search_policy"][:, 0])
    age = int(replay.position) - np.asarray(sample.start)
    kl, noise = _kl(stored, fresh), _kl(again, fresh)
    agent, config = run.agent_config, run.config
    per_env_step = agent.replay_ratio * config.num_envs / agent.batch_size  # gradient steps per env step per env
    edges = np.linspace(0, capacity, bins + 1)
    rows = []
    for low, high in zip(edges[:-1], edges[1:]):
        inside = (age >= low) & (age < high)
        if not inside.any():
            continue
        rows.append(
            {
                "age_low": int(low),
                "age_high": int(high),
                "gradient_steps": float(np.mean(age[inside]) * per_env_step),
                "kl": float(np.mean(kl[inside])),
                "noise": float(np.mean(noise[inside])),
                "stored_entropy": float(np.mean(_entropy(stored[inside]))),
                "fresh_entropy": float(np.mean(_entropy(fresh[inside]))),
                "agree": float(np.mean(stored[inside].argmax(-1) == fresh[inside].argmax(-1))),
                "count": int(inside.sum()),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="Anakin MuZero run directories")
    parser.add_argument("--samples", type=bench_process.positive_int, default=8192)
    parser.add_argument("--bins", type=bench_process.positive_int, default=8)
    parser.add_argument("--out", default="docs/results.md", help="markdown file for the section ('' for none)")
    args = parser.parse_args(argv)
    lines = [
        "# MuZero: how stale the stored policy targets are",
        "",
        f"`python experiments/muzero_staleness.py RUN_DIR` (its docstring says what it measures), {args.samples:,} "
        "stored steps per run, drawn uniformly from its replay at the run's last checkpoint, each searched afresh "
        "with the run's target parameters. Age: env steps per env since the step was stored (and the gradient "
        "steps taken since, on average); KL: of the stored target from the fresh one, beside the KL between two fresh "
        "searches with other random keys (the search's own noise: what no Reanalyse removes); entropy in nats (ln 3 = "
        "1.10 is uniform over Breakout's 3 actions); agree: how often both weigh the same action most.",
        "",
    ]
    for run_dir in args.runs:
        lines += [
            f"`{os.path.basename(os.path.normpath(run_dir))}`:",
            "",
            "| age (env steps) | gradient steps since | KL(stored, fresh) | KL(fresh, fresh) | stored entropy | "
            "fresh entropy | agree |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in staleness(run_dir, args.samples, args.bins):
            lines.append(
                f"| {row['age_low']}-{row['age_high']} | {row['gradient_steps']:,.0f} | {row['kl']:.3f} | {row['noise']:.3f} | "
                f"{row['stored_entropy']:.2f} | {row['fresh_entropy']:.2f} | {row['agree']:.2f} |"
            )
        lines.append("")
    bench_process.report(lines[:-1], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
