"""Anakin: batch checks before compiling, determinism, layouts over devices and lanes, seeds, NaN stops."""

import dataclasses
import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from podracer import envs
from podracer.agents import PPOConfig, make_agent
from podracer.anakin import AnakinConfig, NonFiniteLossError, anakin_mesh, geometry, make_anakin, train, train_agent
from podracer.anakin.sweep import Sweep
from podracer.evaluation import OFF as NO_EVALUATION  # training is what these tests look at
from podracer.types import Agent, BatchShape

SMALL_PPO = dataclasses.replace(PPOConfig(), num_epochs=2, num_minibatches=2, learning_rate=1e-3)


def _params(result):
    """Parameters of seed 0 as seen on device 0 (all replicas hold the same)."""
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0))[0, 0, 0], result.state.learner.params)


def _train(config, agent_config=SMALL_PPO, env="catch", agent="ppo"):
    return train(agent, agent_config, env, config, run_dir=None, quiet=True, evaluation=NO_EVALUATION)


def _assert_close(a, b, **tol):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, **tol), a, b)


def test_batch_that_does_not_split_over_devices_fails_before_compiling():
    with pytest.raises(
        ValueError,
        match=r"--num-envs 100 does not split evenly over 8 device\(s\) x 1 lane\(s\).*multiple of 8 \(e.g. 96 or 104\)",
    ):
        geometry(AnakinConfig(num_envs=100), 8)
    with pytest.raises(ValueError, match=r"--num-envs 64 .* 8 device\(s\) x 3 lane\(s\) = 24 replicas"):
        geometry(AnakinConfig(num_envs=64, lanes=3), 8)
    with pytest.raises(ValueError, match="--rollout-len must be at least 1"):
        geometry(AnakinConfig(rollout_len=0), 8)
    with pytest.raises(ValueError, match="--num-devices 9 asks for more than the 8"):
        _train(AnakinConfig(num_devices=9))


def test_log_windows_hold_equal_numbers_of_updates():
    # 1,000,000 steps of 4 x 128 are 1954 updates; a 1M-step interval would leave a last window of 1 update.
    geo = geometry(AnakinConfig(num_envs=4, rollout_len=128, total_env_steps=1_000_000, log_interval=1_000_000), 1)
    assert (geo.num_updates, geo.updates_per_call) == (1954, 977)
    geo = geometry(AnakinConfig(num_envs=4, rollout_len=128, total_env_steps=500_000), 1)  # about 20 windows
    assert (geo.num_updates, geo.updates_per_call) == (977, 49)  # 19 windows of 49 and one of 46


def test_minibatches_that_do_not_divide_the_replica_batch_fail_while_tracing():
    config = AnakinConfig(num_envs=8, rollout_len=5, total_env_steps=80)
    with pytest.raises(ValueError, match=r"rollout_len x envs = 5 x 1 = 5 transitions, which --num-minibatches 2"):
        _train(config)


@pytest.mark.slow
def test_same_seed_gives_identical_parameters():
    config = AnakinConfig(num_envs=16, rollout_len=8, total_env_steps=4096, num_devices=2, seed=3)
    first, second = _train(config), _train(config)
    jax.tree.map(np.testing.assert_array_equal, _params(first), _params(second))
    other = _train(dataclasses.replace(config, seed=4))
    assert not np.allclose(jax.tree.leaves(_params(first))[0], jax.tree.leaves(_params(other))[0])


@pytest.mark.slow
@pytest.mark.parametrize("devices, lanes", [(4, 2), (1, 8)])
def test_replicas_give_the_same_training_however_laid_out_over_devices_and_lanes(devices, lanes):
    """8 replicas as 8 devices x 1 lane, 4 x 2 or 1 x 8: the same run, gradients averaged over all."""
    base = AnakinConfig(num_envs=32, rollout_len=8, total_env_steps=32 * 8 * 6, num_devices=8, lanes=1)
    reference = _train(base)
    other = _train(dataclasses.replace(base, num_devices=devices, lanes=lanes))
    _assert_close(_params(reference), _params(other), rtol=1e-4, atol=1e-5)
    assert reference.records[-1]["episodes"] == other.records[-1]["episodes"]


@pytest.mark.slow
def test_seeds_train_independently_in_one_program():
    config = AnakinConfig(num_envs=16, rollout_len=8, total_env_steps=16 * 8 * 5, num_devices=2, seed=5)
    together = _train(dataclasses.replace(config, num_seeds=2))
    alone = _train(dataclasses.replace(config, seed=6))
    seed_1 = jax.tree.map(lambda x: np.asarray(x.addressable_data(0))[0, 1, 0], together.state.learner.params)
    _assert_close(seed_1, _params(alone), rtol=1e-4, atol=1e-5)
    record = together.records[-1]
    assert len(record["episode_return_per_seed"]) == 2
    assert record["episode_return_min"] <= record["episode_return"] <= record["episode_return_max"]


def _equations(jaxpr):
    """Every equation of ``jaxpr`` and of the jaxprs nested in it (jit, shard_map, scan, ...)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
                    yield from _equations(getattr(item, "jaxpr", item))


def test_seeds_initialise_without_a_batched_qr():
    """A batched QR (vmapped orthogonal init) can deadlock XLA:CPU's thread pool: seeds must initialise in turn."""
    env = envs.make("catch")
    geo = geometry(AnakinConfig(num_envs=4, num_seeds=3, total_env_steps=4 * 16 * 2), 1)
    agent = make_agent("ppo", SMALL_PPO, env.spec, BatchShape(geo.num_updates, geo.rollout_len, geo.envs_per_lane))
    program = make_anakin(agent, env, geo, anakin_mesh(jax.devices()[:1], geo.lanes))
    qr_operands = [
        eqn.invars[0].aval.shape
        for eqn in _equations(jax.make_jaxpr(program.init)(0).jaxpr)
        if eqn.primitive.name == "qr"
    ]
    assert qr_operands, "the PPO network's orthogonal initialisation should show up as QR decompositions"
    assert all(len(shape) == 2 for shape in qr_operands), qr_operands


def _nan_agent(bad_update):
    """Learns nothing; its loss turns NaN at update ``bad_update`` (1-based)."""

    def learn(state, traj, key):
        update = state + 1
        return update, {"loss": jnp.where(update >= bad_update, jnp.nan, 0.0)}

    def act(params, obs, key, core):
        return jnp.zeros(obs.shape[0], jnp.int32), {}, core

    return Agent(init=lambda key: jnp.int32(0), actor_params=lambda s: s, act=act, learn=learn)


@pytest.mark.parametrize("update_loop", ["device", "host"])
def test_a_non_finite_loss_stops_the_run_naming_the_update(update_loop):
    config = AnakinConfig(
        num_envs=8, rollout_len=4, total_env_steps=8 * 4 * 20, log_interval=8 * 4 * 5, update_loop=update_loop
    )
    with pytest.raises(NonFiniteLossError, match=r"non-finite at update 7 \(seed 0\)"):
        train_agent(_nan_agent(bad_update=7), envs.make("catch"), config, quiet=True, evaluation=NO_EVALUATION)


def test_a_non_finite_loss_after_pbt_names_the_settings_pbt_gave_the_agent():
    members = ({"learning_rate": 1e-3}, {"learning_rate": 3e-3})
    sweep = Sweep(("learning_rate",), members, agent_with=lambda values: _nan_agent(bad_update=10), bounds={})
    config = AnakinConfig(
        num_envs=8,
        rollout_len=4,
        total_env_steps=8 * 4 * 20,
        log_interval=8 * 4 * 4,
        num_seeds=2,
        sweep=("learning_rate=1e-3,3e-3",),
        pbt_interval=8 * 4 * 4,
        pbt_quantile=0.5,
        pbt_factor=2.0,
    )
    with pytest.raises(NonFiniteLossError) as stopped:
        train_agent(sweep.agent_with({}), envs.make("catch"), config, quiet=True, evaluation=NO_EVALUATION, sweep=sweep)
    named = re.search(
        r"non-finite at update 10 \((learning_rate=\S+) seed \d, after PBT (learning_rate=\S+)\)", str(stopped.value)
    )
    assert named, str(stopped.value)
    assert named[1] != named[2]  # the message names the setting the agent trained with last, not its starting one


def test_a_run_that_failed_at_its_first_update_leaves_its_directory_reusable(tmp_path):
    from podracer.runlog import run_started

    config = AnakinConfig(num_envs=8, rollout_len=4, total_env_steps=8 * 4 * 4, num_devices=1)
    with pytest.raises(NonFiniteLossError, match="update 1"):
        train_agent(
            _nan_agent(bad_update=1),
            envs.make("catch"),
            config,
            run_dir=str(tmp_path),
            quiet=True,
            evaluation=NO_EVALUATION,
        )
    assert not run_started(str(tmp_path))  # config.json only: no record, no checkpoint
    result = train_agent(
        _nan_agent(bad_update=1000),
        envs.make("catch"),
        config,
        run_dir=str(tmp_path),
        quiet=True,
        evaluation=NO_EVALUATION,
    )
    assert result.records[-1]["update"] == 4 and run_started(str(tmp_path))


def test_program_runs_many_updates_per_call_without_recompiling():
    env = envs.make("catch")
    geo = geometry(AnakinConfig(num_envs=8, rollout_len=4, total_env_steps=8 * 4 * 10), 8)
    program = make_anakin(_nan_agent(bad_update=1000), env, geo, anakin_mesh(jax.devices(), 1))
    state = program.init(0)
    state, stats = program.run(state, np.int32(3))
    state, stats = program.run(state, np.int32(5))
    assert program.run._cache_size() == 1
    assert int(np.asarray(state.learner.addressable_data(0))[0, 0, 0]) == 8


@pytest.mark.slow
def test_host_and_device_update_loops_train_identically():
    config = AnakinConfig(
        num_envs=16, rollout_len=8, total_env_steps=16 * 8 * 6, num_devices=2, log_interval=16 * 8 * 3
    )
    on_device = _train(dataclasses.replace(config, update_loop="device"))
    on_host = _train(dataclasses.replace(config, update_loop="host"))
    _assert_close(_params(on_device), _params(on_host), rtol=1e-5, atol=1e-6)
    assert [r["env_steps"] for r in on_device.records] == [r["env_steps"] for r in on_host.records]
    with pytest.raises(ValueError, match="--update-loop must be one of"):
        _train(dataclasses.replace(config, update_loop="gpu"))
