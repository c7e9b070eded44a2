"""Anakin throughput: the full PPO training loop and the environment alone, over batch sizes and devices.

    python experiments/benchmark_anakin.py                 # everything; writes docs/benchmarks.md
    python experiments/benchmark_anakin.py --quick         # a smaller sweep

Each measurement runs in a fresh process (the device count of a CPU host is
fixed when JAX starts). Compilation is timed apart; steps/s are steady-state:
environment steps (one agent step = one frame here, no frame-skip) divided by
the wall time of the compiled calls. "env only" runs the same Anakin program
with a uniformly random policy that learns nothing: the on-device limit.
The table goes to stdout, with one ``BENCH {...}`` JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HEADLINE = [  # PureJaxRL's CartPole PPO settings, and its 64-env variant, as quoted in the issue
    {"name": "PureJaxRL config: 4 envs x 128 steps, 5e5 steps", "num_envs": 4, "total": 500_000, "quoted_sps": 140_000},
    {"name": "64 envs x 128 steps, 5e6 steps", "num_envs": 64, "total": 5_000_000, "quoted_sps": 110_000},
]
SWEEP_ENVS = (4, 16, 64, 256, 1024, 4096)
SWEEP_DEVICES = (1, 2, 8)
ROLLOUT_LEN = 128
SWEEP_STEPS = 1_000_000  # per measurement, rounded up to whole updates (at least two)


def worker(args) -> None:
    """One measurement, in this process: prints one BENCH line."""
    import jax

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import envs
    from agents import PPOConfig, make_random_policy
    from anakin import AnakinConfig, train, train_agent

    steps = max(args.total, 2 * args.num_envs * ROLLOUT_LEN)
    config = AnakinConfig(num_envs=args.num_envs, rollout_len=ROLLOUT_LEN, total_env_steps=steps,
                          num_devices=args.devices, log_interval=steps)
    if args.mode == "train":
        result = train("ppo", PPOConfig(), "cartpole", config, quiet=True)
    else:
        env = envs.make("cartpole")
        result = train_agent(make_random_policy(env.spec), env, config, quiet=True)
    print("BENCH " + json.dumps({
        "mode": args.mode, "devices": args.devices, "num_envs": args.num_envs, "env_steps": result.env_steps,
        "compile_s": round(result.compile_seconds, 2), "train_s": round(result.train_seconds, 3),
        "sps": round(result.env_steps / result.train_seconds), "backend": jax.default_backend(),
        "final_return": result.records[-1]["episode_return"],
    }), flush=True)


def measure(mode: str, devices: int, num_envs: int, total: int) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode, "--devices", str(devices),
               "--num-envs", str(num_envs), "--total", str(total)]
    # A CPU host shows as many devices as asked; accelerators are unaffected by this flag.
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"}
    out = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    for line in out.stdout.splitlines():
        if line.startswith("BENCH "):
            print(line, flush=True)
            return json.loads(line[len("BENCH "):])
    raise RuntimeError(f"measurement {mode}/{devices}/{num_envs} failed:\n{out.stderr[-3000:]}")


def machine() -> str:
    import jax

    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    devices = jax.devices()
    return (f"{cpu}, {os.cpu_count()} cores, backend {jax.default_backend()} ({devices[0].device_kind}), "
            f"jax {jax.__version__}, python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="envs 4/64/1024 on 1 and 2 devices, one headline repeat")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each headline run (median reported)")
    parser.add_argument("--out", default="docs/benchmarks.md", help="markdown report ('' for none)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("train", "env"), default="train", help=argparse.SUPPRESS)
    parser.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--num-envs", type=int, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--total", type=int, default=SWEEP_STEPS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    repeats = 1 if args.quick else args.repeats
    headline_rows = []
    for case in HEADLINE:
        runs = [measure("train", 1, case["num_envs"], case["total"]) for _ in range(repeats)]
        sps = [r["sps"] for r in runs]
        headline_rows.append((case, runs, statistics.median(sps)))

    envs_list = (4, 64, 1024) if args.quick else SWEEP_ENVS
    devices_list = (1, 2) if args.quick else SWEEP_DEVICES
    sweep = {}
    for devices in devices_list:
        for num_envs in envs_list:
            if num_envs % devices:
                continue
            for mode in ("train", "env"):
                sweep[(devices, num_envs, mode)] = measure(mode, devices, num_envs, SWEEP_STEPS)

    lines = [
        "# Anakin throughput",
        "",
        f"Machine: {machine()}.",
        "",
        "`python experiments/benchmark_anakin.py` (each measurement in a fresh process). PPO on the jittable",
        f"CartPole-v1, rollout {ROLLOUT_LEN} steps, 4 epochs x 4 minibatches; steps/s are steady-state environment",
        "steps per second (CartPole has no frame-skip: a step is a frame) over the compiled calls; compilation",
        "is reported apart. \"env only\" is the same Anakin program with a random policy that learns nothing.",
        "",
        "## Against PureJaxRL's settings (1 device)",
        "",
        f"| configuration | podracer steps/s (median of {repeats}) | runs | compile s | final return | quoted PureJaxRL steps/s | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for case, runs, median in headline_rows:
        each = ", ".join(f"{r['sps']:,}" for r in runs)
        lines.append(
            f"| {case['name']} | {median:,.0f} | {each} | "
            f"{statistics.median(r['compile_s'] for r in runs):.1f} | {runs[0]['final_return']:.1f} | "
            f"{case['quoted_sps']:,} | {median / case['quoted_sps']:.2f}x |"
        )
    lines += [
        "",
        "## Batch-size curve",
        "",
        f"Steady-state steps/s, {SWEEP_STEPS:,} env steps per measurement (at least two updates).",
        "",
        "| devices | envs | train steps/s | env only steps/s | train compile s |",
        "|---|---|---|---|---|",
    ]
    for (devices, num_envs, mode), row in sweep.items():
        if mode == "train":
            env_row = sweep[(devices, num_envs, "env")]
            lines.append(f"| {devices} | {num_envs} | {row['sps']:,} | {env_row['sps']:,} | {row['compile_s']:.1f} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
