"""MuZero throughput: search simulations/s over batch sizes and simulation counts, Sebulba end to end, and
Anakin's learning per env step (``--learning``).

    python experiments/benchmark_muzero.py              # rewrites its section of docs/benchmarks.md
    python experiments/benchmark_muzero.py --quick
    python experiments/benchmark_muzero.py --learning   # the replay-ratio x Reanalyse table (its own section)

The search runs jitted on one device (the first); simulations/s = batch x
simulations / seconds per search call, after compilation. The end-to-end runs
are complete Sebulba runs (search on the actor device, learning on another).
``--learning`` runs ``minatar_muzero`` on Breakout-MinAtar with Anakin on one
device at 4, 16 and 32 sampled windows per env step, with and without Reanalyse,
each for ``LEARNING_STEPS / replay ratio`` env steps (compile timed apart).
Each measurement prints one ``BENCH {...}`` JSON line.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import bench_process  # noqa: E402


def _search(env_id: str, batch: int, simulations: int, calls: int) -> dict:
    import jax

    from podracer.agents import MuZeroConfig, make_muzero
    from podracer.sebulba import env_spec
    from podracer.types import BatchShape

    spec = env_spec(env_id)
    config = MuZeroConfig(num_simulations=simulations, max_considered_actions=min(16, spec.num_actions))
    agent = make_muzero(config, spec, BatchShape(1, 1, 1))
    params = agent.init(jax.random.key(0)).params
    obs = jax.numpy.zeros((batch, *spec.observation.shape), spec.observation.dtype)
    search = jax.jit(lambda p, o, k: agent.search(p, o, k).action)
    start = time.perf_counter()
    jax.block_until_ready(search(params, obs, jax.random.key(0)))
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(calls):
        jax.block_until_ready(search(params, obs, jax.random.key(i)))
    seconds = (time.perf_counter() - start) / calls
    return {"ms_per_search": 1e3 * seconds, "simulations_per_s": batch * simulations / seconds, "compile_s": compile_s}


def _sebulba(env_id: str, envs_per_thread: int, simulations: int, updates: int, learner_devices: str = "1") -> dict:
    from podracer.agents import MuZeroConfig
    from podracer.sebulba.config import SebulbaConfig
    from podracer.sebulba.run import train

    rollout = 16
    config = SebulbaConfig(
        actor_devices="0",
        learner_devices=learner_devices,
        envs_per_thread=envs_per_thread,
        rollout_len=rollout,
        total_env_steps=updates * envs_per_thread * rollout,
        log_interval=updates * envs_per_thread * rollout,
    )
    agent_config = MuZeroConfig(num_simulations=simulations, replay_capacity=200, batch_size=64)
    result = train("muzero", agent_config, env_id, config, quiet=True, evaluation=bench_process.NO_EVALUATION)
    return {
        "sps": result.env_steps / result.train_seconds,
        "fps": result.frames / result.train_seconds,
        "timings": result.timings,
        "train_s": result.train_seconds,
    }


LEARNING_STEPS = 200_000  # env steps x replay ratio per --learning row: about the same learner work in each
LEARNING_ROWS = [(4, 0.0), (4, 1.0), (16, 0.0), (16, 0.25), (16, 1.0), (32, 0.0), (32, 0.25), (32, 1.0)]


def _learning(replay_ratio: float, reanalyse_fraction: float, steps: int) -> dict:
    from podracer.agents import MuZeroConfig
    from podracer.anakin import AnakinConfig
    from podracer.anakin.run import train
    from podracer.cli.presets import ANAKIN_PRESETS

    preset = ANAKIN_PRESETS["minatar_muzero"]
    agent_config = MuZeroConfig(
        **{**preset["agent_config"], "replay_ratio": replay_ratio, "reanalyse_fraction": reanalyse_fraction}
    )
    config = AnakinConfig(**{**preset["anakin"], "total_env_steps": steps, "log_interval": steps, "num_devices": 1})
    result = train("muzero", agent_config, preset["env"], config, quiet=True, evaluation=bench_process.NO_EVALUATION)
    sps = result.env_steps / result.train_seconds
    gradient_steps_per_s = sps * replay_ratio / agent_config.batch_size
    return {
        "sps": sps,
        "gradient_steps_per_s": gradient_steps_per_s,
        "ms_per_gradient_step": 1e3 / gradient_steps_per_s,
        "compile_s": result.compile_seconds,
        "batch_size": agent_config.batch_size,
    }


def learning_report(accelerator: bool) -> list[str]:
    """The ``--learning`` section: Anakin MuZero's steps/s at each (replay ratio, Reanalyse fraction)."""
    rows = [
        measure(
            "learning",
            devices=None if accelerator else 1,
            replay_ratio=rr,
            reanalyse_fraction=fraction,
            steps=LEARNING_STEPS // rr,
        )
        for rr, fraction in LEARNING_ROWS
    ]
    lines = [
        bench_process.heading("MuZero learning per env step", accelerator),
        "",
        f"`python experiments/benchmark_muzero.py --learning{' --accelerator' * accelerator}`: Anakin "
        "`minatar_muzero` (Breakout-MinAtar, 16 envs x 16 steps, 16 simulations, batch",
        f"{rows[0]['batch_size']}) on one device, {LEARNING_STEPS:,} / (replay ratio) env steps per row after "
        "compiling. Gradient steps = env steps x replay ratio / batch; ms",
        "per gradient step is the whole loop's time (acting included) over them. Reanalyse searches the sampled "
        "windows' K + 1 = 6 positions with the target network.",
        "",
        "| windows per env step | Reanalyse fraction | env steps/s | gradient steps/s | ms per gradient step | "
        "compile s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['replay_ratio']:g} | {r['reanalyse_fraction']:g} | {r['sps']:,.0f} | "
            f"{r['gradient_steps_per_s']:,.1f} | {r['ms_per_gradient_step']:.1f} | {r['compile_s']:.0f} |"
        )
    return lines


def measure(kind: str, devices: int | None = 2, **spec) -> dict:
    return bench_process.measure(__file__, kind, devices, **spec)


def cpu_plan(quick: bool) -> tuple[list[dict], list[dict]]:
    """The (search, Sebulba) measurements on simulated CPU devices."""
    batches = (16, 256) if quick else (16, 64, 256)
    simulations = (8, 32) if quick else (8, 16, 32, 64)
    searches = [dict(env_id="CartPole-v1", batch=b, simulations=s, calls=10) for b in batches for s in simulations]
    searches.append(dict(env_id="Breakout-v5", batch=16, simulations=16, calls=3))
    runs = [dict(env_id="CartPole-v1", envs_per_thread=16, simulations=16, updates=40)]
    if not quick:
        runs.append(dict(env_id="Breakout-v5", envs_per_thread=8, simulations=8, updates=4))
    return searches, runs


def accelerator_plan() -> tuple[list[dict], list[dict]]:
    """The measurements on the host's own devices, at accelerator-sized search batches."""
    searches = [
        dict(devices=None, env_id="CartPole-v1", batch=b, simulations=s, calls=10)
        for b in (256, 2048)
        for s in (16, 64)
    ]
    searches.append(dict(devices=None, env_id="Breakout-v5", batch=256, simulations=16, calls=5))
    runs = [
        dict(devices=None, env_id="Breakout-v5", envs_per_thread=64, simulations=16, updates=10, learner_devices="auto")
    ]
    return searches, runs


def main() -> None:
    parser = bench_process.parser(__doc__)
    parser.add_argument("--learning", action="store_true", help="only the replay-ratio x Reanalyse table")
    args = parser.parse_args()
    if args.accelerator and not args.worker:
        bench_process.refuse_cpu_only_host(parser)
    if args.worker:
        return bench_process.serve(args.worker, {"search": _search, "sebulba": _sebulba, "learning": _learning})
    if args.learning:
        return bench_process.report(learning_report(args.accelerator), args.out)
    search_plan, run_plan = accelerator_plan() if args.accelerator else cpu_plan(args.quick)
    searches = [measure("search", **spec) for spec in search_plan]
    runs = [measure("sebulba", **spec) for spec in run_plan]

    where = "the first device of the host" if args.accelerator else "one CPU device"
    lines = [
        bench_process.heading("MuZero throughput", args.accelerator),
        "",
        f"`python experiments/benchmark_muzero.py{' --accelerator' * args.accelerator}` on the same machine: "
        "Gumbel MuZero search (mctx) with the",
        f"default networks (MLP for CartPole, the downsampling ResNet at widths 32/64 for Atari), {where}.",
        "",
        "| env | batch | simulations | ms per search | simulations/s |",
        "|---|---|---|---|---|",
    ]
    for r in searches:
        lines.append(
            f"| {r['env_id']} | {r['batch']} | {r['simulations']} | {r['ms_per_search']:.1f} | "
            f"{r['simulations_per_s']:,.0f} |"
        )
    lines += [
        "",
        "Sebulba MuZero end to end (actor on device 0 with the search, learner on device 1, or on device 0 where it",
        "is the only one; rollout 16):",
        "",
        "| env | envs per thread | simulations | agent steps/s | frames/s | inference s | learner update s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        t = r["timings"]
        lines.append(
            f"| {r['env_id']} | {r['envs_per_thread']} | {r['simulations']} | {r['sps']:,.1f} | "
            f"{r['fps']:,.0f} | {t.get('inference', 0):.1f} | {t.get('learner_update', 0):.1f} |"
        )
    bench_process.report(lines, args.out)


if __name__ == "__main__":
    main()
