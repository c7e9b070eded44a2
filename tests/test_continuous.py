"""Continuous actions: the Gaussian policy against hand-computed densities, the running observation statistics
against numpy and across devices, and the refusals of what cannot run."""

import dataclasses

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from podracer.agents import ImpalaConfig, MuZeroConfig, PPOConfig, make_agent
from podracer.agents.normalization import CLIP, RunningMoments, normalize, update
from podracer.agents.policies import GaussianConfig, GaussianPolicy
from podracer.parallel import DATA_AXES, device_mesh, shard_map, single_replica
from podracer.types import BatchShape, Box, Discrete, EnvSpec, Trajectory

BOX = Box((-2.0, 0.0), (2.0, 1.0))
VECTOR_SPEC = EnvSpec(jax.ShapeDtypeStruct((3,), jnp.float32), BOX)


def _gaussian_log_density(x, mean, log_std):
    return np.sum(-0.5 * ((x - mean) / np.exp(log_std)) ** 2 - log_std - 0.5 * np.log(2 * np.pi), axis=-1)


@pytest.mark.parametrize("bounds", ["clip", "tanh"])
def test_gaussian_samples_score_and_stay_within_bounds(bounds):
    policy = GaussianPolicy(BOX, GaussianConfig(action_bounds=bounds))
    rng = np.random.default_rng(0)
    mean = rng.normal(size=(4096, 2)).astype(np.float32) * 3
    log_std = rng.normal(size=(4096, 2)).astype(np.float32) * 0.5
    action, extras = jax.jit(policy.sample)((mean, log_std), jax.random.key(1))
    sample = np.asarray(extras["sample"])
    assert action.shape == (4096, 2) and action.dtype == jnp.float32
    assert np.all(action >= np.array(BOX.low)) and np.all(action <= np.array(BOX.high))
    if bounds == "clip":
        np.testing.assert_allclose(action, np.clip(sample, BOX.low, BOX.high))
    else:  # the scaled tanh: [-2, 2] and [0, 1]
        np.testing.assert_allclose(
            action, np.stack([2 * np.tanh(sample[:, 0]), (np.tanh(sample[:, 1]) + 1) / 2], -1), atol=1e-6
        )
    # The behaviour log-probability is the density of the unbounded sample, and the learner scores the same.
    reference = _gaussian_log_density(sample, mean, log_std)
    np.testing.assert_allclose(extras["log_prob"], reference, rtol=1e-5, atol=1e-4)
    log_prob, entropy = policy.log_prob_and_entropy((mean, log_std), action, extras)
    np.testing.assert_allclose(log_prob, reference, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(entropy, np.sum(log_std + 0.5 * np.log(2 * np.pi * np.e), -1), rtol=1e-5, atol=1e-5)
    # The samples follow the Gaussian: standardised, mean 0 and variance 1.
    z = (sample - mean) / np.exp(log_std)
    assert abs(z.mean()) < 0.05 and abs(z.var() - 1) < 0.05


@pytest.mark.parametrize("make_config,name", [(PPOConfig, "ppo"), (ImpalaConfig, "impala")])
@pytest.mark.parametrize("log_std", ["parameter", "network"])
def test_actor_critic_agents_act_and_learn_with_continuous_actions(make_config, name, log_std):
    config = (
        make_config(log_std=log_std, log_std_init=-0.5, normalize_observations=True, num_minibatches=2)
        if name == "ppo"
        else make_config(log_std=log_std, log_std_init=-0.5, normalize_observations=True)
    )
    agent = make_agent(name, config, VECTOR_SPEC, BatchShape(10, 8, 4))
    state = agent.init(jax.random.key(0))
    obs = jax.random.normal(jax.random.key(1), (9, 4, 3)) * 5 + 3
    actions, extras, _ = jax.vmap(lambda o, k: agent.act(agent.actor_params(state), o, k, ()))(
        obs[:-1], jax.random.split(jax.random.key(2), 8)
    )
    assert actions.shape == (8, 4, 2) and extras["sample"].shape == (8, 4, 2) and extras["log_prob"].shape == (8, 4)
    traj = Trajectory(obs, actions, jnp.ones((8, 4)), jnp.ones((8, 4)), jnp.ones((8, 4), bool), extras)
    new_state, metrics = single_replica(agent.learn)(state, traj, jax.random.key(3))
    assert all(np.isfinite(v) for v in jax.tree.leaves(metrics))
    assert not np.allclose(
        jax.flatten_util.ravel_pytree(new_state.params)[0], jax.flatten_util.ravel_pytree(state.params)[0]
    )
    # The statistics took in obs[:-1], exactly the observations acted on.
    seen = np.asarray(obs[:-1]).reshape(-1, 3)
    np.testing.assert_allclose(new_state.obs_moments.count, 32)
    np.testing.assert_allclose(new_state.obs_moments.mean, seen.mean(0), rtol=1e-5)
    np.testing.assert_allclose(new_state.obs_moments.var, seen.var(0), rtol=1e-4)


def test_running_moments_match_numpy_over_many_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(loc=100.0, scale=s, size=(64, 5)).astype(np.float32) for s in (0.5, 1.0, 2.0, 4.0)]
    moments = RunningMoments.initial((5,))
    step = jax.jit(single_replica(update))
    for batch in batches:
        moments = step(moments, batch)
    everything = np.concatenate(batches).astype(np.float64)
    np.testing.assert_allclose(moments.count, len(everything))
    np.testing.assert_allclose(moments.mean, everything.mean(0), rtol=1e-6)
    np.testing.assert_allclose(moments.var, everything.var(0), rtol=1e-4)
    scaled = normalize(moments, jnp.asarray(everything[:3] * 10))
    assert np.all(np.abs(scaled) <= CLIP) and np.any(np.abs(scaled) == CLIP)


def test_running_moments_are_the_same_on_one_and_eight_devices():
    """The same global batch of 8 x 32 observations, whole on one device or split over eight."""
    assert jax.device_count() == 8
    rng = np.random.default_rng(1)

    def batch(centre):  # integers around an integer mean: every partial sum and mean is exact in float32
        half = rng.integers(-50, 50, size=(128, 4))
        return rng.permutation(np.concatenate([half, -half]) + centre).astype(np.float32)

    batches = [batch(c) for c in (3, -7, 20)]

    def run(devices):
        mesh = device_mesh(jax.devices()[:devices])
        step = jax.jit(shard_map(lambda m, x: update(m, x), mesh, in_specs=(P(), P(DATA_AXES)), out_specs=P()))
        moments = RunningMoments.initial((4,))
        for batch in batches:
            moments = step(moments, batch)
        return moments

    one, eight = run(1), run(8)
    for a, b in zip(one, eight):
        np.testing.assert_array_equal(a, b)
    assert one.count == 768 and not np.allclose(one.var, 1.0)


def test_bad_input_is_refused_before_compiling():
    discrete = EnvSpec(jax.ShapeDtypeStruct((3,), jnp.float32), Discrete(4))
    with pytest.raises(ValueError, match="--log-std, --action-bounds set how.*discrete \\(4 of them\\)"):
        make_agent("ppo", PPOConfig(log_std="network", action_bounds="tanh"), discrete)
    with pytest.raises(ValueError, match="MuZero searches over a discrete action set.*continuous"):
        make_agent("muzero", MuZeroConfig(), VECTOR_SPEC, BatchShape(10, 8, 4))
    images = EnvSpec(jax.ShapeDtypeStruct((10, 10, 4), jnp.float32), Discrete(4))
    with pytest.raises(ValueError, match="--normalize-observations standardises vector observations"):
        make_agent("ppo", PPOConfig(normalize_observations=True), images)
    with pytest.raises(ValueError, match="--reward-scale must be positive"):
        make_agent("impala", dataclasses.replace(ImpalaConfig(), reward_scale=0.0), VECTOR_SPEC)
    with pytest.raises(ValueError, match="--action-bounds must be one of"):
        make_agent("ppo", PPOConfig(action_bounds="squash"), VECTOR_SPEC)
