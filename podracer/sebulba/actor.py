"""One Sebulba actor thread: host environments, batched inference on its actor device, trajectories to the learners.

Per step and envpool batch the thread sends the observations to its actor
device, runs ``Agent.act`` there, and returns the actions to envpool; while
envpool steps that batch, it infers for the next one. Every ``rollout_len``
steps it stacks the trajectory on the actor device, places it on this host's
learner devices split along the batch axis (one ``jax.device_put`` with the
learners' ``NamedSharding``; with several processes, this host's share of the
global batch), waits for the copy to land, and queues it.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding

from podracer.envs.host import EpisodeState, HostEnv, episode_transitions, host_restarts
from podracer.parallel import backends_started, first_local_replica, first_local_shards, put_local_share
from podracer.runlog import Timer
from podracer.sebulba.params import ParamsStore
from podracer.signals import StopRequested
from podracer.types import Agent, Trajectory, reset_core


def prefer_synchronous_cpu_dispatch() -> None:
    """Turns off JAX's asynchronous dispatch on CPU devices, if JAX has not started its backends yet.

    An actor thread waits for every inference call, so on CPU devices asynchronous
    dispatch only adds a thread hand-off to each (measured: ~100 -> ~55 us per
    call). JAX reads the setting when it starts its CPU backend: call this
    before running anything with JAX. Accelerators are not affected.
    """
    if not backends_started():
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    elif jax.config.read("jax_cpu_enable_async_dispatch") and jax.default_backend() == "cpu":
        warnings.warn(
            "JAX started before prefer_synchronous_cpu_dispatch() was called, so CPU inference keeps "
            "asynchronous dispatch (~45 us more per call); call it first for the faster actors",
            stacklevel=2,
        )


class Rollout(NamedTuple):
    """What an actor thread hands to the learner."""

    trajectory: Trajectory  # [T + 1 | T, B, ...] global arrays on the learner devices
    return_sum: float  # summed real returns of the games that ended in it
    length_sum: float  # summed lengths of those games (agent steps)
    episodes: int
    params_version: int  # the parameter version it acted with


def put_until_stopped(out: queue.Queue, item: Any, stop: threading.Event) -> None:
    while True:
        if stop.is_set():
            raise StopRequested
        try:
            out.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


# The actors' random keys: derived (split, fold_in) by threefry as JAX's default keys are, but their random bits
# drawn by XLA's RngBitGenerator, one operation, where threefry is a rolled loop on CPU whose steps each cost a
# kernel launch: an inference call of a 64-64 MLP on 64 CartPole observations took 60 us with threefry keys and
# 31 us with these (2 CPU cores). Its bits may differ between backends and XLA versions; a run is reproducible
# on one machine and version.
ACTOR_KEY_IMPL = "rbg"


class ActorProgram(NamedTuple):
    """The jitted functions of acting (compiled once, shared by all actor threads)."""

    pack: Callable  # the learner's per-device actor params -> the form ``act`` takes them in (published)
    step_keys: Callable  # (key, n) -> (key, [n, ...] data of the next n inference calls' keys)
    # (packed params, host_obs[B], one row of step_keys' data, core[B], restart[B] | None)
    #   -> (action[B], extras, device_obs[B], core[B])
    act: Callable
    initial_core: Callable  # B -> the agent's initial core state (``()`` for a feed-forward agent)
    assemble: Callable  # (episode states, per-batch sequences, outcomes) -> (states, Trajectory, episode sums)


def params_packing(params) -> tuple[Callable, Callable]:
    """``(pack, unpack)`` for actor parameters shaped like ``params``.

    ``pack`` takes the learner's :func:`~podracer.parallel.per_device` tree of them and returns this process's
    first replica in one call: one flat array where every leaf has one dtype. JAX's dispatch of a call costs
    about 2 us per array argument (a 64-64 MLP actor-critic's 12 arrays made a third of an inference call's
    floor on CPU) and more per output; one array is also one transfer per actor device when the learner
    publishes, and one call there holds the GIL from the actor threads for less (reading the replica leaf by
    leaf, then packing it, took 207 us on 2 CPU cores; packed in the same call, 24 us).
    """
    if len({leaf.dtype for leaf in jax.tree.leaves(params)}) != 1:  # ravelling would cast: leave them be
        return first_local_replica, (lambda p: p)
    _, unpack = ravel_pytree(params)
    pack = jax.jit(lambda shards: ravel_pytree(jax.tree.map(lambda x: x[0], shards))[0])
    return (lambda tree: pack(first_local_shards(tree))), unpack


def make_actor_program(agent: Agent, to_agent_layout: Callable, params) -> ActorProgram:
    """The program for ``agent``'s actors; ``params``: actor parameters to take the packing's shapes from."""
    pack, unpack = params_packing(params)

    def act(packed, host_obs, key_data, core, restart):
        # host_obs and key_data arrive as numpy: passing them to the jitted call is several times cheaper
        # than a separate jax.device_put; host_obs comes back as the device copy the trajectory keeps.
        key = jax.random.wrap_key_data(key_data, impl=ACTOR_KEY_IMPL)
        if restart is not None:  # a recurrent agent: fresh cores where the observation begins an episode
            core = reset_core(core, agent.initial_core(restart.shape[0]), restart)
        action, extras, core = agent.act(unpack(packed), to_agent_layout(host_obs), key, core)
        return action, extras, host_obs, core

    def step_keys(key, n: int):
        # A rollout's keys in one call: a split per inference call would be a second random computation in each.
        keys = jax.random.split(key, n + 1)
        return keys[0], jax.random.key_data(keys[1:])

    def assemble_batch(episodes, obs, action, extras, outcomes):
        # On device, once per rollout: envpool's rewards and flags to rewards/discounts/valid, and game scores.
        episodes, (reward, discount, valid, stats) = episode_transitions(episodes, *outcomes)
        traj = Trajectory(
            to_agent_layout(jnp.stack(obs)),
            jnp.stack(action),
            reward,
            discount,
            valid,
            jax.tree.map(lambda *steps: jnp.stack(steps), *extras),
        )
        return episodes, traj, jnp.stack(stats.ended_sums())

    def assemble(episodes, sequences, outcomes):
        outs = [assemble_batch(e, *seq, o) for e, seq, o in zip(episodes, sequences, outcomes)]
        traj = jax.tree.map(lambda *parts: jnp.concatenate(parts, axis=1), *[o[1] for o in outs])
        return [o[0] for o in outs], traj, sum(o[2] for o in outs)

    return ActorProgram(pack, jax.jit(step_keys, static_argnums=1), jax.jit(act), agent.initial_core, jax.jit(assemble))


class ActorShared(NamedTuple):
    """What every actor thread of a run shares."""

    program: ActorProgram
    store: ParamsStore
    learner_sharding: NamedSharding  # where trajectories go, split along the batch axis
    rollout_len: int
    reproducible: bool  # act with exactly the parameters after the previous update (``--sync reproducible``)
    seed: int
    stop: threading.Event
    first_rollout: int = 0  # > 0 when resuming: the update the learner continues from


class Actor:
    """The state and loop of one actor thread (``run`` is the thread's target).

    The thread's environments come as one or more envpool batches stepped in
    turn: while envpool steps one batch, the device runs inference for the next,
    so inference hides behind environment time. The batches' trajectories are
    joined along the batch axis.
    """

    def __init__(
        self, index: int, device: jax.Device, env_batches: Sequence[HostEnv], out: queue.Queue, shared: ActorShared
    ):
        self.index, self.device, self.env_batches, self.out = index, device, list(env_batches), out
        self.program, self.store, self.learner_sharding = shared.program, shared.store, shared.learner_sharding
        self.rollout_len, self.reproducible, self.stop = shared.rollout_len, shared.reproducible, shared.stop
        self.first_rollout = shared.first_rollout
        key = jax.random.fold_in(jax.random.key(shared.seed, impl=ACTOR_KEY_IMPL), index)
        if jax.process_count() > 1:  # every host's actors draw their own actions
            key = jax.random.fold_in(key, jax.process_index())
        if shared.first_rollout:
            key = jax.random.fold_in(key, shared.first_rollout)
        self.key = jax.device_put(key, device)
        self.episodes = [jax.device_put(EpisodeState.initial(env.num_envs), device) for env in self.env_batches]
        self.timer = Timer()
        self.steps = 0  # agent steps taken, over all of this thread's environments

    def _params(self, rollout: int) -> tuple[int, Any]:
        if self.reproducible:  # rollout k acts with exactly the parameters after update k - 1
            version = max(rollout - 1, self.first_rollout)
            return version, self.store.exactly(version, self.device)
        return self.store.newest(self.device)

    def run(self) -> None:
        try:
            self._loop()
        except StopRequested:
            pass
        finally:
            for env in self.env_batches:
                env.close()

    def _loop(self) -> None:
        clock, seconds = time.perf_counter, self.timer.seconds
        envs, act = self.env_batches, self.program.act
        obs = [env.reset() for env in envs]
        # Per batch, the agent's core states (a recurrent agent's memories: kept across rollouts), and on the
        # host where the next observation begins an episode (None for a feed-forward agent: nothing to reset).
        cores = [jax.device_put(self.program.initial_core(env.num_envs), self.device) for env in envs]
        recurrent = bool(jax.tree.leaves(cores))
        ended = [np.zeros(env.num_envs, bool) for env in envs]
        restart = [np.zeros(env.num_envs, bool) if recurrent else None for env in envs]
        outcomes = [  # per batch, envpool's rewards and episode flags of each step, as HostStep orders them
            [np.zeros((self.rollout_len, env.num_envs), dtype) for dtype in (np.float32, np.float32, bool, bool, bool)]
            for env in envs
        ]

        def receive(b: int, t: int) -> None:
            start = clock()
            step = envs[b].recv()
            for buffer, value in zip(outcomes[b], step[1:]):
                buffer[t] = value
            obs[b] = step.obs
            if recurrent:
                restart[b], ended[b] = host_restarts(ended[b], step)
            seconds["env_step"] += clock() - start

        for rollout in itertools.count(self.first_rollout):
            if self.stop.is_set():
                return
            with self.timer.time("params_wait"):
                version, params = self._params(rollout)
            sequences = [([], [], []) for _ in envs]  # per batch: observations, actions, extras
            self.key, keys = self.program.step_keys(self.key, self.rollout_len * len(envs))
            keys = np.asarray(keys)  # [calls, ...]: call t * len(envs) + b acts for batch b at step t
            for t in range(self.rollout_len):
                for b, env in enumerate(envs):
                    if t > 0:
                        receive(b, t - 1)  # batch b finished step t - 1 while the other batches acted
                    start = clock()
                    action, extras, device_obs, cores[b] = act(
                        params, obs[b], keys[t * len(envs) + b], cores[b], restart[b]
                    )
                    host_action = np.asarray(action)
                    seconds["inference"] += clock() - start
                    env.send(host_action)
                    for seq, item in zip(sequences[b], (device_obs, action, extras)):
                        seq.append(item)
            for b in range(len(envs)):
                receive(b, self.rollout_len - 1)
            with self.timer.time("transfer"):
                for b, seq in enumerate(sequences):
                    seq[0].append(jax.device_put(obs[b], self.device))
                self.episodes, traj, sums = self.program.assemble(self.episodes, sequences, outcomes)
                traj = put_local_share(traj, self.learner_sharding)
                jax.block_until_ready(traj)
                return_sum, length_sum, episodes = np.asarray(sums).tolist()
            self.steps += self.rollout_len * sum(env.num_envs for env in envs)
            with self.timer.time("queue_put"):
                rollout_out = Rollout(traj, return_sum, length_sum, int(episodes), version)
                put_until_stopped(self.out, rollout_out, self.stop)
