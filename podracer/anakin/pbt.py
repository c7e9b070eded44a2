"""Population-based training inside the Anakin program (``--pbt-interval``; Jaderberg et al. 2017).

The population is the program's agents: a ``--sweep``'s members x seeds, whose
swept settings are the ones PBT changes. Every ``interval`` updates, inside the
compiled loop, the agents are ranked by the mean return of the training
episodes that ended since the last such step; the bottom ``replace`` agents each
take the learner state (parameters, optimiser state, statistics) of one of the
top ``replace`` agents drawn at random (exploit) and that agent's settings, each
multiplied or divided by ``factor`` at random (explore), clipped to the knob's
bounds. Environments, cores and keys stay each agent's own. Every device
computes the same step from the same replica-summed returns and the same key, so
they agree without communicating; the population is part of the runner state,
so a resumed run continues it exactly.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

PBT_STREAM = 0x706274  # folded into the run's seed: PBT's draws never meet training's


class Population(NamedTuple):
    """Each agent's PBT bookkeeping (leaves ``[agents]``)."""

    return_sum: jax.Array  # f32: summed returns of the training episodes that ended since the last step
    episodes: jax.Array  # f32: how many ended
    updates: jax.Array  # i32: updates done since the run began
    parent: jax.Array  # i32: whose learner (as the current log window began) the agent's descends from
    steps: jax.Array  # i32: PBT steps in the current log window


class PBT(NamedTuple):
    """The schedule and the moves (static: they shape the compiled program)."""

    interval: int  # updates between two steps
    replace: int  # agents replaced at each step (and leaders drawn from)
    factor: float  # a copied setting is multiplied or divided by this
    bounds: dict  # {name: (low, high)} (None where unbounded)
    seed: int
    window: int  # updates per log window: the lineage is told per window (it changes nothing that is learnt)


def pbt_settings(geometry, sweep, factor: float, seed: int) -> PBT:
    """The :class:`PBT` of an :class:`~podracer.anakin.config.AnakinGeometry` with ``pbt_updates`` and its
    :class:`~podracer.anakin.sweep.Sweep`."""
    return PBT(geometry.pbt_updates, geometry.pbt_replace, factor, sweep.bounds, seed, geometry.updates_per_call)


def initial_population(agents: int) -> Population:
    zeros, none = jnp.zeros(agents, jnp.float32), jnp.zeros(agents, jnp.int32)
    return Population(zeros, zeros, none, jnp.arange(agents, dtype=jnp.int32), none)


def fitness(population: Population) -> jax.Array:
    """``[agents]`` mean return since the last step; an agent that finished no episode ranks last."""
    mean = population.return_sum / jnp.maximum(population.episodes, 1.0)
    return jnp.where(population.episodes > 0, mean, -jnp.inf)


def _exploit_and_explore(pbt: PBT, key: jax.Array, learner, hparams: dict, population: Population):
    agents = population.parent.shape[0]
    order = jnp.argsort(fitness(population))  # ascending: the worst first
    bottom, top = order[: pbt.replace], order[agents - pbt.replace :]
    leader_key, factors_key = jax.random.split(key)
    leaders = top[jax.random.randint(leader_key, (pbt.replace,), 0, pbt.replace)]
    source = jnp.arange(agents).at[bottom].set(leaders)
    copied = source != jnp.arange(agents)
    learner = jax.tree.map(lambda x: x[source], learner)
    explored = {}
    for name, factor_key in zip(hparams, jax.random.split(factors_key, max(1, len(hparams)))):
        up = jax.random.bernoulli(factor_key, 0.5, (agents,))
        value = hparams[name][source] * jnp.where(up, pbt.factor, 1.0 / pbt.factor)
        low, high = pbt.bounds.get(name, (None, None))
        explored[name] = jnp.where(copied, jnp.clip(value, low, high), hparams[name])
    zeros = jnp.zeros_like(population.return_sum)
    parent = population.parent[source]  # agent j now holds what agent source[j] held, and its descent
    return learner, explored, Population(zeros, zeros, population.updates, parent, population.steps + 1)


def population_step(pbt: PBT, learner, hparams: dict, population: Population, returns, episodes):
    """After an update: counts its ended episodes (``returns``/``episodes``: ``[agents]`` sums over every
    replica) and, every ``pbt.interval`` updates, exploits and explores. ``learner`` leaves are ``[agents,
    ...]``, ``hparams`` ``{name: [agents]}``; returns the three updated."""
    updates = population.updates + 1
    window_begins = (updates - 1) % pbt.window == 0  # this update opens a log window: its lineage starts afresh
    population = Population(
        population.return_sum + returns,
        population.episodes + episodes,
        updates,
        jnp.where(window_begins, jnp.arange(updates.shape[0], dtype=jnp.int32), population.parent),
        jnp.where(window_begins, 0, population.steps),
    )
    key = jax.random.fold_in(jax.random.key(pbt.seed ^ PBT_STREAM), population.updates[0])
    return jax.lax.cond(
        population.updates[0] % pbt.interval == 0,
        lambda: _exploit_and_explore(pbt, key, learner, hparams, population),
        lambda: (learner, hparams, population),
    )
