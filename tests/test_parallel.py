"""Data parallelism: sharded means and sharded learner updates equal single-device ones."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from podracer import envs
from podracer.agents import ImpalaConfig, PPOConfig, make_agent
from podracer.parallel import (
    TRAJECTORY_SPEC,
    data_parallel_learn,
    device_mesh,
    first_local_replica,
    masked_mean,
    mean_over_replicas,
    per_device,
    shard_map,
)
from podracer.types import Trajectory


def test_masked_mean_over_replicas_is_the_global_masked_mean():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 16)).astype(np.float32)
    mask = rng.random((8, 16)) > 0.5
    mask[3] = False  # a replica with nothing valid
    mesh = device_mesh(jax.devices())

    def replica(x, mask, w):
        value, grad = jax.value_and_grad(lambda w: masked_mean(w * x[0], mask[0]))(w)
        return mean_over_replicas(value), mean_over_replicas(grad)

    value, grad = jax.jit(shard_map(replica, mesh, (P("device"), P("device"), P()), (P(), P())))(x, mask, 2.0)
    np.testing.assert_allclose(value, 2.0 * x[mask].mean(), rtol=1e-5)
    np.testing.assert_allclose(grad, x[mask].mean(), rtol=1e-5)


def _trajectory(env, seed, t=16, b=8):
    """A random-policy trajectory from the real environment."""
    keys = jax.random.split(jax.random.key(seed), b)
    state, obs = jax.vmap(env.reset)(keys)
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(t):
        action = jnp.asarray(rng.integers(env.spec.num_actions, size=b), jnp.int32)
        state, ts = jax.vmap(env.step)(state, action)
        steps.append((obs, action, ts))
        obs = ts.obs
    all_obs = jnp.stack([s[0] for s in steps] + [obs])
    log_prob = jnp.full((t, b), -np.log(env.spec.num_actions) + 0.1, jnp.float32)
    return Trajectory(
        all_obs,
        jnp.stack([s[1] for s in steps]),
        jnp.stack([s[2].reward for s in steps]),
        jnp.stack([s[2].discount for s in steps]),
        jnp.stack([s[2].valid for s in steps]),
        {"log_prob": log_prob},
    )


@pytest.mark.parametrize(
    "agent_name, config",
    [
        ("ppo", dataclasses.replace(PPOConfig(), num_epochs=3, num_minibatches=1)),
        # One gradient step over the whole batch: minibatches are drawn per replica, so a shuffled split of 8
        # sequences on one device cannot equal 8 devices' one-sequence steps.
        ("impala", dataclasses.replace(ImpalaConfig(), num_minibatches=1)),
    ],
)
@pytest.mark.slow
def test_one_device_and_eight_devices_give_the_same_update(agent_name, config):
    env = envs.make("catch")
    agent = make_agent(agent_name, config, env.spec)
    traj = _trajectory(env, seed=0)
    results = []
    for n in (1, 8):
        mesh = device_mesh(jax.devices()[:n])
        learn = data_parallel_learn(agent.learn, mesh)
        state = per_device(agent.init(jax.random.key(1)), mesh)
        sharded_traj = jax.device_put(traj, NamedSharding(mesh, TRAJECTORY_SPEC))
        for i in range(2):
            state, metrics = learn(state, (sharded_traj,), jax.random.key(2 + i))
        results.append((jax.device_get(first_local_replica(state).params), jax.device_get(metrics)))
    (params_1, metrics_1), (params_8, metrics_8) = results
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6), params_1, params_8)
    np.testing.assert_allclose(metrics_1["loss"], metrics_8["loss"], rtol=1e-4, atol=1e-6)
    initial = agent.init(jax.random.key(1)).params
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: np.abs(a - b).max(), initial, params_1))
    assert max(moved) > 1e-4  # the update did something
