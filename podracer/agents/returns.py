"""Return estimates over time-major trajectories, cut at auto-reset steps."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import rlax


def trace_continuation(valid: jax.Array) -> jax.Array:
    """``[T, B]`` float32: 1 where a return may flow back from transition ``t + 1`` into ``t``.

    It may not where transition ``t + 1`` is an auto-reset step (``valid`` False):
    ``obs[t + 1]`` then ended the episode, by truncation, and is bootstrapped from
    instead. The last step always continues into the bootstrap value.
    """
    return jnp.concatenate([valid[1:], jnp.ones_like(valid[:1])]).astype(jnp.float32)


GAE_UNROLL = 16  # backward-recursion steps per loop iteration


def generalized_advantages(
    reward: jax.Array, discount: jax.Array, valid: jax.Array, values: jax.Array, gamma: float, gae_lambda: float
) -> jax.Array:
    """GAE advantages ``[T, B]`` from rewards/discounts/valid ``[T, B]`` and values ``[T + 1, B]``.

    The same recursion as ``rlax.truncated_generalized_advantage_estimation``
    (``tests/test_returns.py`` compares them), batched over ``B`` and unrolled:
    ``A[t] = delta[t] + gamma * lambda * discount[t] * continuation[t] * A[t + 1]``.
    """
    chex.assert_equal_shape([reward, discount, valid, values[1:]])
    deltas = reward + gamma * discount * values[1:] - values[:-1]
    decays = gamma * gae_lambda * discount * trace_continuation(valid)

    def backward(advantage, step):
        delta, decay = step
        advantage = delta + decay * advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(values[-1]), (deltas, decays), reverse=True, unroll=GAE_UNROLL
    )
    return advantages


def vtrace(
    reward: jax.Array,
    discount: jax.Array,
    valid: jax.Array,
    values: jax.Array,
    rho: jax.Array,
    *,
    gamma: float,
    vtrace_lambda: float,
    clip_rho: float,
    clip_pg_rho: float,
):
    """V-trace errors and policy-gradient advantages ``[T, B]`` (targets carry no gradient).

    Args:
      reward, discount, valid: ``[T, B]`` as in :class:`podracer.types.Trajectory`.
      values: ``[T + 1, B]`` state values under the current parameters.
      rho: ``[T, B]`` importance ratios pi(a|x) / mu(a|x).
    """
    chex.assert_equal_shape([reward, discount, valid, rho, values[1:]])
    per_env = jax.vmap(
        lambda v_tm1, v_t, r_t, d_t, rho_tm1, lam: rlax.vtrace_td_error_and_advantage(
            v_tm1, v_t, r_t, d_t, rho_tm1, lam, clip_rho, clip_pg_rho
        ),
        in_axes=1,
        out_axes=1,
    )
    lam = vtrace_lambda * trace_continuation(valid)
    return per_env(values[:-1], values[1:], reward, gamma * discount, rho, lam)
