"""Trains PureJaxRL's PPO on a gymnax environment for the results page and prints one ``PEER {...}`` JSON line.

``experiments/results.py --purejaxrl DIR`` runs this file with a Python that has
PureJaxRL's dependencies (gymnax<1.0, the API PureJaxRL is written against) and
``DIR/purejaxrl`` on ``PYTHONPATH``. The settings are PureJaxRL's MinAtar ones
(``examples/brax_minatar.ipynb``): 64 envs x 128 steps, 4 epochs x 8
minibatches, learning rate 5e-3 annealed, a 64-64 ReLU MLP. The seeds run one
after another through one compiled program, as podracer's suite runs them.
PureJaxRL's README ``vmap``s them instead, which on XLA:CPU (jaxlib 0.10) can
hang for good: the batched QR of its orthogonal initialisation waits on the
thread pool it occupies (see ``podracer.anakin.program._init_learners``).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

MINATAR_CONFIG = {
    "LR": 5e-3,
    "NUM_ENVS": 64,
    "NUM_STEPS": 128,
    "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 8,
    "GAMMA": 0.99,
    "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2,
    "ENT_COEF": 0.01,
    "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5,
    "ACTIVATION": "relu",
    "ANNEAL_LR": True,
    "DEBUG": False,
}


def window_means(returns: np.ndarray, ended: np.ndarray, windows: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean return of the episodes ending in each of ``windows`` equal runs of updates, per seed.

    ``returns``, ``ended``: ``[seeds, updates, steps, envs]``. Returns the last
    update of each window ``[windows]`` (1-based) and the means ``[windows, seeds]``
    (NaN where no episode ended).
    """
    seeds, updates = returns.shape[:2]
    bounds = np.linspace(0, updates, windows + 1).round().astype(int)

    def per_window(x: np.ndarray) -> np.ndarray:  # [seeds, updates, ...] -> sums [windows, seeds]
        x = x.reshape(seeds, updates, -1).sum(-1)
        return np.stack([x[:, a:b].sum(1) for a, b in zip(bounds[:-1], bounds[1:])])

    sums, counts = per_window(returns * ended), per_window(ended.astype(np.float64))
    return bounds[1:], np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--env", required=True, help="a gymnax id, e.g. Breakout-MinAtar")
    parser.add_argument("--steps", type=int, required=True, help="env steps per seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--windows", type=int, default=50, help="log windows (points of the curve)")
    args = parser.parse_args()

    import jax
    from ppo import make_train  # PureJaxRL's purejaxrl/ppo.py

    config = {**MINATAR_CONFIG, "ENV_NAME": args.env, "TOTAL_TIMESTEPS": args.steps}
    train = jax.jit(make_train(config))  # make_train adds NUM_UPDATES (whole updates) to config
    keys = jax.random.split(jax.random.PRNGKey(0), args.seeds)
    start = time.perf_counter()
    compiled = train.lower(keys[0]).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    metrics = [jax.device_get(jax.block_until_ready(compiled(key))["metrics"]) for key in keys]
    train_s = time.perf_counter() - start
    updates, means = window_means(
        np.stack([m["returned_episode_returns"] for m in metrics]),
        np.stack([m["returned_episode"] for m in metrics]),
        args.windows,
    )
    steps_per_update = config["NUM_ENVS"] * config["NUM_STEPS"]
    print(
        "PEER "
        + json.dumps(
            {
                "peer": "PureJaxRL PPO",
                "env": args.env,
                "seeds": args.seeds,
                "compile_s": round(compile_s, 2),
                "train_s": round(train_s, 2),
                "env_steps": (updates * steps_per_update).tolist(),
                "sps": round(int(config["NUM_UPDATES"]) * steps_per_update * args.seeds / train_s),
                "returns": [[None if np.isnan(v) else float(v) for v in row] for row in means],  # [windows, seeds]
                "config": {k: v for k, v in config.items() if k != "DEBUG"},
                "backend": jax.default_backend(),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
