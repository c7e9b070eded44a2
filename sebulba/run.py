"""Runs a Sebulba experiment: actor threads on actor devices, the learner on the learner mesh.

The main thread is the learner: it takes one trajectory from every actor
thread (in thread order), runs ``Agent.learn`` data-parallel over the learner
devices, and publishes the new parameters to the actor devices.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from agents import make_agent
from envs.host import HostEnv, HostEnvConfig
from podracer.checkpoint import CheckpointConfig, Checkpointer, latest_update, restore
from podracer.checkpoint import fingerprint as settings_fingerprint
from podracer.distributed import any_process
from podracer.errors import NonFiniteLossError
from podracer.parallel import (
    TRAJECTORY_SPEC,
    data_parallel_learn,
    device_mesh,
    fetch_replicated,
    first_local_replica,
    per_device,
)
from podracer.runlog import RunLog, Stopwatch, resident_memory_mb
from podracer.signals import stop_on_signals
from podracer.types import Agent, BatchShape, EnvSpec, Trajectory
from sebulba.actor import Actor, Rollout, Timer, make_actor_program
from sebulba.config import Geometry, SebulbaConfig, default_env_threads, geometry, topology
from sebulba.lifecycle import ThreadGroup
from sebulba.params import ParamsStore, StopRequested

COMPONENTS = ("env_step", "inference", "transfer", "queue_put", "params_wait")  # actor threads
LEARNER_COMPONENTS = ("learner_wait", "learner_update", "params_publish")


class SebulbaResult(NamedTuple):
    state: object  # the final learner state, one copy per learner device (podracer.parallel.per_device)
    records: list[dict]
    compile_seconds: float
    train_seconds: float  # the learner loop's wall time
    env_steps: int  # agent steps learnt from
    frames: int  # env_steps x frame-skip
    timings: dict[str, float]  # seconds per component, actor ones summed over threads
    stopped_by: str | None  # "SIGTERM" / "SIGINT" when a signal ended the run early


def trajectory_shapes(agent: Agent, spec: EnvSpec, params, geo: Geometry, sharding) -> Trajectory:
    """The abstract shape of one actor thread's trajectory, for compiling the learner before any env runs."""
    t, b = geo.rollout_len, geo.envs_per_thread * geo.processes  # every host's share together
    obs = jax.ShapeDtypeStruct((b, *spec.observation.shape), spec.observation.dtype)
    _, extras = jax.eval_shape(agent.act, params, obs, jax.random.key(0))

    def over_time(x, length=t):
        return jax.ShapeDtypeStruct((length, *x.shape), x.dtype, sharding=sharding)

    step = jax.ShapeDtypeStruct((b,), jnp.float32)
    return Trajectory(
        obs=over_time(obs, t + 1),
        action=over_time(jax.ShapeDtypeStruct((b,), jnp.int32)),
        reward=over_time(step),
        discount=over_time(step),
        valid=over_time(jax.ShapeDtypeStruct((b,), jnp.bool_)),
        extras=jax.tree.map(over_time, extras),
    )


def _get_until_stopped(source: queue.Queue, stop: threading.Event, threads: ThreadGroup) -> Rollout:
    while True:
        threads.raise_failure()
        if stop.is_set():
            raise StopRequested
        try:
            return source.get(timeout=0.1)
        except queue.Empty:
            continue


def _timing_report(timings: dict[str, float], wall: float, threads: int) -> str:
    lines = [f"time per component over {wall:.1f}s of training ({threads} actor thread(s); actor rows sum all threads):"]
    for name in COMPONENTS + LEARNER_COMPONENTS:
        seconds = timings.get(name, 0.0)
        per_thread = seconds / threads if name in COMPONENTS else seconds
        lines.append(f"  {name:15s} {seconds:8.2f}s  {100 * per_thread / max(wall, 1e-9):5.1f}% of each thread's time")
    return "\n".join(lines)


def env_spec(env_id: str, env_config: HostEnvConfig = HostEnvConfig()) -> EnvSpec:
    """The observation and action spec of envpool's ``env_id`` as Sebulba's agents see it."""
    env = HostEnv(env_id, 1, 0, env_config)
    try:
        return env.spec
    finally:
        env.close()


def batch_shape(config: SebulbaConfig) -> BatchShape:
    """What every learner call of a run with ``config`` sees on each learner device (checks the batch)."""
    geo = geometry(config, topology(config))
    return BatchShape(geo.num_updates, geo.rollout_len, geo.envs_per_learner)


def train(
    agent_name: str,
    agent_config,
    env_id: str,
    config: SebulbaConfig,
    env_config: HostEnvConfig = HostEnvConfig(),
    run_dir: str | None = None,
    quiet: bool = False,
    checkpoint: CheckpointConfig = CheckpointConfig(),
    resume: bool = False,
) -> SebulbaResult:
    """Trains ``agent_name`` on the envpool environment ``env_id`` with Sebulba; see ``podracer sebulba --help``."""
    agent = make_agent(agent_name, agent_config, env_spec(env_id, env_config), batch_shape(config))
    about = {"agent": agent_name, "agent_config": dataclasses.asdict(agent_config)}
    return train_agent(agent, env_id, config, env_config, run_dir, quiet, about, checkpoint, resume)


def train_agent(
    agent: Agent,
    env_id: str,
    config: SebulbaConfig,
    env_config: HostEnvConfig = HostEnvConfig(),
    run_dir: str | None = None,
    quiet: bool = False,
    about: dict | None = None,
    checkpoint: CheckpointConfig = CheckpointConfig(),
    resume: bool = False,
) -> SebulbaResult:
    """Runs any :class:`Agent` built for :func:`env_spec` and :func:`batch_shape` on envpool's ``env_id``.

    ``about`` (e.g. the agent's name and config) goes into ``config.json`` and
    the checkpoints' fingerprint. Checkpoints (as for Anakin) hold the learner
    state and counters; with ``resume`` the run in ``run_dir`` continues from
    its newest one. envpool's environments cannot be saved: a resumed run starts
    fresh episodes (with seeds shifted by the resumed update) and fresh actor keys.
    """
    if resume and run_dir is None:
        raise ValueError("resuming needs the run directory that holds the checkpoints")
    topo = topology(config)
    geo = geometry(config, topo)
    first_update = (latest_update(run_dir) or 0) if resume else 0
    env_threads = env_config.env_threads or default_env_threads(geo.actor_threads)
    per_batch = geo.envs_per_thread // geo.env_batches
    # every environment of every host and every resumed segment has its own seed
    seed = config.seed + (first_update * geo.processes + jax.process_index()) * geo.actor_threads * geo.envs_per_thread
    host_envs = [  # per actor thread, its envpool batches; every environment has its own seed
        [
            HostEnv(env_id, per_batch, seed + (i * geo.env_batches + b) * per_batch, env_config, env_threads)
            for b in range(geo.env_batches)
        ]
        for i in range(geo.actor_threads)
    ]
    about = {**(about or {}), "env": env_id}
    try:
        return _train(agent, about, config, env_config, run_dir, quiet, topo, geo, host_envs, checkpoint, resume)
    finally:
        for batches in host_envs:
            for env in batches:
                env.close()


def fingerprint(about: dict, config: SebulbaConfig, env_config: HostEnvConfig, num_learners: int) -> dict:
    """What decides a Sebulba run's numbers (see :func:`podracer.checkpoint.fingerprint`)."""
    return settings_fingerprint({
        **about, "sebulba": dataclasses.asdict(config), "host_env": dataclasses.asdict(env_config),
        "num_learners": num_learners,
    })


def _train(agent, about, config, env_config, run_dir, quiet, topo, geo, host_envs, checkpoint, resume):
    spec, frame_skip = host_envs[0][0].spec, host_envs[0][0].frame_skip
    mesh = device_mesh(topo.global_learner_devices)
    split = NamedSharding(mesh, TRAJECTORY_SPEC)
    key = jax.random.key(config.seed)
    state = per_device(agent.init(jax.random.fold_in(key, 0)), mesh)
    run_fingerprint = fingerprint(about, config, env_config, geo.num_learners * geo.processes)
    first_update, clock = 0, Stopwatch()
    if resume:
        state, counters = restore(run_dir, state, run_fingerprint)
        first_update, clock.total = counters["update"], counters["time"]
    resumed_seconds = clock.total
    total_steps = geo.num_updates * geo.steps_per_update
    logging_process = jax.process_index() == 0
    log = RunLog(
        run_dir if logging_process else None,
        {
            "architecture": "sebulba",
            **about,
            "sebulba": dataclasses.asdict(config),
            "host_env": dataclasses.asdict(env_config),
            "geometry": geo._asdict(),
            "actor_devices": [str(d) for d in topo.actor_devices],
            "learner_devices": [str(d) for d in topo.learner_devices],
            "processes": geo.processes,
            "frame_skip": frame_skip,
            "jax_version": jax.__version__,
        },
        total_steps,
        quiet or not logging_process,
        resume_update=first_update if resume else None,
    )
    checkpointer = Checkpointer(run_dir, run_fingerprint, checkpoint, start_update=first_update)
    stop, caught = threading.Event(), []
    # With several processes a signal only asks to stop: the learners agree on the update to stop after.
    requested = stop if geo.processes == 1 else threading.Event()
    threads = ThreadGroup(stop)
    try:
        if resume:
            log.message(f"resumed from the checkpoint at update {first_update} "
                        f"({first_update * geo.steps_per_update:,} agent steps)")
        log.message(
            f"sebulba: {about.get('agent', 'agent')} on {about['env']}, actors on {len(topo.actor_devices)} device(s) x {config.actor_threads} "
            f"thread(s) x {geo.envs_per_thread} envs in {geo.env_batches} envpool batch(es), "
            f"learner on {geo.num_learners} device(s)" + (f" x {geo.processes} processes, " if geo.processes > 1 else ", ") +
            f"{geo.steps_per_update:,} agent steps ({geo.steps_per_update * frame_skip:,} frames) per update, "
            f"{geo.num_updates} updates, {config.sync} mode"
        )
        start = time.perf_counter()
        learn = data_parallel_learn(agent.learn, mesh)
        shapes = trajectory_shapes(agent, spec, first_local_replica(agent.actor_params(state)), geo, split)
        learn = learn.lower(state, (shapes,) * geo.actor_threads, jax.random.key(0)).compile()
        compile_seconds = time.perf_counter() - start
        log.message(f"learner compiled in {compile_seconds:.1f}s")

        store = ParamsStore(topo.actor_devices, stop)
        store.publish(first_update, first_local_replica(agent.actor_params(state)))
        queues = [queue.Queue(maxsize=config.queue_size) for _ in host_envs]
        program = make_actor_program(agent, host_envs[0][0].to_agent_layout)
        actors = [
            Actor(i, topo.actor_devices[i // config.actor_threads], program, batches, store, queues[i], split,
                  geo.rollout_len, config.sync == "reproducible", config.seed, stop, first_update)
            for i, batches in enumerate(host_envs)
        ]
        with stop_on_signals(requested, caught):
            for actor in actors:
                threads.start(f"actor thread {actor.index} (device {actor.device})", actor.run)
            state, done, learner_timer = _learn(learn, agent, state, store, queues, threads, stop, geo, frame_skip,
                                                key, log, actors, clock, first_update, checkpointer, requested)
        threads.raise_failure()
        checkpointer.save(done, state, {"update": done, "time": clock.total})
        done_steps = done * geo.steps_per_update
        # another process may have been the one signalled: every process reports the early stop
        stopped_by = caught[0] if caught else ("SIGTERM" if done < geo.num_updates else None)
        timings = dict(learner_timer.seconds)
        for actor in actors:
            for name, seconds in actor.timer.seconds.items():
                timings[name] = timings.get(name, 0.0) + seconds
        if stopped_by:
            log.message(f"stopped by {stopped_by} after {done_steps:,} agent steps; shutting down cleanly"
                        + (f" (resume with --resume {run_dir})" if run_dir else ""))
        log.message(_timing_report(timings, clock.total - resumed_seconds, geo.actor_threads))
        log.message(
            f"done: {done_steps:,} agent steps ({done_steps * frame_skip:,} frames) in {clock.total:.1f}s: "
            f"{done_steps / max(clock.total, 1e-9):,.0f} steps/s, {done_steps * frame_skip / max(clock.total, 1e-9):,.0f} "
            f"frames/s after a {compile_seconds:.1f}s compile"
        )
        return SebulbaResult(state, log.records, compile_seconds, clock.total, done_steps, done_steps * frame_skip,
                             timings, stopped_by)
    finally:
        stuck = threads.join()
        checkpointer.close()
        log.close()
        if stuck:
            raise RuntimeError(f"threads did not stop: {stuck}")


def _learn(learn, agent, state, store, queues, threads, stop, geo, frame_skip, key, log, actors, clock,
           first_update, checkpointer, requested):
    """The learner loop from ``first_update``; returns ``(state, updates done, timer)``, early when ``stop`` is set."""
    timer = Timer()
    window: list[tuple[int, dict, list[Rollout]]] = []
    window_start = clock.total
    done = first_update
    for update in range(first_update, geo.num_updates):
        if geo.processes > 1 and any_process(requested.is_set()):
            stop.set()
            break
        try:
            with clock, timer.time("learner_wait"):
                rollouts = [_get_until_stopped(q, stop, threads) for q in queues]
        except StopRequested:
            break
        with clock:
            with timer.time("learner_update"):
                trajectories = tuple(r.trajectory for r in rollouts)
                state, metrics = learn(state, trajectories, jax.random.fold_in(key, update + 1))
                metrics = fetch_replicated(metrics)
            with timer.time("params_publish"):
                store.publish(update + 1, first_local_replica(agent.actor_params(state)))
        if not np.isfinite(metrics["loss"]):
            raise NonFiniteLossError(f"the loss became non-finite at update {update + 1}; try a lower --learning-rate")
        done = update + 1
        window.append((update, metrics, rollouts))
        if len(window) < geo.updates_per_log and update + 1 < geo.num_updates and not stop.is_set():
            continue
        _write_window(log, window, geo, frame_skip, clock.total, clock.total - window_start, timer, actors)
        window, window_start = [], clock.total
        if checkpointer.due(done):
            checkpointer.save(done, state, {"update": done, "time": clock.total})
    if window:  # stopped while waiting: log what was learnt, so the metrics reach the checkpoint without a gap
        _write_window(log, window, geo, frame_skip, clock.total, clock.total - window_start, timer, actors)
    return state, done, timer


def _write_window(log, window, geo, frame_skip, total_seconds, seconds, timer, actors) -> None:
    """One record for the updates in ``window`` (``(update, metrics, rollouts)`` each)."""
    done = window[-1][0] + 1
    steps = len(window) * geo.steps_per_update
    flat = [r for _, _, rs in window for r in rs]
    episodes = sum(r.episodes for r in flat)
    record = {
        "update": done,
        "env_steps": done * geo.steps_per_update,
        "frames": done * geo.steps_per_update * frame_skip,
        "time": total_seconds,
        "sps": steps / seconds,
        "fps": steps * frame_skip / seconds,
        "episode_return": sum(r.episode_return for r in flat) / episodes if episodes else None,
        "episode_length": sum(r.episode_length for r in flat) / episodes if episodes else None,
        "episodes": episodes,
        # how many updates the acting parameters were behind the learner's
        "policy_lag": float(np.mean([u - r.params_version for u, _, rs in window for r in rs])),
        "rss_mb": resident_memory_mb(),
        **{k: float(np.mean([m[k] for _, m, _ in window])) for k in window[0][1]},
        **{f"time_{name}": seconds for name, seconds in timer.seconds.items()},
    }
    for name in COMPONENTS:
        record[f"time_{name}"] = sum(a.timer.seconds.get(name, 0.0) for a in actors) / len(actors)
    log.write(record)
