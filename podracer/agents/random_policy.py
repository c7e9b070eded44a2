"""A uniformly random policy that learns nothing: the environment-only limit of an architecture."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from podracer.types import Agent, BatchShape, EnvSpec


def make_random_policy(spec: EnvSpec, shape: BatchShape = BatchShape()) -> Agent:
    """Acts uniformly at random (over the action set, or within the bounds); ``learn`` only counts updates."""

    def act(params, obs, key, core):
        batch = jax.tree.leaves(obs)[0].shape[0]
        if spec.discrete:
            return jax.random.randint(key, (batch,), 0, spec.num_actions, jnp.int32), {}, core
        low, high = jnp.asarray(spec.actions.low), jnp.asarray(spec.actions.high)
        return jax.random.uniform(key, (batch, *spec.actions.shape), minval=low, maxval=high), {}, core

    def learn(state, traj, key):
        return state + 1, {"loss": jnp.float32(0.0)}

    return Agent(init=lambda key: jnp.int32(0), actor_params=lambda state: state, act=act, learn=learn)
