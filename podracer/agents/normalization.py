"""Running observation statistics, kept in the learner state and applied when acting and learning.

The statistics are updated from the *global* batch: every data replica (device
and lane) contributes its observations through the same collectives as the
gradients, so every replica holds the same numbers, the same as one device
learning from the whole batch. They travel to acting inside the actor
parameters, so Sebulba's actors get them with each parameter version, and
checkpoints keep them with the rest of the learner state.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from podracer.parallel import mean_over_replicas, replica_count

CLIP = 10.0  # normalised observations are clipped to [-CLIP, CLIP], as gym's and CleanRL's wrappers do
EPSILON = 1e-8


class RunningMoments(NamedTuple):
    """Mean and variance of every observation entry seen so far.

    Attributes:
      count: float32 scalar, observations seen (over every replica).
      mean: ``obs_shape`` float32.
      var: ``obs_shape`` float32 (population variance; 1 before any update).
    """

    count: jax.Array
    mean: jax.Array
    var: jax.Array

    @classmethod
    def initial(cls, obs_shape: tuple[int, ...]) -> RunningMoments:
        return cls(jnp.float32(0.0), jnp.zeros(obs_shape, jnp.float32), jnp.ones(obs_shape, jnp.float32))


def normalize(moments: RunningMoments, obs: jax.Array) -> jax.Array:
    """``obs [..., *obs_shape]`` standardised by ``moments`` and clipped to ``[-CLIP, CLIP]``."""
    scaled = (obs.astype(jnp.float32) - moments.mean) * jax.lax.rsqrt(moments.var + EPSILON)
    return jnp.clip(scaled, -CLIP, CLIP)


def update(moments: RunningMoments, obs: jax.Array) -> RunningMoments:
    """``moments`` with this replica's ``obs [N, *obs_shape]`` and every other replica's added.

    Must run where :data:`podracer.parallel.DATA_AXES` are bound (inside
    ``Agent.learn``). The batch's mean and variance are taken in two passes
    over the global batch, then merged with the running ones (Chan et al.'s
    parallel update), so a large mean does not cancel the variance.
    """
    obs = jax.lax.stop_gradient(obs.astype(jnp.float32))
    batch_count = jnp.float32(obs.shape[0] * replica_count())
    batch_mean = mean_over_replicas(jnp.mean(obs, axis=0))
    batch_var = mean_over_replicas(jnp.mean(jnp.square(obs - batch_mean), axis=0))
    total = moments.count + batch_count
    delta = batch_mean - moments.mean
    mean = moments.mean + delta * (batch_count / total)
    sum_squares = (
        moments.var * moments.count
        + batch_var * batch_count
        + jnp.square(delta) * (moments.count * batch_count / total)
    )
    return RunningMoments(total, mean, sum_squares / total)
