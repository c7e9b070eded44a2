"""GAE and V-trace over trajectories with terminations, truncations and auto-reset steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from podracer.agents.returns import generalized_advantages, trace_continuation, vtrace

GAMMA, LAMBDA = 0.9, 0.8


def _random_batch(seed, t=12, b=3):
    rng = np.random.default_rng(seed)
    reward = rng.normal(size=(t, b)).astype(np.float32)
    discount = (rng.random((t, b)) > 0.2).astype(np.float32)
    values = rng.normal(size=(t + 1, b)).astype(np.float32)
    return reward, discount, values


def _gae_by_definition(reward, discount, valid, values, gamma, lam):
    """A[t] = sum_k (prod_{j<k} gamma lam d[t+j] cont[t+j]) delta[t+k], summed forwards."""
    t_len = len(reward)
    cont = np.append(valid[1:], 1.0)
    delta = reward + gamma * discount * values[1:] - values[:-1]
    out = np.zeros(t_len)
    for t in range(t_len):
        weight = 1.0
        for k in range(t, t_len):
            out[t] += weight * delta[k]
            weight *= gamma * lam * discount[k] * cont[k]
    return out


def test_gae_matches_rlax_when_every_step_is_valid():
    reward, discount, values = _random_batch(0)
    valid = np.ones_like(reward, bool)
    ours = generalized_advantages(reward, discount, valid, values, GAMMA, LAMBDA)
    rlax_gae = jax.vmap(rlax.truncated_generalized_advantage_estimation, in_axes=(1, 1, None, 1), out_axes=1)
    np.testing.assert_allclose(ours, rlax_gae(reward, GAMMA * discount, LAMBDA, values), rtol=1e-5, atol=1e-6)


def test_gae_cuts_at_reset_steps():
    reward, discount, values = _random_batch(1, t=10, b=2)
    valid = np.ones_like(reward, bool)
    valid[4, 0] = valid[7, 1] = False  # obs[4] (env 0) and obs[7] (env 1) ended truncated episodes
    ours = np.asarray(generalized_advantages(reward, discount, valid, values, GAMMA, LAMBDA))
    for b in range(2):
        expected = _gae_by_definition(reward[:, b], discount[:, b], valid[:, b], values[:, b], GAMMA, LAMBDA)
        np.testing.assert_allclose(ours[:, b], expected, rtol=1e-5, atol=1e-5)


def test_gae_truncation_example_by_hand():
    # obs0 -> obs1 (truncated final obs, value 10) ; reset step ; obs2 -> obs3.
    reward = np.array([[1.0], [0.0], [2.0]], np.float32)
    discount = np.ones((3, 1), np.float32)
    valid = np.array([[True], [False], [True]])
    values = np.array([[5.0], [10.0], [3.0], [4.0]], np.float32)
    adv = np.asarray(generalized_advantages(reward, discount, valid, values, 0.5, 1.0))[:, 0]
    # Step 0 bootstraps from the final observation's value and stops there: 1 + 0.5 * 10 - 5.
    assert adv[0] == 1.0
    # Step 2: 2 + 0.5 * 4 - 3.
    assert adv[2] == 1.0
    assert list(np.asarray(trace_continuation(valid))[:, 0]) == [0.0, 1.0, 1.0]


def _vtrace_by_definition(reward, discount, valid, values, rho, gamma, clip_rho, clip_pg_rho):
    """Espeholt et al. eq. (1) summed forwards within each segment, lambda = 1."""
    t_len = len(reward)
    cont = np.append(valid[1:], 1.0)
    rho_c, c = np.minimum(clip_rho, rho), np.minimum(1.0, rho)
    delta = rho_c * (reward + gamma * discount * values[1:] - values[:-1])
    vs = np.array(values[:-1], np.float64)
    for s in range(t_len):
        weight = 1.0
        for t in range(s, t_len):
            vs[s] += weight * delta[t]
            weight *= gamma * discount[t] * cont[t] * c[t]
    next_vs = np.where(cont > 0, np.append(vs[1:], values[-1]), values[1:])
    pg_adv = np.minimum(clip_pg_rho, rho) * (reward + gamma * discount * next_vs - values[:-1])
    return vs, pg_adv


def test_vtrace_matches_its_definition_with_cuts():
    reward, discount, values = _random_batch(2, t=9, b=2)
    rho = np.exp(np.random.default_rng(3).normal(scale=0.5, size=reward.shape)).astype(np.float32)
    valid = np.ones_like(reward, bool)
    valid[5, 1] = False
    out = vtrace(reward, discount, valid, values, rho, gamma=GAMMA, vtrace_lambda=1.0, clip_rho=1.0, clip_pg_rho=1.0)
    for b in range(2):
        vs, pg_adv = _vtrace_by_definition(
            reward[:, b], discount[:, b], valid[:, b], values[:, b], rho[:, b], GAMMA, 1.0, 1.0
        )
        np.testing.assert_allclose(np.asarray(out.errors[:, b]) + values[:-1, b], vs, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(out.pg_advantage[:, b], pg_adv, rtol=1e-4, atol=1e-4)


def test_vtrace_equals_rlax_without_cuts():
    reward, discount, values = _random_batch(4)
    rho = np.exp(np.random.default_rng(5).normal(scale=0.5, size=reward.shape)).astype(np.float32)
    out = vtrace(
        reward,
        discount,
        np.ones_like(reward, bool),
        values,
        rho,
        gamma=GAMMA,
        vtrace_lambda=1.0,
        clip_rho=1.0,
        clip_pg_rho=1.0,
    )
    for b in range(reward.shape[1]):
        ref = rlax.vtrace_td_error_and_advantage(
            values[:-1, b], values[1:, b], reward[:, b], GAMMA * discount[:, b], rho[:, b], jnp.float32(1.0)
        )
        np.testing.assert_allclose(out.errors[:, b], ref.errors, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out.pg_advantage[:, b], ref.pg_advantage, rtol=1e-5, atol=1e-6)


def test_mismatched_shapes_are_refused_at_the_boundary():
    step = jnp.ones((5, 3))
    with pytest.raises(AssertionError):  # values must be [T + 1, B]: one more step than the rewards
        generalized_advantages(step, step, step > 0, jnp.ones((5, 3)), 0.99, 0.95)
