"""Sebulba throughput: raw envpool, actors alone, and full training over actor batches and device splits.

    python experiments/benchmark_sebulba.py            # everything; rewrites its section of docs/benchmarks.md
    python experiments/benchmark_sebulba.py --quick    # fewer configurations
    python experiments/benchmark_sebulba.py --cleanba ~/cleanba   # and Cleanba beside it, from a checkout

Each measurement runs in a fresh process with as many simulated CPU devices as
it needs. Agent steps are what the agent acts on; frames = agent steps x
frame-skip (4 on Atari, 1 on CartPole). Compilation and warm-up are excluded.

* raw: envpool stepped with uniformly random actions from one Python thread,
  with ``env_threads`` C++ worker threads: the host's limit.
* actors: Sebulba's actor threads (real inference with the agent's network on
  the actor device, trajectories shipped to a learner device) with no learning.
* train: complete Sebulba runs.
* with ``--cleanba DIR``: Sebulba and Cleanba's PPO and IMPALA at equal network and
  batch, run one after the other (see ``experiments/peer_cleanba.py``).

Every measurement prints one ``BENCH {...}`` JSON line.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import bench_process  # noqa: E402

CLASSIC, ATARI = "CartPole-v1", ("Breakout-v5", "Pong-v5")
# learner updates per run beside Cleanba: 2 to warm up, the rest timed (PPO's updates are 3-8x longer)
PEER_UPDATES = {"impala": 6, "ppo": 4}
CLEANBA_MINIBATCHES = 4  # Cleanba's default for both agents (PPO: per epoch, 4 epochs; IMPALA: one pass)


def _cpu_seconds() -> float:
    """CPU time this process has used so far, every thread's (envpool's workers, XLA's) counted."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _raw(env_id: str, num_envs: int, batch_size: int, threads: int, seconds: float) -> dict:
    """envpool's own rate with random actions, and the CPU time each agent step takes (``cpu_us_per_step``) on
    the host's ``cores``."""
    import envpool
    import numpy as np

    env = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, batch_size=batch_size, num_threads=threads)
    actions = env.action_space.n
    rng = np.random.default_rng(0)
    env.async_reset()
    steps, start, warm = 0, None, 0
    while True:
        _, _, _, _, info = env.recv()
        ids = info["env_id"]
        env.send(rng.integers(actions, size=len(ids), dtype=np.int32), ids)
        warm += 1
        if warm == 50:
            start, cpu_start = time.perf_counter(), _cpu_seconds()
        elif start is not None:
            steps += len(ids)
            if time.perf_counter() - start > seconds:
                break
    cpu = _cpu_seconds() - cpu_start
    return {
        "sps": steps / (time.perf_counter() - start),
        "cpu_us_per_step": cpu / steps * 1e6,
        "cores": len(os.sched_getaffinity(0)),
    }


def _actors(
    env_id: str,
    num_envs: int,
    threads: int,
    rollouts: int,
    actor_threads: int = 1,
    env_batches: int = 2,
    learner_devices: str = "1",
) -> dict:
    """Sebulba with a learner that learns nothing: ``actor_threads`` actor threads on device 0, each with
    ``env_batches`` envpool batches of ``num_envs`` (``threads`` envpool workers each) and real PPO
    inference, shipping trajectories to ``learner_devices``. The first two rollouts (compilation, warm-up) are
    left out."""
    import jax.numpy as jnp

    from podracer.agents import PPOConfig, make_ppo
    from podracer.envs.host import HostEnvConfig, is_atari
    from podracer.sebulba import SebulbaConfig, batch_shape, env_spec, train_agent

    rollout_len, warm_up = 32, 2
    steps_per_update = actor_threads * num_envs * env_batches * rollout_len
    config = SebulbaConfig(
        actor_devices="0",
        learner_devices=learner_devices,
        actor_threads=actor_threads,
        envs_per_thread=num_envs * env_batches,
        env_batches=env_batches,
        rollout_len=rollout_len,
        total_env_steps=(warm_up + rollouts) * steps_per_update,
        log_interval=warm_up * steps_per_update,
    )  # the first record ends the warm-up
    env_config = HostEnvConfig(env_threads=threads)
    agent = make_ppo(PPOConfig(shared_torso=is_atari(env_id)), env_spec(env_id, env_config), batch_shape(config))
    agent = agent._replace(learn=lambda state, trajectory, key: (state, {"loss": jnp.float32(0.0)}))
    records = train_agent(agent, env_id, config, env_config, quiet=True, evaluation=bench_process.NO_EVALUATION).records
    first, last = records[0], records[-1]
    seconds = last["time"] - first["time"]
    timings = {name: last[f"time_{name}"] - first[f"time_{name}"] for name in ("env_step", "inference", "transfer")}
    return {
        "sps": (last["env_steps"] - first["env_steps"]) / seconds,
        "frame_skip": last["frames"] // last["env_steps"],
        "timings": timings,
        "seconds": seconds,
        **_inference_alone(agent, env_id, num_envs, env_config),
    }


def _inference_alone(agent, env_id: str, num_envs: int, env_config, calls: int = 300) -> dict:
    """Microseconds per actor inference call outside the actor loop (no envpool threads beside it):
    ``inference_alone_us`` the actors' own jitted call (as the loop makes it, the action fetched to the host)
    and (on the CPU backend) ``inference_cpu_us`` the CPU time it takes over every thread, ``call_floor_us`` a
    jitted call that takes the same arguments and computes nothing (JAX's dispatch and the fetch), the least any
    per-step call costs."""
    import jax
    import numpy as np

    from podracer.envs.host import HostEnv
    from podracer.parallel import device_mesh, per_device
    from podracer.sebulba.actor import ACTOR_KEY_IMPL, make_actor_program

    env = HostEnv(env_id, num_envs, 0, env_config)
    obs = env.reset()
    env.close()
    params = agent.actor_params(agent.init(jax.random.key(0)))
    program = make_actor_program(agent, env.to_agent_layout, params)
    packed = program.pack(per_device(params, device_mesh(jax.devices()[:1])))  # as the learner publishes them
    key = np.asarray(jax.random.key_data(jax.random.key(1, impl=ACTOR_KEY_IMPL)))
    floor = jax.jit(lambda packed, obs, key: (obs[:, :1], obs))  # obs[:, :1]: the small output an action is
    results = {}
    for name, call in (
        ("inference_alone_us", lambda: program.act(packed, obs, key, program.initial_core(num_envs), None)[0]),
        ("call_floor_us", lambda: floor(packed, obs, key)[0]),
    ):
        for _ in range(20):
            np.asarray(call())
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        for _ in range(calls):
            np.asarray(call())
        results[name] = (time.perf_counter() - start) / calls * 1e6
        if name == "inference_alone_us" and jax.default_backend() == "cpu":  # an accelerator's waits spin on the host
            results["inference_cpu_us"] = (_cpu_seconds() - cpu_start) / calls * 1e6
    return results


def _train(
    env_id: str,
    agent: str,
    envs_per_thread: int,
    actor_devices: str,
    learner_devices: str,
    actor_threads: int,
    rollout_len: int,
    updates: int,
    torso: str = "auto",
    num_minibatches: int = 0,
) -> dict:
    """A complete Sebulba run of ``updates`` updates; rates over the updates after the first two (warm-up).
    ``num_minibatches``: the agent's (0: its default)."""
    from podracer.agents import AGENTS
    from podracer.cli.presets import SEBULBA_PRESETS
    from podracer.sebulba.config import SebulbaConfig
    from podracer.sebulba.run import train

    minibatches = {"num_minibatches": num_minibatches} if num_minibatches else {}
    # IMPALA as the atari_impala preset takes it (the paper's and Cleanba's optimiser and loss scale)
    paper = SEBULBA_PRESETS["atari_impala"]["fit"](2, 2)["agent_config"] if agent == "impala" else {}
    agent_config = AGENTS[agent][0](**{"shared_torso": True, **paper, "torso": torso, **minibatches})
    per_update = envs_per_thread * rollout_len * actor_threads * len(actor_devices.split(","))
    config = SebulbaConfig(
        actor_devices=actor_devices,
        learner_devices=learner_devices,
        actor_threads=actor_threads,
        envs_per_thread=envs_per_thread,
        rollout_len=rollout_len,
        total_env_steps=updates * per_update,
        log_interval=per_update,
    )
    result = train(agent, agent_config, env_id, config, quiet=True, evaluation=bench_process.NO_EVALUATION)
    first, last = result.records[min(1, len(result.records) - 1)], result.records[-1]
    seconds = last["time"] - first["time"] if last is not first else result.train_seconds
    sps = (last["env_steps"] - first["env_steps"]) / seconds if last is not first else result.env_steps / seconds
    return {
        "sps": sps,
        "fps": sps * result.frames / result.env_steps,
        "update_s": per_update / sps,
        "compile_s": result.compile_seconds,
        "timings": result.timings,
        "train_s": result.train_seconds,
    }


def _cleanba(script: str, agent: str, envs_per_thread: int, rollout_len: int, updates: int, python: str) -> dict:
    """Cleanba's ``agent`` (a script :func:`experiments.peer_cleanba.prepare` made) with 1 actor thread on
    device 0 and the learner on device 1, at ``envs_per_thread`` x ``rollout_len`` (its other settings its own)."""
    from experiments import peer_cleanba

    flags = [
        "--env-id",
        ATARI[0],
        "--local-num-envs",
        str(envs_per_thread),
        "--num-steps",
        str(rollout_len),
        "--num-actor-threads",
        "1",
        "--actor-device-ids",
        "0",
        "--learner-device-ids",
        "1",
        "--total-timesteps",
        str(10**9),
    ]
    result = peer_cleanba.run(script, flags, devices=2, updates=updates, python=python)
    return {**result, "sps": envs_per_thread * rollout_len / result["update_s"]}


def measure(kind: str, devices: int | None = 2, **spec) -> dict:
    return bench_process.measure(__file__, kind, devices, **spec)


def measure_medians(kind: str, plan: list[dict], repeats: int) -> list[dict]:
    """Each spec of ``plan`` measured ``repeats`` times, the plan's specs alternating (a shared host's neighbours
    moved single runs here by 20% and more); per spec its median run by steps/s, with every run's steps/s in
    ``runs``."""
    runs = [[] for _ in plan]
    for _ in range(repeats):
        for spec, results in zip(plan, runs):
            results.append(measure(kind, **spec))
    medians = []
    for results in runs:
        ordered = sorted(results, key=lambda r: r["sps"])
        medians.append({**ordered[(len(ordered) - 1) // 2], "runs": [r["sps"] for r in results]})
    return medians


def cpu_plan(quick: bool) -> tuple[list[dict], list[dict], list[dict]]:
    """The (raw, actors, train) measurements on simulated CPU devices, envpool on 2 threads."""
    seconds = 3.0 if quick else 6.0
    raw = [
        dict(env_id=env_id, num_envs=num_envs, batch_size=batch, threads=2, seconds=seconds)
        for env_id, num_envs, batch in [
            (CLASSIC, 64, 64),
            (CLASSIC, 128, 64),
            (ATARI[0], 16, 16),
            (ATARI[0], 32, 32),
            (ATARI[1], 16, 16),
            (ATARI[1], 32, 32),
        ]
    ]
    actors = [
        dict(env_id=env_id, num_envs=num_envs, env_batches=batches, threads=2, rollouts=rollouts)
        for env_id, num_envs, batches, rollouts in [
            (CLASSIC, 64, 1, 150),  # 2-3 s timed: 40 rollouts (under a second) moved by a third between runs
            (CLASSIC, 32, 2, 150),
            (CLASSIC, 64, 2, 100),
            (ATARI[0], 32, 1, 6),
            (ATARI[0], 16, 2, 6),
        ]
    ]
    train = [
        dict(
            devices=2,
            env_id=ATARI[0],
            agent="ppo",
            envs_per_thread=16,
            actor_devices="0",
            learner_devices="1",
            actor_threads=1,
            rollout_len=32,
            updates=6,
        )
    ]
    batches = (32, 128) if quick else (32, 64, 128)
    splits = [("0", "1")] if quick else [("0", "1"), ("0", "1,2"), ("0,1", "2,3")]
    for actor_devices, learner_devices in splits:
        devices = 1 + max(int(i) for i in (actor_devices + "," + learner_devices).split(","))
        train += [
            dict(
                devices=devices,
                env_id=ATARI[0],
                agent="impala",
                envs_per_thread=batch,
                actor_devices=actor_devices,
                learner_devices=learner_devices,
                actor_threads=1,
                rollout_len=20,
                updates=3,
            )
            for batch in batches
        ]
    return raw, actors, train


def cleanba_plan(quick: bool) -> list[dict]:
    """Sebulba beside Cleanba with Cleanba's network (IMPALA ResNet, one torso for policy and value) on
    Breakout-v5, 1 actor thread on device 0, the learner on device 1: IMPALA over the paper's Figure 4b
    actor batches (rollout 20), and PPO at the ``breakout_ppo`` preset's 16 envs and over the same batches
    (rollout 32)."""
    batches = (32, 128) if quick else (32, 64, 128)
    return [dict(agent="impala", envs_per_thread=batch, rollout_len=20) for batch in batches] + [
        dict(agent="ppo", envs_per_thread=batch, rollout_len=32) for batch in (16, *batches)
    ]


def accelerator_plan() -> tuple[list[dict], list[dict], list[dict]]:
    """The measurements on the host's own devices: envpool on every core, the paper's actor batches.

    Acting on device 0, learning on every other device (on device 0 too where it is the only one)."""
    threads = os.cpu_count() or 1
    raw = [
        dict(devices=None, env_id=env_id, num_envs=num_envs, batch_size=batch, threads=threads, seconds=5.0)
        for env_id in ATARI
        for num_envs, batch in [(128, 128), (256, 128)]
    ]
    actors = [dict(devices=None, env_id=ATARI[0], num_envs=128, threads=threads, rollouts=10, learner_devices="auto")]
    train = [
        dict(
            devices=None,
            env_id=ATARI[0],
            agent=agent,
            envs_per_thread=batch,
            actor_devices="0",
            learner_devices="auto",
            actor_threads=2,
            rollout_len=rollout,
            updates=20,
        )
        for agent, batch, rollout in [("ppo", 64, 32), ("impala", 32, 20), ("impala", 128, 20)]
    ]
    return raw, actors, train


def main() -> None:
    parser = bench_process.parser(__doc__)
    parser.add_argument(
        "--cleanba",
        metavar="DIR",
        help="a checkout of vwxyzjn/cleanba: time its PPO and IMPALA "
        "beside Sebulba's at equal network and batch (patched copies go to a temporary directory)",
    )
    parser.add_argument(
        "--cleanba-python",
        metavar="PY",
        default=sys.executable,
        help="the Python that runs Cleanba (jax, flax, optax, rlax, envpool, tyro, rich, tensorboardX)",
    )
    parser.add_argument(
        "--repeats",
        type=bench_process.positive_int,
        default=3,
        help="runs of each raw envpool and actors measurement, alternated (the median is reported)",
    )
    args = parser.parse_args()
    if args.accelerator and not args.worker:
        if args.cleanba:
            parser.error("--cleanba compares on this host's CPU (two simulated devices); run it without --accelerator")
        bench_process.refuse_cpu_only_host(parser)
    if args.worker:
        return bench_process.serve(args.worker, {"raw": _raw, "actors": _actors, "train": _train})
    cleanba_scripts = None
    if args.cleanba:
        from experiments import peer_cleanba

        try:
            cleanba_scripts = peer_cleanba.prepare(args.cleanba, tempfile.mkdtemp(prefix="podracer-cleanba-"))
        except (OSError, ValueError) as error:
            parser.error(f"--cleanba {args.cleanba}: {error}")
    raw_plan, actors_plan, train_plan = accelerator_plan() if args.accelerator else cpu_plan(args.quick)
    raw_rows = measure_medians("raw", raw_plan, args.repeats)
    actor_rows = measure_medians("actors", actors_plan, args.repeats)
    train_rows = [measure("train", **spec) for spec in train_plan]
    peer_rows = []
    for spec in cleanba_plan(args.quick) if cleanba_scripts else []:
        updates = PEER_UPDATES[spec["agent"]]
        ours = measure(
            "train",
            env_id=ATARI[0],
            actor_devices="0",
            learner_devices="1",
            actor_threads=1,
            updates=updates,
            torso="impala_resnet",
            num_minibatches=CLEANBA_MINIBATCHES,
            **spec,
        )
        try:
            theirs = _cleanba(
                cleanba_scripts[f"cleanba_{spec['agent']}.py"], updates=updates, python=args.cleanba_python, **spec
            )
        except RuntimeError as error:  # the table still comes out, saying which Cleanba run failed
            print(error, file=sys.stderr)
            theirs = {"failed": str(error).splitlines()[0]}
        print("BENCH " + json.dumps({"kind": "cleanba", **spec, **theirs}), flush=True)
        peer_rows.append((ours, theirs))
    bench_process.report(report_lines(args.accelerator, raw_rows, actor_rows, train_rows, peer_rows), args.out)


def _learner_busy(row: dict) -> float:
    """The share of a training run's time its learner spent in updates."""
    return row["timings"].get("learner_update", 0) / max(row["train_s"], 1e-9)


def _raw_cpu(raw: dict) -> str:
    if "cpu_us_per_step" not in raw:
        return "-"
    return f"{raw['cpu_us_per_step']:,.1f} ({raw['cpu_us_per_step'] * raw['sps'] / 1e6:.2f} of {raw['cores']})"


def _runs(row: dict) -> str:
    return ", ".join(f"{sps:,.0f}" for sps in row.get("runs", [row["sps"]]))


def _cpu_bound(actors: dict, raw: dict | None) -> str:
    """The share of raw envpool's rate the host's cores allow with each step's inference CPU time added."""
    if not raw or "cpu_us_per_step" not in raw or "inference_cpu_us" not in actors:
        return "-"
    per_step_us = raw["cpu_us_per_step"] + actors["inference_cpu_us"] / actors["num_envs"]
    return f"{min(1.0, raw['cores'] * 1e6 / (per_step_us * raw['sps'])):.0%}"


def report_lines(
    accelerator: bool,
    raw_rows: list[dict],
    actor_rows: list[dict],
    train_rows: list[dict],
    peer_rows: list[tuple[dict, dict]],
) -> list[str]:
    """The markdown section from the measurements' BENCH dicts (``peer_rows``: podracer's and Cleanba's)."""
    raw_by_size = {(r["env_id"], r["num_envs"]): r for r in raw_rows}
    threads = raw_rows[0]["threads"]
    lines = [
        bench_process.heading("Sebulba throughput", accelerator),
        "",
        f"`python experiments/benchmark_sebulba.py{' --accelerator' * accelerator}` on the same machine. "
        "Agent steps/s; frames/s = agent steps x",
        f"frame-skip (4 on Atari). envpool runs {threads} C++ worker threads per batch.",
        "",
        "## Raw envpool, random actions (the host limit)",
        "",
        "This table and the next: each row the median of the runs listed (`--repeats`), the rows' runs alternated.",
        "",
        "| env | envs | batch (async if smaller) | agent steps/s | runs | frames/s | CPU us per agent step (cores busy) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in raw_rows:
        skip = 4 if r["env_id"] in ATARI else 1
        lines.append(
            f"| {r['env_id']} | {r['num_envs']} | {r['batch_size']} | {r['sps']:,.0f} | {_runs(r)} | "
            f"{r['sps'] * skip:,.0f} | "
            f"{_raw_cpu(r)} |"
        )
    lines += [
        "",
        "## Actors alone (inference on device 0, trajectories to the learner device, no learning)",
        "",
        "Sebulba with a learner that learns nothing but still takes every trajectory and publishes parameters",
        "after each update; the first two rollouts (compilation, warm-up) are left out.",
        "",
        "| env | envpool batches x envs | agent steps/s | runs | of raw envpool (as many envs; aim 80%) | "
        "env step / inference / transfer, s | per batch step: wall / env step / inference, us | "
        "inference alone / call floor, us | at most, with raw envpool's and inference's CPU on the same cores |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in actor_rows:
        batches = r.get("env_batches", 2)
        raw = raw_by_size.get((r["env_id"], r["num_envs"] * batches))
        share = f"{r['sps'] / raw['sps']:.0%}" if raw else "-"
        t = r["timings"]
        calls = r["sps"] * r["seconds"] / r["num_envs"]  # inference calls (batch steps) in the timed window
        lines.append(
            f"| {r['env_id']} | {batches} x {r['num_envs']} | {r['sps']:,.0f} | {_runs(r)} | {share} | "
            f"{t.get('env_step', 0):.1f} / {t.get('inference', 0):.1f} / {t.get('transfer', 0):.1f} | "
            f"{r['seconds'] / calls * 1e6:,.0f} / {t.get('env_step', 0) / calls * 1e6:,.0f} / "
            f"{t.get('inference', 0) / calls * 1e6:,.0f} | "
            f"{r.get('inference_alone_us', 0):,.0f} / {r.get('call_floor_us', 0):,.0f} | {_cpu_bound(r, raw)} |"
        )
    lines += [
        "",
        "Where the actors fall short of raw envpool: per batch step, the thread waits for envpool (env step,",
        "which with 2 batches overlaps the other batch's inference) and runs one jitted inference call (the",
        "network, sampling with a key made for the rollout, and JAX's dispatch of the call); the rest of",
        "the wall time is the thread's own Python work per step (buffer copies, send) and the rollout's assembly.",
        "*Inference alone* is the same call timed outside the loop, with no envpool threads beside it (the gap to",
        "the loop's figure is contention for the cores); the *call floor* is a jitted call that takes the same",
        "arguments and computes nothing: JAX's dispatch and the action's fetch, the least a per-step call costs.",
        "*At most*: the share of raw envpool's rate that the host's cores allow when every agent step also takes",
        "its inference's CPU time (measured alone, every thread counted): cores / ((envpool's CPU per step +",
        "inference's) x raw rate), with no more Python work per step than the raw loop's own; where envpool alone",
        "keeps the cores busy, the actors cannot reach the 80% aim on that host, however the loop is arranged.",
    ]
    lines += [
        "",
        "## Full training (the paper's Figure 4b in form: Breakout-v5, rollout 20 for IMPALA)",
        "",
        "| agent | actor devices | learner devices | actor threads | envs per thread | agent steps/s | frames/s | "
        "learner busy | compile s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in train_rows:
        busy = _learner_busy(r)
        lines.append(
            f"| {r['agent']} | {r['actor_devices']} | {r['learner_devices']} | {r['actor_threads']} | "
            f"{r['envs_per_thread']} | {r['sps']:,.1f} | {r['fps']:,.0f} | {busy:.0%} | {r['compile_s']:.1f} |"
        )
    lines += ["", "## Beside Cleanba at equal network and batch", ""]
    if not peer_rows:
        lines.append("Not measured in this run: `--cleanba DIR` (a checkout of vwxyzjn/cleanba) adds this table.")
    else:
        lines += [
            "Both with Cleanba's network (IMPALA ResNet 16-32-32, one torso for policy and value: podracer's",
            "`--torso impala_resnet --shared-torso`), Breakout-v5, one actor thread on CPU device 0, the learner on",
            "device 1, each framework's other settings its own: Cleanba runs every device single-threaded, uses",
            "sticky actions and the full action set; IMPALA takes RMSProp on the summed loss and 4 minibatch steps",
            "per batch in both (podracer's `--optimizer rmsprop --summed-loss --num-minibatches 4`), PPO Adam and",
            "4 epochs x 4 minibatches in both. Cleanba is",
            "patched to run here (`experiments/peer_cleanba.py`). Steady state: updates 3 to "
            f"{PEER_UPDATES['impala']} of each IMPALA run, 3 to {PEER_UPDATES['ppo']} of each PPO run;",
            "compile is podracer's compilation, start-up Cleanba's process start to the end of its first update.",
            "Learner busy: the share of podracer's run its learner spent in updates; where it is near 100% the",
            "learner's gradient steps (XLA:CPU's conv gradients, the same compiler for both) bound the rate.",
            "",
            "| agent | envs x steps | podracer agent steps/s | Cleanba agent steps/s | ratio (aim 1.2x) | "
            "s per update (podracer / Cleanba) | podracer learner busy | podracer compile s | Cleanba start-up s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for ours, theirs in peer_rows:
            shape = f"| {ours['agent']} | {ours['envs_per_thread']} x {ours['rollout_len']} | {ours['sps']:,.1f} |"
            busy = f"{_learner_busy(ours):.0%}"
            if "failed" in theirs:
                lines.append(
                    f"{shape} failed: {theirs['failed']} | - | {ours['update_s']:.1f} / - | {busy} | "
                    f"{ours['compile_s']:.1f} | - |"
                )
                continue
            lines.append(
                f"{shape} {theirs['sps']:,.1f} | {ours['sps'] / theirs['sps']:.2f}x | {ours['update_s']:.1f} / "
                f"{theirs['update_s']:.1f} | {busy} | {ours['compile_s']:.1f} | {theirs['startup_s']:.1f} |"
            )
    return lines


if __name__ == "__main__":
    main()
