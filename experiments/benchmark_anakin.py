"""Anakin throughput: the full PPO training loop and the environment alone, over batch sizes and devices.

    python experiments/benchmark_anakin.py                 # everything; writes docs/benchmarks.md
    python experiments/benchmark_anakin.py --quick         # a smaller sweep
    python experiments/benchmark_anakin.py --purejaxrl ~/purejaxrl --purejaxrl-python ~/pjx/bin/python

Each measurement runs in a fresh process (the device count of a CPU host is
fixed when JAX starts). Compilation is timed apart; steps/s are steady-state:
environment steps (one agent step = one frame here, no frame-skip) divided by
the wall time of the compiled calls. "env only" runs the same Anakin program
with a uniformly random policy that learns nothing: the on-device limit.
The table goes to stdout, with one ``BENCH {...}`` JSON line per measurement.

A CPU host's speed drifts, so a figure quoted from another day is a weak yardstick:
``--purejaxrl DIR`` also times PureJaxRL's own ``make_train`` from a checkout
of github.com/luchris429/purejaxrl at ``DIR`` (its CartPole-v1 defaults, DEBUG
off, compile timed apart), alternating with podracer's runs. It runs under
``--purejaxrl-python`` (a Python with jax, flax, optax, distrax and gymnax<1.0,
the gymnax API that PureJaxRL is written against).
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import bench_process  # noqa: E402

HEADLINE = [  # PureJaxRL's CartPole PPO settings and its 64-env variant: PureJaxRL's figures quoted for 2 CPU cores
    # (a run without --purejaxrl compares with them) and the ratios podracer aims at (issue 36)
    {
        "name": "PureJaxRL config: 4 envs x 128 steps, 5e5 steps",
        "num_envs": 4,
        "total": 500_000,
        "quoted_sps": 140_000,
        "aim": 1.5,
    },
    {"name": "64 envs x 128 steps, 5e6 steps", "num_envs": 64, "total": 5_000_000, "quoted_sps": 110_000, "aim": 1.6},
]
SWEEP_ENVS = (4, 16, 64, 256, 1024, 4096)
SWEEP_DEVICES = (1, 2, 8)
ACCELERATOR_ENVS = (1024, 4096, 8192, 65536)  # --accelerator: over every device of the host (devices 0 = all)
ROLLOUT_LEN = 128
PARTS_ENVS = (4, 64)  # where an update's time goes, at PureJaxRL's batch and the 64-env one
PARTS_CALLS = 50
PARTS_TRACED_CALLS = 10  # learner calls in the profiler trace of its kernels
MATMUL = 1024
SWEEP_STEPS = 1_000_000  # per measurement, rounded up to whole updates (at least two)
PUREJAXRL_CARTPOLE = {  # the `__main__` config of purejaxrl/ppo.py, with DEBUG off
    "LR": 2.5e-4,
    "NUM_STEPS": ROLLOUT_LEN,
    "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4,
    "GAMMA": 0.99,
    "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2,
    "ENT_COEF": 0.01,
    "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5,
    "ACTIVATION": "tanh",
    "ENV_NAME": "CartPole-v1",
    "ANNEAL_LR": True,
    "DEBUG": False,
}


def worker(args) -> None:
    """One measurement, in this process: prints one BENCH line."""
    import jax

    from podracer import envs
    from podracer.agents import PPOConfig, make_random_policy

    bench_process.check_accelerator()
    from podracer.anakin import AnakinConfig, train, train_agent

    steps = max(args.total, 2 * args.num_envs * ROLLOUT_LEN)
    # 20 log windows: the last one's mean return says where learning ended (the host calls cost ~nothing).
    config = AnakinConfig(
        num_envs=args.num_envs,
        rollout_len=ROLLOUT_LEN,
        total_env_steps=steps,
        num_devices=args.devices,
        log_interval=steps // 20,
    )
    if args.mode == "train":
        result = train("ppo", PPOConfig(), "cartpole", config, quiet=True, evaluation=bench_process.NO_EVALUATION)
    else:
        env = envs.make("cartpole")
        result = train_agent(
            make_random_policy(env.spec), env, config, quiet=True, evaluation=bench_process.NO_EVALUATION
        )
    print(
        "BENCH "
        + json.dumps(
            {
                "mode": args.mode,
                "devices": args.devices or jax.device_count(),
                "num_envs": args.num_envs,
                "env_steps": result.env_steps,
                "compile_s": round(result.compile_seconds, 2),
                "train_s": round(result.train_seconds, 3),
                "sps": round(result.env_steps / result.train_seconds),
                "backend": jax.default_backend(),
                "final_return": result.records[-1]["episode_return"],
            }
        ),
        flush=True,
    )


def parts_worker(args) -> None:
    """Where an update's time goes at ``--num-envs``, in this process: the rollout (PPO acting and CartPole) and
    ``Agent.learn`` on its trajectory, each jitted on one device as the Anakin program binds them and timed
    alone; the learner's kernels from a profiler trace, the matrix multiplications apart from the rest; and its
    arithmetic rate: XLA's flop count of the learn compiled with its minibatch loop unrolled (a rolled loop's
    body is counted once), over the learn's time and over its matmul kernels' time, beside a ``MATMUL`` x
    ``MATMUL`` float32 matmul's on the same device. Prints one BENCH line."""
    bench_process.enable_kernel_traces()
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from podracer import envs
    from podracer.agents import PPOConfig, make_ppo
    from podracer.anakin.program import rollout
    from podracer.parallel import device_mesh, shard_map
    from podracer.types import BatchShape

    env = envs.make("cartpole")
    config = PPOConfig()
    shape = BatchShape(100, ROLLOUT_LEN, args.num_envs)
    agent = make_ppo(config, env.spec, shape)
    state = agent.init(jax.random.key(0))
    env_state, obs = jax.vmap(env.reset)(jax.random.split(jax.random.key(1), args.num_envs))
    mesh = device_mesh(jax.devices()[:1], lane_axis=True)  # binds both data axes, with no size-1 vmap

    def on_one_device(fn):
        return jax.jit(shard_map(fn, mesh, in_specs=P(), out_specs=P()))

    run_rollout = on_one_device(
        lambda state, env_state, obs, key: rollout(
            agent, env, ROLLOUT_LEN, agent.actor_params(state), env_state, obs, agent.initial_core(args.num_envs), key
        )
    )
    learn = on_one_device(agent.learn)
    unrolled_learn = on_one_device(make_ppo(PPOConfig(minibatch_loop="unroll"), env.spec, shape).learn)
    a, b = jnp.ones((MATMUL, MATMUL)), jnp.ones((MATMUL, MATMUL))
    matmul = jax.jit(jnp.matmul)

    def seconds(fn, *call_args, calls=PARTS_CALLS):
        jax.block_until_ready(fn(*call_args))
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*call_args)
        jax.block_until_ready(out)
        return (time.perf_counter() - start) / calls

    _, _, _, traj, _ = run_rollout(state, env_state, obs, jax.random.key(2))
    learn_args = (state, traj, jax.random.key(3))
    rollout_s = seconds(run_rollout, state, env_state, obs, jax.random.key(2))
    learn_s = seconds(learn, *learn_args)
    flops = unrolled_learn.lower(*learn_args).compile().cost_analysis()
    flops = (flops[0] if isinstance(flops, list) else flops)["flops"]
    kernels = bench_process.kernel_times(learn, learn_args, calls=PARTS_TRACED_CALLS) or {}
    matmul_s = seconds(matmul, a, b, calls=10)
    print(
        "BENCH "
        + json.dumps(
            {
                "mode": "parts",
                "num_envs": args.num_envs,
                "rollout_ms": 1e3 * rollout_s,
                "learn_ms": 1e3 * learn_s,
                "learn_mflop": flops / 1e6,
                "learn_gflops": flops / learn_s / 1e9,
                "matmul_gflops": 2 * MATMUL**3 / matmul_s / 1e9,
                "gradient_steps": config.num_epochs * config.num_minibatches,
                **kernels,
                "learn_matmul_gflops": flops / (1e-6 * kernels["matmul_us"]) / 1e9 if kernels else None,
            }
        ),
        flush=True,
    )


def purejaxrl_worker(args) -> None:
    """Times PureJaxRL's ``make_train`` in this process (it must import ``purejaxrl``): prints one BENCH line."""
    import jax
    from purejaxrl.ppo import make_train

    config = {**PUREJAXRL_CARTPOLE, "NUM_ENVS": args.num_envs, "TOTAL_TIMESTEPS": args.total}
    train = jax.jit(make_train(config))  # make_train adds NUM_UPDATES (whole updates, rounded down) to config
    start = time.perf_counter()
    compiled = train.lower(jax.random.PRNGKey(30)).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(jax.random.PRNGKey(30)))
    train_s = time.perf_counter() - start
    steps = int(config["NUM_UPDATES"]) * ROLLOUT_LEN * args.num_envs
    print(
        "BENCH "
        + json.dumps(
            {
                "mode": "purejaxrl",
                "devices": 1,
                "num_envs": args.num_envs,
                "env_steps": steps,
                "compile_s": round(compile_s, 2),
                "train_s": round(train_s, 3),
                "sps": round(steps / train_s),
                "backend": jax.default_backend(),
                "final_return": float(out["metrics"]["returned_episode_returns"][-1].mean()),
            }
        ),
        flush=True,
    )


def measure(
    mode: str, devices: int, num_envs: int, total: int, python: str = sys.executable, pythonpath: str | None = None
) -> dict:
    command = [
        python,
        os.path.abspath(__file__),
        "--worker",
        "--mode",
        mode,
        "--devices",
        str(devices),
        "--num-envs",
        str(num_envs),
        "--total",
        str(total),
    ]
    env = bench_process.worker_env(devices or None)  # 0: every device of an accelerator host
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, os.environ.get("PYTHONPATH")]))
    out = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    for line in out.stdout.splitlines():
        if line.startswith("BENCH "):
            print(line, flush=True)
            return json.loads(line[len("BENCH ") :])
    raise RuntimeError(f"measurement {mode}/{devices}/{num_envs} failed:\n{out.stderr[-3000:]}")


def _purejaxrl_path(checkout: str) -> str:
    """PYTHONPATH for a PureJaxRL checkout: its root (``purejaxrl.ppo``) and its package folder, from which newer
    versions of ``ppo.py`` import ``wrappers`` as a top-level module."""
    root = os.path.abspath(checkout)
    return os.pathsep.join([root, os.path.join(root, "purejaxrl")])


def _checkout_name(checkout: str) -> str:
    """The checkout's git commit and the files it changes where it is a git checkout, else its path."""

    def git(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", checkout, *command], capture_output=True, text=True, check=False)

    commit = git("rev-parse", "--short", "HEAD")
    if commit.returncode:
        return f"the copy at `{checkout}`"
    changed = [line[3:] for line in git("status", "--porcelain").stdout.splitlines()]  # untracked files too
    changes = f"with local changes to {', '.join(f'`{name}`' for name in changed)}" if changed else "unmodified"
    return f"luchris429/purejaxrl at {commit.stdout.strip()}, {changes}"


def _python_jax(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import jax; print(jax.__version__)"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or "unknown"


def machine() -> str:
    import jax

    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    devices = jax.devices()
    return (
        f"{cpu}, {os.cpu_count()} cores, backend {jax.default_backend()} ({devices[0].device_kind}), "
        f"jax {jax.__version__}, python {platform.python_version()}, {time.strftime('%Y-%m-%d')}"
    )


def _listed(runs: list[dict]) -> str:
    return ", ".join(f"{r['sps']:,}" for r in runs)


def _final_return(runs: list[dict]) -> str:
    value = runs[0]["final_return"]  # the same in every run: the seed is fixed
    return "-" if value is None else f"{value:.1f}"


def _median_compile(runs: list[dict]) -> float:
    return statistics.median(r["compile_s"] for r in runs)


def _kernel_cells(row: dict) -> str:
    if row.get("matmul_kernels") is None:
        return "- | -"
    return (
        f"{row['matmul_kernels']:,.0f} / {row['other_kernels']:,.0f} | "
        f"{row['matmul_us'] / 1e3:.2f} / {row['other_us'] / 1e3:.2f}"
    )


def _parts_sentence(row: dict) -> str:
    """Where the update's time goes at one batch, in words."""
    learn_share = row["learn_ms"] / (row["learn_ms"] + row["rollout_ms"])
    sentence = (
        f"At {row['num_envs']} envs the learner is {learn_share:.0%} of an update, "
        f"{row['learn_mflop'] / row['gradient_steps']:.1f} MFLOP per gradient step at "
        f"{row['learn_gflops'] / row['matmul_gflops']:.0%} of the large matmul's rate"
    )
    if row.get("matmul_kernels") is None:
        return sentence + "."
    matmul_share = row["matmul_us"] / (row["matmul_us"] + row["other_us"])
    return (
        sentence + f"; {matmul_share:.0%} of its kernels' time is in matrix multiplications "
        f"({row['matmul_kernels'] / row['gradient_steps']:.0f} kernels per gradient step, "
        f"{row['learn_matmul_gflops']:.0f} GFLOP/s of their time), the rest in the update's "
        f"{row['other_kernels']:,.0f} other kernels."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="envs 4/64/1024 on 1 and 2 devices, one headline repeat")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each headline run (median reported)")
    parser.add_argument(
        "--out", default="docs/benchmarks.md", help="markdown file to write this benchmark's section into ('' for none)"
    )
    parser.add_argument("--accelerator", action="store_true", help=bench_process.ACCELERATOR_HELP)
    parser.add_argument("--purejaxrl", metavar="DIR", help="a PureJaxRL checkout: time its make_train alongside")
    parser.add_argument(
        "--purejaxrl-python",
        metavar="PY",
        default=sys.executable,
        help="the Python that runs PureJaxRL (default: this one)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--mode", choices=("train", "env", "purejaxrl", "parts"), default="train", help=argparse.SUPPRESS
    )
    parser.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--num-envs", type=int, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--total", type=int, default=SWEEP_STEPS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return {"purejaxrl": purejaxrl_worker, "parts": parts_worker}.get(args.mode, worker)(args)
    if args.accelerator:
        bench_process.refuse_cpu_only_host(parser)
    if args.purejaxrl and not os.path.isfile(os.path.join(args.purejaxrl, "purejaxrl", "ppo.py")):
        parser.error(f"--purejaxrl {args.purejaxrl}: no purejaxrl/ppo.py there (a checkout of luchris429/purejaxrl)")

    repeats = 1 if args.quick else args.repeats
    headline_rows = []
    for case in [] if args.accelerator and not args.purejaxrl else HEADLINE:
        runs, references = [], []
        for _ in range(repeats):  # alternating, so that both see the same drift of the machine
            if args.purejaxrl:
                references.append(
                    measure(
                        "purejaxrl",
                        1,
                        case["num_envs"],
                        case["total"],
                        args.purejaxrl_python,
                        _purejaxrl_path(args.purejaxrl),
                    )
                )
            runs.append(measure("train", 1, case["num_envs"], case["total"]))
        headline_rows.append((case, runs, references))

    parts = [] if args.accelerator else [measure("parts", 1, num_envs, SWEEP_STEPS) for num_envs in PARTS_ENVS]

    envs_list = (4, 64, 1024) if args.quick else SWEEP_ENVS
    devices_list = (1, 2) if args.quick else SWEEP_DEVICES
    if args.accelerator:
        envs_list, devices_list = ACCELERATOR_ENVS, (0,)
    sweep = {}
    for devices in devices_list:
        for num_envs in envs_list:
            if num_envs % devices:
                continue
            for mode in ("train", "env"):
                sweep[(devices, num_envs, mode)] = measure(mode, devices, num_envs, SWEEP_STEPS)

    lines = [
        bench_process.heading("Anakin throughput", args.accelerator),
        "",
        f"Machine: {machine()}.",
        "",
        f"`python experiments/benchmark_anakin.py{' --accelerator' * args.accelerator}` (each measurement in a fresh "
        "process). PPO on the jittable",
        f"CartPole-v1, rollout {ROLLOUT_LEN} steps, 4 epochs x 4 minibatches; steps/s are steady-state environment",
        "steps per second (CartPole has no frame-skip: a step is a frame) over the compiled calls; compilation",
        'is reported apart. "env only" is the same Anakin program with a random policy that learns nothing.',
        "",
    ]
    lines += (
        [
            "## Against PureJaxRL's settings (1 device)",
            "",
            "Medians of the runs listed; the ratio is against PureJaxRL timed in the same benchmark run where it was",
            "(`--purejaxrl`), else against the figure quoted for it on this machine type. Return at the end: podracer's",
            "mean episode return over the last 5% of the run; PureJaxRL's `returned_episode_returns` averaged over its",
            "last update.",
            "",
            "| configuration | podracer steps/s | runs | compile s | return at the end | PureJaxRL steps/s | its runs | its compile s | its return | ratio | aim |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        if headline_rows
        else []
    )
    for case, runs, references in headline_rows:
        median = statistics.median(r["sps"] for r in runs)
        if references:
            reference = statistics.median(r["sps"] for r in references)
            reference_cells = (
                f"{reference:,.0f} (timed here) | {_listed(references)} | "
                f"{_median_compile(references):.1f} | {_final_return(references)}"
            )
        else:
            reference = case["quoted_sps"]
            reference_cells = f"{reference:,} (quoted) | - | - | -"
        lines.append(
            f"| {case['name']} | {median:,.0f} | {_listed(runs)} | {_median_compile(runs):.1f} | "
            f"{_final_return(runs)} | {reference_cells} | {median / reference:.2f}x | {case['aim']}x |"
        )
    if args.purejaxrl:
        lines += [
            "",
            f"PureJaxRL here: `purejaxrl/ppo.py` from {_checkout_name(args.purejaxrl)}, run by "
            f"`--purejaxrl-python` (jax {_python_jax(args.purejaxrl_python)}).",
        ]
    if parts:
        lines += [
            "",
            "Where an update's time goes (1 device, each part jitted as the Anakin program binds it and timed alone "
            f"over {PARTS_CALLS} calls): the rollout ({ROLLOUT_LEN} steps of PPO acting and CartPole) and `Agent.learn` "
            "on its trajectory. The learner's arithmetic rate is XLA's flop count of the learn (compiled with its "
            f"minibatch loop unrolled, so that every gradient step is counted) over its time, beside a {MATMUL} x "
            f"{MATMUL} float32 matmul's on the same device. Its kernels are from a profiler trace of "
            f"{PARTS_TRACED_CALLS} calls: "
            "those that multiply matrices (dots and the fusions that hold one) apart from every other, with their "
            "time summed over the cores (XLA:CPU runs independent kernels at the same time; tracing adds a little "
            "to each).",
            "",
            "| envs | rollout ms | learn ms | gradient steps | learn us per gradient step | learn MFLOP | "
            "learn GFLOP/s | matmul GFLOP/s | learner kernels per update: matmul / other | their time: matmul / "
            "other, ms |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['num_envs']} | {r['rollout_ms']:.2f} | {r['learn_ms']:.2f} | {r['gradient_steps']} | "
            f"{1e3 * r['learn_ms'] / r['gradient_steps']:,.0f} | {r['learn_mflop']:,.0f} | "
            f"{r['learn_gflops']:.0f} | {r['matmul_gflops']:.0f} | {_kernel_cells(r)} |"
            for r in parts
        ]
        lines += ["", " ".join(_parts_sentence(r) for r in parts)]
    lines += [
        "",
        "## Batch-size curve",
        "",
        f"Steady-state steps/s, {SWEEP_STEPS:,} env steps per measurement (at least two updates)"
        + (" on every device of the host." if args.accelerator else "."),
        "",
        "| devices | envs | train steps/s | env only steps/s | train compile s |",
        "|---|---|---|---|---|",
    ]
    for (devices, num_envs, mode), row in sweep.items():
        if mode == "train":
            env_row = sweep[(devices, num_envs, "env")]
            lines.append(
                f"| {row['devices']} | {num_envs} | {row['sps']:,} | {env_row['sps']:,} | {row['compile_s']:.1f} |"
            )
    bench_process.report(lines, args.out)


if __name__ == "__main__":
    main()
