"""Runs a Sebulba experiment: actor threads on actor devices, the learner on the learner mesh.

The main thread is the learner: it takes one trajectory from every actor
thread (in thread order), runs ``Agent.learn`` data-parallel over the learner
devices, and publishes the new parameters to the actor devices.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import queue
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from podracer import evaluation
from podracer.agents import make_agent
from podracer.checkpoint import latest_update, settings_fingerprint
from podracer.config import check_knobs
from podracer.driver import Program, RunOptions, RunResult, StepStats, drive
from podracer.envs.host import HostEnv, HostEnvConfig
from podracer.parallel import (
    TRAJECTORY_SPEC,
    data_parallel_learn,
    device_mesh,
    fetch_replicated,
    first_local_replica,
    per_device,
)
from podracer.runlog import Timer, resident_memory_mb
from podracer.sebulba.actor import Actor, ActorShared, Rollout, make_actor_program
from podracer.sebulba.config import (
    SebulbaConfig,
    SebulbaGeometry,
    default_env_threads,
    geometry,
    resolve_env_batches,
    topology,
)
from podracer.sebulba.evaluate import SebulbaEvaluator
from podracer.sebulba.lifecycle import ThreadGroup
from podracer.sebulba.params import ParamsStore
from podracer.signals import StopRequested
from podracer.types import Agent, BatchShape, EnvSpec, Trajectory

COMPONENTS = ("env_step", "inference", "transfer", "queue_put", "params_wait")  # actor threads
LEARNER_COMPONENTS = ("learner_wait", "learner_update", "params_publish")


SebulbaResult = RunResult  # state: the learner state, one copy per learner device (podracer.parallel.per_device)


def trajectory_shapes(agent: Agent, spec: EnvSpec, params, geo: SebulbaGeometry, sharding) -> Trajectory:
    """The abstract shape of one actor thread's trajectory, for compiling the learner before any env runs."""
    t, b = geo.rollout_len, geo.envs_per_thread * geo.processes  # every host's share together
    obs = jax.ShapeDtypeStruct((b, *spec.observation.shape), spec.observation.dtype)
    action, extras, _ = jax.eval_shape(agent.act, params, obs, jax.random.key(0), agent.initial_core(b))

    def over_time(x, length=t):
        return jax.ShapeDtypeStruct((length, *x.shape), x.dtype, sharding=sharding)

    step = jax.ShapeDtypeStruct((b,), jnp.float32)
    return Trajectory(
        obs=over_time(obs, t + 1),
        action=over_time(action),
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
    lines = [f"time per component over {wall:.1f}s of training (actor rows: the mean of {threads} actor thread(s)):"]
    for name in COMPONENTS + LEARNER_COMPONENTS:
        seconds = timings.get(name, 0.0)
        lines.append(f"  {name:15s} {seconds:8.2f}s  {100 * seconds / max(wall, 1e-9):5.1f}% of the thread's time")
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
    **options,
) -> RunResult:
    """Trains ``agent_name`` on the envpool environment ``env_id`` with Sebulba; see ``podracer sebulba --help``.

    ``options`` are :class:`podracer.driver.RunOptions`' fields: ``run_dir``,
    ``quiet``, ``checkpoint`` (a :class:`CheckpointConfig`), ``resume`` and
    ``evaluation`` (an :class:`EvalConfig`, run in a thread of its own).
    """
    agent = make_agent(agent_name, agent_config, env_spec(env_id, env_config), batch_shape(config))
    about = {"agent": agent_name, "agent_config": dataclasses.asdict(agent_config)}
    return train_agent(agent, env_id, config, env_config, about, **options)


def train_agent(
    agent: Agent,
    env_id: str,
    config: SebulbaConfig,
    env_config: HostEnvConfig = HostEnvConfig(),
    about: dict | None = None,
    **options,
) -> RunResult:
    """Runs any :class:`Agent` built for :func:`env_spec` and :func:`batch_shape` on envpool's ``env_id``.

    ``about`` (e.g. the agent's name and config) goes into ``config.json`` and
    the checkpoints' fingerprint; ``options`` as for :func:`train`. Checkpoints
    (as for Anakin) hold the learner state and counters; with ``resume`` the run
    continues from the newest one. envpool's environments cannot be saved: a
    resumed run starts fresh episodes (with seeds shifted by the resumed update)
    and fresh actor keys.
    """
    options = RunOptions(**options)
    if options.resume and options.run_dir is None:
        raise ValueError("resuming needs the run directory that holds the checkpoints")
    check_knobs(env_config)
    evaluation.check(options.evaluation)
    topo = topology(config)
    config = resolve_env_batches(config, env_id, topo)
    geo = geometry(config, topo)
    first_update = (latest_update(options.run_dir) or 0) if options.resume else 0
    host_envs = _host_envs(env_id, config, env_config, geo, first_update)
    try:
        sebulba = _Sebulba(agent, {**(about or {}), "env": env_id}, config, env_config, topo, geo, host_envs)
        return drive(sebulba.program(), options)
    finally:
        for batches in host_envs:
            for env in batches:
                env.close()


def _host_envs(env_id, config: SebulbaConfig, env_config: HostEnvConfig, geo: SebulbaGeometry, first_update: int):
    """Per actor thread, its envpool batches; every environment of every host and resumed segment has its own seed."""
    env_threads = env_config.env_threads or default_env_threads(geo.actor_threads)
    per_batch = geo.envs_per_thread // geo.env_batches
    seed = config.seed + (first_update * geo.processes + jax.process_index()) * geo.actor_threads * geo.envs_per_thread
    return [
        [
            HostEnv(env_id, per_batch, seed + (i * geo.env_batches + b) * per_batch, env_config, env_threads)
            for b in range(geo.env_batches)
        ]
        for i in range(geo.actor_threads)
    ]


def sebulba_fingerprint(about: dict, config: SebulbaConfig, env_config: HostEnvConfig, num_learners: int) -> dict:
    """What decides a Sebulba run's numbers (see :func:`podracer.checkpoint.settings_fingerprint`)."""
    return settings_fingerprint(
        {
            **about,
            "sebulba": dataclasses.asdict(config),
            "host_env": dataclasses.asdict(env_config),
            "num_learners": num_learners,
        }
    )


def _step_stats(metrics: dict, rollouts: list[Rollout], update: int) -> StepStats:
    """One update's :class:`StepStats` (a single seed) from its metrics and the rollouts it learnt from."""
    one = lambda value: np.array([value], np.float64)  # noqa: E731
    return StepStats(
        metrics={key: one(value) for key, value in metrics.items()},
        return_sum=one(sum(r.return_sum for r in rollouts)),
        length_sum=one(sum(r.length_sum for r in rollouts)),
        episodes=one(sum(r.episodes for r in rollouts)),
        first_nonfinite=np.array([-1 if np.isfinite(metrics["loss"]) else 0]),
        # how many updates the acting parameters were behind the learner's
        extras={
            "policy_lag_sum": one(sum(update - r.params_version for r in rollouts)),
            "rollouts": one(len(rollouts)),
        },
    )


class _Sebulba:
    """The learner side of a run: the main thread takes one trajectory from every actor thread (in thread
    order), runs ``Agent.learn`` data-parallel over the learner devices and publishes the new parameters."""

    def __init__(
        self,
        agent: Agent,
        about: dict,
        config: SebulbaConfig,
        env_config: HostEnvConfig,
        topo,
        geo: SebulbaGeometry,
        host_envs,
    ):
        self.agent, self.about, self.config, self.env_config = agent, about, config, env_config
        self.topo, self.geo, self.host_envs = topo, geo, host_envs
        self.spec, self.frame_skip = host_envs[0][0].spec, host_envs[0][0].frame_skip
        self.mesh = device_mesh(topo.global_learner_devices)
        self.split = NamedSharding(self.mesh, TRAJECTORY_SPEC)
        self.key = jax.random.key(config.seed)
        self.stop = threading.Event()
        self.threads = ThreadGroup(self.stop)
        self.store = ParamsStore(topo.actor_devices, self.stop)
        self.queues = [queue.Queue(maxsize=config.queue_size) for _ in host_envs]
        self.timer = Timer()
        self.actors: list[Actor] = []
        self.actor_program = None  # made with the first parameters (``running``)
        self.evaluator: SebulbaEvaluator | None = None

    def program(self) -> Program:
        geo, config, topo = self.geo, self.config, self.topo
        banner = (
            f"sebulba: {self.about.get('agent', 'agent')} on {self.about['env']}, actors on {len(topo.actor_devices)} "
            f"device(s) x {config.actor_threads} thread(s) x {geo.envs_per_thread} envs in {geo.env_batches} envpool "
            f"batch(es), learner on {geo.num_learners} device(s)"
            + (f" x {geo.processes} processes, " if geo.processes > 1 else ", ")
            + f"{geo.steps_per_update:,} agent steps ({geo.steps_per_update * self.frame_skip:,} frames) per update, "
            f"{geo.num_updates} updates, {config.sync} mode"
        )
        run_config = {
            "architecture": "sebulba",
            **self.about,
            "sebulba": dataclasses.asdict(config),
            "host_env": dataclasses.asdict(self.env_config),
            "geometry": geo._asdict(),
            "actor_devices": [str(d) for d in topo.actor_devices],
            "learner_devices": [str(d) for d in topo.learner_devices],
            "processes": geo.processes,
            "frame_skip": self.frame_skip,
            "jax_version": jax.__version__,
        }
        return Program(
            banner=banner,
            config=run_config,
            fingerprint=sebulba_fingerprint(self.about, config, self.env_config, geo.num_learners * geo.processes),
            num_updates=geo.num_updates,
            updates_per_window=geo.updates_per_log,
            updates_per_step=1,
            steps_per_update=geo.steps_per_update,
            frame_skip=self.frame_skip,
            seed=config.seed,
            num_seeds=1,
            init=self.init,
            compile=self.compile,
            running=self.running,
            describe=self.describe,
            report=self.report,
            interrupt=self.stop,
            make_evaluator=self.make_evaluator,
        )

    def make_evaluator(self, eval_config) -> SebulbaEvaluator | None:
        """The evaluation thread's evaluator, on the first actor device (only process 0 logs, so only it evaluates)."""
        if jax.process_index() == 0:
            self.evaluator = SebulbaEvaluator(
                self.agent,
                self.about["env"],
                self.env_config,
                eval_config,
                self.topo.actor_devices[0],
                self.config.seed,
                self.geo.steps_per_update,
                self.host_envs[0][0].to_agent_layout,
                self.stop,
            )
        return self.evaluator

    def init(self):
        return per_device(self.agent.init(jax.random.fold_in(self.key, 0)), self.mesh)

    def compile(self, state):
        params = first_local_replica(self.agent.actor_params(state))
        shapes = trajectory_shapes(self.agent, self.spec, params, self.geo, self.split)
        learn = data_parallel_learn(self.agent.learn, self.mesh)
        return functools.partial(
            self._step, learn.lower(state, (shapes,) * self.geo.actor_threads, jax.random.key(0)).compile()
        )

    def _step(self, learn, state, update: int, n: int):
        with self.timer.time("learner_wait"):
            rollouts = [_get_until_stopped(q, self.stop, self.threads) for q in self.queues]
        with self.timer.time("learner_update"):
            trajectories = tuple(r.trajectory for r in rollouts)
            state, metrics = learn(state, trajectories, jax.random.fold_in(self.key, update + 1))
            metrics = fetch_replicated(metrics)
        with self.timer.time("params_publish"):
            self.publish(update + 1, state)
        return state, _step_stats(metrics, rollouts, update)

    def publish(self, version: int, state) -> None:
        """Hands the actors the parameters of ``state`` as version ``version`` (packed as they take them)."""
        self.store.publish(version, self.actor_program.pack(self.agent.actor_params(state)))

    @contextlib.contextmanager
    def running(self, state, first_update: int):
        """The actor threads, acting from the parameters of ``state`` on; joined on exit, failures re-raised."""
        self.actor_program = make_actor_program(
            self.agent, self.host_envs[0][0].to_agent_layout, first_local_replica(self.agent.actor_params(state))
        )
        self.publish(first_update, state)
        config = self.config
        shared = ActorShared(
            self.actor_program,
            self.store,
            self.split,
            self.geo.rollout_len,
            config.sync == "reproducible",
            config.seed,
            self.stop,
            first_update,
        )
        self.actors = [
            Actor(i, self.topo.actor_devices[i // config.actor_threads], batches, self.queues[i], shared)
            for i, batches in enumerate(self.host_envs)
        ]
        for actor in self.actors:
            self.threads.start(f"actor thread {actor.index} (device {actor.device})", actor.run)
        if self.evaluator is not None:
            self.threads.start("evaluation thread", self.evaluator.run)
        try:
            yield
        finally:
            stuck = self.threads.join()
            if stuck:
                raise RuntimeError(f"threads did not stop: {stuck}")
        self.threads.raise_failure()

    def timings(self) -> dict[str, float]:
        """Seconds per component so far: the learner's, and the mean over actor threads of theirs."""
        actor_means = {
            name: sum(a.timer.seconds.get(name, 0.0) for a in self.actors) / len(self.actors) for name in COMPONENTS
        }
        return {**self.timer.seconds, **actor_means}

    def describe(self, window: StepStats, record: dict) -> dict:
        return {
            "frames": record["env_steps"] * self.frame_skip,
            "fps": record["sps"] * self.frame_skip,
            "policy_lag": float(window.extras["policy_lag_sum"][0] / window.extras["rollouts"][0]),
            "rss_mb": resident_memory_mb(),
            **{f"time_{name}": seconds for name, seconds in self.timings().items()},
        }

    def report(self, seconds: float) -> tuple[dict, str]:
        timings = self.timings()
        return timings, _timing_report(timings, seconds, self.geo.actor_threads)
