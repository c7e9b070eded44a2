"""The Anakin program: acting, environment steps and learning in one compiled call.

Inside each device (a ``shard_map`` shard of the mesh), ``vmap`` runs the
independent seeds and, within each seed, the update lanes (axis
:data:`podracer.parallel.LANE_AXIS`). Each lane steps its own batch of
environments with a ``lax.scan`` rollout and calls ``Agent.learn``, which
averages gradients over lanes and devices. One call runs a ``fori_loop`` of
many updates (or exactly one, where a device loop is slow: see
:func:`podracer.anakin.config.loop_on_device`) and returns only a handful of
accumulated scalars to the host.

Every leaf of the global :class:`RunnerState` is laid out
``[devices, seeds, lanes, ...]`` and sharded over the device axis.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from podracer.anakin.config import AnakinGeometry
from podracer.anakin.pbt import PBT, initial_population, pbt_settings, population_step
from podracer.anakin.sweep import Sweep
from podracer.driver import StepStats
from podracer.parallel import (
    DEVICE_AXIS,
    LANE_AXIS,
    device_mesh,
    replica_count,
    shard_map,
    sum_over_replicas,
    vmap_unless_single,
)
from podracer.types import Agent, Trajectory, episode_restarts, reset_core


class RunnerState(NamedTuple):
    """Everything one lane carries from update to update."""

    learner: Any  # the agent's LearnerState (identical on every lane and device)
    env_state: Any  # [B, ...] auto-reset environment states
    obs: Any  # [B, ...] observations to act on next
    core: Any  # [B, ...] the agent's core state to act on them with (a recurrent policy's memory; else ())
    act_key: jax.Array  # this lane's own key for acting
    learn_key: jax.Array  # shared by every lane and device of a seed
    hparams: dict  # {name: f32 scalar}: this agent's values of the --sweep settings ({} without a sweep)
    population: Any  # the agent's PBT bookkeeping (a :class:`podracer.anakin.pbt.Population` of scalars; else ())


class Anakin(NamedTuple):
    init: Callable[[int], RunnerState]  # seed -> global RunnerState
    # (state, num updates) -> (state, per-seed sums over the updates); with loop_on_device False, exactly one.
    run: Callable[[RunnerState, jax.Array], tuple[RunnerState, StepStats]]
    geometry: AnakinGeometry
    mesh: Mesh
    loop_on_device: bool


def anakin_mesh(devices, lanes: int) -> Mesh:
    """The mesh for ``lanes`` lanes per device: with one lane, a trivial mesh axis binds its name."""
    return device_mesh(devices, lane_axis=lanes == 1)


def rollout(agent: Agent, env, rollout_len: int, params, env_state, obs, core, key):
    """``rollout_len`` steps of acting and stepping the ``[B]`` environments; returns the environment state,
    observations and core state to go on from, the :class:`Trajectory` (``obs [T + 1, B, ...]``) and the ``[T,
    B]`` episode statistics. The core goes back to the initial one where an episode restarts."""
    initial = agent.initial_core(jax.tree.leaves(obs)[0].shape[0])

    def step(carry, step_key):
        env_state, obs, core = carry
        action, extras, core = agent.act(params, obs, step_key, core)
        env_state, ts = env.step_batch(env_state, action)
        core = reset_core(core, initial, episode_restarts(ts.valid, ts.discount))
        return (env_state, ts.obs, core), (obs, action, ts.reward, ts.discount, ts.valid, extras, ts.episode)

    carry = (env_state, obs, core)
    (env_state, last_obs, core), steps = jax.lax.scan(step, carry, jax.random.split(key, rollout_len))
    obs_seq, action, reward, discount, valid, extras, episodes = steps
    all_obs = jax.tree.map(lambda seq, last: jnp.concatenate([seq, last[None]]), obs_seq, last_obs)
    return env_state, last_obs, core, Trajectory(all_obs, action, reward, discount, valid, extras), episodes


def _lane_update(agent_with: Callable[[dict], Agent], env, rollout_len: int, runner: RunnerState):
    """One update of one lane: a rollout, then ``Agent.learn``; metrics and episode sums over every replica.
    ``agent_with(runner.hparams)`` is the lane's agent (its own settings where they are swept)."""
    agent = agent_with(runner.hparams)
    act_key, rollout_key = jax.random.split(runner.act_key)
    learn_key, update_key = jax.random.split(runner.learn_key)
    params = agent.actor_params(runner.learner)
    env_state, obs, core, traj, episodes = rollout(
        agent, env, rollout_len, params, runner.env_state, runner.obs, runner.core, rollout_key
    )
    learner, metrics = agent.learn(runner.learner, traj, update_key)
    runner = runner._replace(
        learner=learner, env_state=env_state, obs=obs, core=core, act_key=act_key, learn_key=learn_key
    )
    # One collective for both: between processes on CPU each is a gloo round trip.
    metric_sums, episode_sums = sum_over_replicas((metrics, episodes.ended_sums()))
    return runner, jax.tree.map(lambda m: m / replica_count(), metric_sums), episode_sums


def _lane_init(
    agent: Agent, env, lanes: int, num_envs: int, learner, seed_keys: jax.Array, hparams: dict, population, lane
) -> RunnerState:
    """A lane's first state around the agent's ``learner``, from its seed's ``[4]`` keys (learner, environments,
    acting, learning): every environment of every replica gets its own key."""
    _, env_key, act_key, learn_key = seed_keys
    replica = jax.lax.axis_index(DEVICE_AXIS) * lanes + lane
    env_ids = replica * num_envs + jnp.arange(num_envs)
    env_keys = jax.vmap(lambda i: jax.random.fold_in(env_key, i))(env_ids)
    env_state, obs = jax.vmap(env.reset)(env_keys)
    core = agent.initial_core(num_envs)
    act_key = jax.random.fold_in(act_key, replica)
    return RunnerState(learner, env_state, obs, core, act_key, learn_key, hparams, population)


def _init_learners(agent_with: Callable[[dict], Agent], learner_keys: jax.Array, hparams: dict):
    """Each agent's ``LearnerState`` (leaves ``[agents, ...]``) from its key and settings, one after another.

    Not ``vmap``: batched orthogonal initialisation is a batched QR, whose LAPACK
    kernel on XLA:CPU (jaxlib 0.10) splits the batch over the same thread pool
    that runs it and can wait forever when two such kernels hold every thread.
    """
    return jax.lax.map(
        lambda key_and_hparams: agent_with(key_and_hparams[1]).init(key_and_hparams[0]), (learner_keys, hparams)
    )


def _add_update(stats: StepStats, i, metrics, sums) -> StepStats:
    """``stats`` with update ``i``'s per-seed metrics and episode sums added (and its loss checked)."""
    ret, length, count = sums
    first = jnp.where((stats.first_nonfinite < 0) & ~jnp.isfinite(metrics["loss"]), i, stats.first_nonfinite)
    return StepStats(
        jax.tree.map(jnp.add, stats.metrics, metrics),
        stats.return_sum + ret,
        stats.length_sum + length,
        stats.episodes + count,
        first,
        {},
    )


def _population_step(pbt: PBT, state: RunnerState, sums) -> RunnerState:
    """:func:`podracer.anakin.pbt.population_step` on a device's ``[agents, lanes, ...]`` state (every lane holds
    the same learner, settings and population)."""
    lane_0 = lambda tree: jax.tree.map(lambda x: x[:, 0], tree)  # noqa: E731
    returns, _, episodes = sums
    learner, hparams, population = population_step(
        pbt, state.learner, lane_0(state.hparams), lane_0(state.population), returns, episodes
    )
    every_lane = lambda new, old: jax.tree.map(lambda n, o: jnp.broadcast_to(n[:, None], o.shape), new, old)  # noqa: E731
    return state._replace(
        learner=learner,
        hparams=every_lane(hparams, state.hparams),
        population=every_lane(population, state.population),
    )


def make_anakin(
    agent: Agent,
    env,
    geometry: AnakinGeometry,
    mesh: Mesh,
    loop_on_device: bool = True,
    sweep: Sweep | None = None,
    pbt_factor: float = 1.25,
    pbt_seed: int = 0,
) -> Anakin:
    """Builds the Anakin program for ``agent`` on the auto-resetting jittable ``env``.

    ``mesh`` comes from :func:`anakin_mesh` for ``geometry.lanes``; see
    :func:`podracer.anakin.config.loop_on_device` for ``loop_on_device``. With a
    ``sweep`` of ``geometry.members`` settings, each member's agents learn with its own; with
    ``geometry.pbt_updates``, they are a population (:mod:`podracer.anakin.pbt`) whose settings change by
    ``pbt_factor``, drawn from ``pbt_seed``.
    """
    lanes, seeds = geometry.lanes, geometry.agents
    pbt = pbt_settings(geometry, sweep, pbt_factor, pbt_seed) if geometry.pbt_updates else None
    agent_with = sweep.agent_with if sweep else lambda hparams: agent
    hparams = sweep.values(geometry.num_seeds) if sweep else {}  # {name: [agents]}
    lane_update = functools.partial(_lane_update, agent_with, env, geometry.rollout_len)
    lane_init = functools.partial(_lane_init, agent, env, lanes, geometry.envs_per_lane)
    # [seeds, lanes] inside a device; lanes are a named axis for the agent's gradient averaging.
    device_update = vmap_unless_single(vmap_unless_single(lane_update, lanes, LANE_AXIS), seeds)

    def device_init(seed_keys):
        keys = jax.vmap(lambda key: jax.random.split(key, 4))(seed_keys)  # [agents, 4]
        lanes_of_seed = jax.vmap(lane_init, in_axes=(None, None, None, None, 0))  # the agent's learner: every lane's
        per_seed = jax.vmap(lambda learner, keys, h, p: lanes_of_seed(learner, keys, h, p, jnp.arange(lanes)))
        learners = _init_learners(agent_with, keys[:, 0], hparams)
        population = initial_population(seeds) if pbt else ()
        return jax.tree.map(lambda x: x[None], per_seed(learners, keys, hparams, population))

    def device_run(state: RunnerState, num_updates):
        state = jax.tree.map(lambda x: x[0], state)

        def body(i, carry):
            state, stats = carry
            state, metrics, sums = device_update(state)
            metrics, sums = jax.tree.map(lambda x: x[:, 0], (metrics, sums))
            if pbt:
                state = _population_step(pbt, state, sums)
            return state, _add_update(stats, i, metrics, sums)

        zeros = jnp.zeros(seeds, jnp.float32)
        metric_shapes = jax.eval_shape(lambda s: device_update(s)[1], state)
        metrics = jax.tree.map(lambda m: jnp.zeros(m.shape[:1], m.dtype), metric_shapes)
        stats = StepStats(metrics, zeros, zeros, zeros, jnp.full(seeds, -1, jnp.int32), {})
        if loop_on_device:
            state, stats = jax.lax.fori_loop(0, num_updates, body, (state, stats))
        else:
            state, stats = body(0, (state, stats))
        return jax.tree.map(lambda x: x[None], state), stats

    @jax.jit
    def init(seed):  # a sweep's members share the seeds: agent i has seed seed + i % seeds per member
        seed_keys = jax.vmap(jax.random.key)(seed + jnp.arange(seeds) % geometry.num_seeds)
        return shard_map(device_init, mesh, in_specs=P(), out_specs=P(DEVICE_AXIS))(seed_keys)

    run = jax.jit(
        shard_map(device_run, mesh, in_specs=(P(DEVICE_AXIS), P()), out_specs=(P(DEVICE_AXIS), P())),
        donate_argnums=0,
    )
    return Anakin(init=init, run=run, geometry=geometry, mesh=mesh, loop_on_device=loop_on_device)
