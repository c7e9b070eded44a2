"""Anakin PPO on a Brax environment against Brax's own PPO trainer, side by side in one run.

    python experiments/benchmark_brax.py            # rewrites its section of docs/benchmarks.md
    python experiments/benchmark_brax.py --quick    # one repeat, a shorter run

Needs the brax extra (``pip install ".[brax]"``). Both sides train the same
Brax environment (time limit 1000 steps; Brax's trainer masks the truncated
step out of its advantages, podracer bootstraps it; Brax's
``bootstrap_on_timeout`` is left off: it reads ``info["time_out"]``, which
halfcheetah lacks and inverted_pendulum sets on every fall) with the
same batch (envs x unroll, one unroll per update), epochs, minibatches,
learning rate, discount, GAE, clipping, entropy cost, observation
normalisation and network: separate 64-64 tanh MLPs for policy and value, a
tanh-squashed Gaussian whose scale is a network output (podracer:
``--log-std network --action-bounds tanh``; Brax's scale is softplus + 0.001,
ours exp). Value clipping is off in podracer, as Brax has none.

Timing: podracer's steps/s are its compiled calls' steady state, its compile
time apart. Brax's trainer reports ``training/sps`` per epoch (between its
evaluations, which are not timed); the first epoch includes compilation, so
the steady state is the median of the later epochs, and Brax's compile time is
the first epoch's excess over that rate. Runs alternate between the two and
each runs in a fresh process. Returns: podracer's is the mean training-episode
return of its log window; Brax's is its evaluation return (128 environments,
stochastic policy, as its trainer runs it) at the same number of steps.

brax 0.14's trainer calls ``jax.device_put_replicated``, which jax 0.10
removed; the Brax worker puts jax's own implementation back under that name
before training (nothing else is changed).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import bench_process  # noqa: E402

SETTINGS = {  # what both sides share
    "learning_rate": 3e-4,
    "num_epochs": 4,
    "num_minibatches": 4,
    "gamma": 0.97,
    "gae_lambda": 0.95,
    "clip_eps": 0.2,
    "entropy_coef": 1e-3,
    "max_grad_norm": 1.0,
    "rollout_len": 16,
}
CASES = [  # (brax env, backend, num_envs, env steps)
    ("inverted_pendulum", "generalized", 64, 300_000),
    ("inverted_pendulum", "generalized", 512, 1_000_000),
    ("halfcheetah", "spring", 256, 300_000),
]
QUICK_CASES = [("inverted_pendulum", "generalized", 64, 150_000)]
CHECKPOINTS = 5  # log windows / Brax evaluations after the start


def _podracer(env: str, backend: str, num_envs: int, steps: int) -> dict:
    from podracer.agents import PPOConfig
    from podracer.anakin import AnakinConfig, train

    s = SETTINGS
    agent_config = PPOConfig(
        learning_rate=s["learning_rate"],
        num_epochs=s["num_epochs"],
        num_minibatches=s["num_minibatches"],
        gamma=s["gamma"],
        gae_lambda=s["gae_lambda"],
        clip_eps=s["clip_eps"],
        entropy_coef=s["entropy_coef"],
        max_grad_norm=s["max_grad_norm"],
        anneal_lr=False,
        clip_value=False,
        normalize_observations=True,
        log_std="network",
        action_bounds="tanh",
        hidden_sizes=(64, 64),
    )
    batch = num_envs * s["rollout_len"]
    config = AnakinConfig(
        num_envs=num_envs,
        rollout_len=s["rollout_len"],
        total_env_steps=steps,
        log_interval=max(batch, steps // CHECKPOINTS),
        num_devices=1,
    )
    result = train(
        "ppo", agent_config, f"brax:{env}:{backend}", config, quiet=True, evaluation=bench_process.NO_EVALUATION
    )
    return {
        "sps": result.env_steps / result.train_seconds,
        "compile_s": result.compile_seconds,
        "env_steps": result.env_steps,
        "curve": [(r["env_steps"], r.get("episode_return")) for r in result.records],
    }


def _brax(env: str, backend: str, num_envs: int, steps: int) -> dict:
    import contextlib
    import io
    import warnings

    import jax
    from jax._src import api

    if not hasattr(jax, "device_put_replicated"):
        jax.device_put_replicated = api.device_put_replicated
    import flax.linen as nn

    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from brax import envs
        from brax.training.agents.ppo import networks as ppo_networks
        from brax.training.agents.ppo import train as ppo

        environment = envs.get_environment(env, backend=backend)

    s = SETTINGS
    curve, epochs = [], []

    def progress(num_steps, metrics):
        if "training/sps" in metrics:
            epochs.append(float(metrics["training/sps"]))
        curve.append((int(num_steps), float(metrics["eval/episode_reward"])))

    def network(observation_size, action_size, preprocess_observations_fn):
        return ppo_networks.make_ppo_networks(
            observation_size,
            action_size,
            preprocess_observations_fn=preprocess_observations_fn,
            policy_hidden_layer_sizes=(64, 64),
            value_hidden_layer_sizes=(64, 64),
            activation=nn.tanh,
        )

    ppo.train(
        environment=environment,
        num_timesteps=steps,
        episode_length=1000,
        num_envs=num_envs,
        unroll_length=s["rollout_len"],
        batch_size=num_envs // s["num_minibatches"],
        num_minibatches=s["num_minibatches"],
        num_updates_per_batch=s["num_epochs"],
        learning_rate=s["learning_rate"],
        entropy_cost=s["entropy_coef"],
        discounting=s["gamma"],
        gae_lambda=s["gae_lambda"],
        clipping_epsilon=s["clip_eps"],
        max_grad_norm=s["max_grad_norm"],
        normalize_observations=True,
        network_factory=network,
        num_evals=CHECKPOINTS + 1,
        num_eval_envs=128,
        seed=0,
        progress_fn=progress,
    )
    steady = statistics.median(epochs[1:]) if len(epochs) > 1 else epochs[0]
    epoch_steps = steps / CHECKPOINTS
    compile_s = max(0.0, epoch_steps / epochs[0] - epoch_steps / steady)
    return {"sps": steady, "compile_s": compile_s, "env_steps": curve[-1][0], "curve": curve}


def _return_at(curve, steps) -> str:
    """The curve's return at the last point at or before ``steps``."""
    points = [r for s, r in curve if s <= steps and r is not None]
    return f"{points[-1]:.0f}" if points else "-"


def main() -> None:
    parser = bench_process.parser(__doc__)
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of each side per case")
    args = parser.parse_args()
    if args.worker:
        bench_process.serve(args.worker, {"podracer": _podracer, "brax": _brax})
        return
    cases, repeats = (QUICK_CASES, 1) if args.quick else (CASES, args.repeats)
    rows = []
    for env, backend, num_envs, steps in cases:
        runs = {"podracer": [], "brax": []}
        for _ in range(repeats):
            for side in runs:
                runs[side].append(
                    bench_process.measure(
                        __file__, side, devices=1, env=env, backend=backend, num_envs=num_envs, steps=steps
                    )
                )
        rows.append((env, backend, num_envs, steps, runs))

    lines = [
        "# Anakin PPO against Brax's PPO trainer (benchmark_brax.py)",
        "",
        f"`python experiments/benchmark_brax.py{' --quick' if args.quick else ''}` on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPU cores, {time.strftime('%Y-%m-%d')}; 1 device. Both sides: batch = envs x unroll "
        f"{SETTINGS['rollout_len']}, {SETTINGS['num_epochs']} epochs x {SETTINGS['num_minibatches']} minibatches, "
        "64-64 tanh MLPs, tanh-squashed Gaussian, observation normalisation; see the script's docstring. "
        "Steps/s are steady-state medians over the runs (each run in a fresh process, the two sides alternating); "
        "compile time apart.",
        "",
        "| env (backend) | envs | steps | podracer steps/s | Brax steps/s | ratio | compile s (podracer / Brax) "
        "| return at the end (podracer training / Brax eval) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for env, backend, num_envs, _steps, runs in rows:
        ours, theirs = (statistics.median(r["sps"] for r in runs[side]) for side in ("podracer", "brax"))
        compiles = [statistics.median(r["compile_s"] for r in runs[side]) for side in ("podracer", "brax")]
        end = min(runs["podracer"][0]["env_steps"], runs["brax"][0]["env_steps"])
        returns = [_return_at(runs[side][0]["curve"], end) for side in ("podracer", "brax")]
        lines.append(
            f"| {env} ({backend}) | {num_envs} | {end:,} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x "
            f"| {compiles[0]:.1f} / {compiles[1]:.1f} | {returns[0]} / {returns[1]} |"
        )
    lines += [
        "",
        "The returns are not the same measure: podracer's is the mean over the training episodes that ended "
        "in its last log window (sampled actions; a 1000-step episode ends there only if it began a window "
        "earlier), Brax's its own evaluation of 128 fresh episodes at the same step count.",
    ]
    bench_process.report(lines, args.out)


if __name__ == "__main__":
    main()
