"""One Sebulba actor thread: host environments, batched inference on its actor device, trajectories to the learners.

Per step the thread sends the observation batch to its actor device, runs
``Agent.act`` there, returns the actions to envpool and, while envpool steps,
keeps the device-side observation. Every ``rollout_len`` steps it stacks the
trajectory on the actor device, places it on the learner devices split along
the batch axis (one ``jax.device_put`` with the learners' ``NamedSharding``),
waits for the copy to land, and queues it.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import defaultdict
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from envs.host import HostEnv
from podracer.types import Agent, Trajectory
from sebulba.params import ParamsStore, StopRequested


class Rollout(NamedTuple):
    """What an actor thread hands to the learner."""

    trajectory: Trajectory  # [T + 1 | T, B, ...] global arrays on the learner devices
    episode_return: float  # sum of the real returns of the games that ended in it
    episode_length: float  # sum of their lengths (agent steps)
    episodes: int
    params_version: int  # the parameter version it acted with


class Timer:
    """Seconds spent per component by one thread; read by the main thread for reports."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    def time(self, component: str):
        return _Timing(self.seconds, component)


class _Timing:
    def __init__(self, seconds, component):
        self.seconds, self.component = seconds, component

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.seconds[self.component] += time.perf_counter() - self.start
        return False


def put_until_stopped(out: queue.Queue, item: Any, stop: threading.Event) -> None:
    while True:
        if stop.is_set():
            raise StopRequested
        try:
            out.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


class Actor:
    """The state and loop of one actor thread (``run`` is the thread's target)."""

    def __init__(
        self,
        index: int,
        device: jax.Device,
        agent: Agent,
        env: HostEnv,
        store: ParamsStore,
        out: queue.Queue,
        learner_sharding: NamedSharding,
        rollout_len: int,
        reproducible: bool,
        seed: int,
        stop: threading.Event,
    ):
        self.index, self.device, self.agent, self.env = index, device, agent, env
        self.store, self.out, self.learner_sharding = store, out, learner_sharding
        self.rollout_len, self.reproducible, self.stop = rollout_len, reproducible, stop
        self.key = jax.device_put(jax.random.fold_in(jax.random.key(seed), index), device)
        self.timer = Timer()
        self.steps = 0  # agent steps taken, over all of this thread's environments

        def act(params, host_obs, key):
            # host_obs arrives as numpy: passing it to the jitted call is several times cheaper
            # than a separate jax.device_put; it comes back as the device copy the trajectory keeps.
            key, act_key = jax.random.split(key)
            action, extras = agent.act(params, env.to_agent_layout(host_obs), act_key)
            return action, extras, host_obs, key

        def assemble(obs, action, extras, reward, discount, valid):
            return Trajectory(
                env.to_agent_layout(jnp.stack(obs)), jnp.stack(action), reward, discount,
                valid, jax.tree.map(lambda *steps: jnp.stack(steps), *extras),
            )

        self._act = jax.jit(act)
        self._assemble = jax.jit(assemble)

    def _params(self, rollout: int) -> tuple[int, Any]:
        if self.reproducible:  # rollout k acts with exactly the parameters after update k - 1
            version = max(rollout - 1, 0)
            return version, self.store.exactly(version, self.device)
        return self.store.newest(self.device)

    def run(self) -> None:
        try:
            self._loop()
        except StopRequested:
            pass
        finally:
            self.env.close()

    def _loop(self) -> None:
        obs = self.env.reset()
        shape = (self.rollout_len, self.env.num_envs)
        for rollout in itertools.count():
            if self.stop.is_set():
                return
            with self.timer.time("params_wait"):
                version, params = self._params(rollout)
            obs_seq, action_seq, extras_seq = [], [], []
            reward, discount = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
            valid = np.zeros(shape, bool)
            ret = length = count = 0.0
            for t in range(self.rollout_len):
                with self.timer.time("inference"):
                    action, extras, device_obs, self.key = self._act(params, obs, self.key)
                    host_action = np.asarray(action)
                with self.timer.time("env_step"):
                    self.env.send(host_action)
                    obs_seq.append(device_obs)
                    action_seq.append(action)
                    extras_seq.append(extras)
                    step = self.env.recv()
                reward[t], discount[t], valid[t] = step.reward, step.discount, step.valid
                ret += float(step.episode.episode_return.sum())
                length += float(step.episode.episode_length.sum())
                count += int(step.episode.done.sum())
                obs = step.obs
            with self.timer.time("transfer"):
                obs_seq.append(jax.device_put(obs, self.device))
                traj = self._assemble(obs_seq, action_seq, extras_seq, reward, discount, valid)
                traj = jax.device_put(traj, self.learner_sharding)
                jax.block_until_ready(traj)
            self.steps += self.rollout_len * self.env.num_envs
            with self.timer.time("queue_put"):
                put_until_stopped(self.out, Rollout(traj, ret, length, int(count), version), self.stop)
