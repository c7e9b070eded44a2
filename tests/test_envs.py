"""Jittable environments: Catch's rules, CartPole against gymnasium, auto-reset, gymnax."""

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podracer import envs
from podracer.envs.autoreset import AutoReset
from podracer.envs.base import action_spec
from podracer.envs.cartpole import CartPole
from podracer.envs.catch import Catch
from podracer.types import Box, EnvSpec


def test_catch_rules():
    env = Catch()
    state, obs = env.reset(jax.random.key(3))
    assert obs.shape == (10, 5) and obs.sum() == 2 and obs[0, state.ball_column] == 1 and obs[9, 2] == 1
    target = int(state.ball_column)
    for t in range(9):
        action = jnp.int32(np.sign(target - int(state.paddle_column)) + 1)
        state, obs, reward, terminated = env.step(state, action, None)
        assert bool(terminated) == (t == 8)
        assert float(reward) == (1.0 if t == 8 else 0.0)
    # Moving away from the ball loses.
    state, _ = env.reset(jax.random.key(3))
    away = jnp.int32(0 if target > 2 else 2)
    for _ in range(9):
        state, _, reward, terminated = env.step(state, away, None)
    assert bool(terminated) and float(reward) == -1.0


def _balance(obs):
    return int(obs[2] + obs[3] > 0)


@pytest.mark.parametrize("policy", ["random", "balancing"])
def test_cartpole_matches_gymnasium_step_by_step(policy):
    """Same state in, same observation, reward, termination and truncation out."""
    gym_env = gymnasium.make("CartPole-v1")
    env = AutoReset(CartPole())
    step = jax.jit(env.step)
    rng = np.random.default_rng(0)
    gym_obs, _ = gym_env.reset(seed=0)
    state, _ = env.reset(jax.random.key(0))
    terminations = truncations = 0
    for _ in range(1500):
        # Start ours from gymnasium's exact (float64) state, rounded to float32.
        state = state._replace(env_state=jnp.asarray(gym_env.unwrapped.state, jnp.float32))
        action = int(rng.integers(2)) if policy == "random" else _balance(gym_obs)
        gym_obs, gym_reward, gym_term, gym_trunc, _ = gym_env.step(action)
        state, ts = step(state, jnp.int32(action))
        assert ts.valid and float(ts.reward) == gym_reward
        assert bool(ts.episode.done) == (gym_term or gym_trunc)
        assert float(ts.discount) == (0.0 if gym_term else 1.0)
        if gym_term:
            terminations += 1
        elif gym_trunc:
            truncations += 1
            np.testing.assert_allclose(ts.obs, gym_obs, rtol=1e-4, atol=1e-5)  # the true final observation
            assert int(ts.episode.episode_length) == 500 and float(ts.episode.episode_return) == 500.0
            state, ts = step(state, jnp.int32(0))  # the reset step
            assert not ts.valid and float(ts.reward) == 0.0
        else:
            np.testing.assert_allclose(ts.obs, gym_obs, rtol=1e-4, atol=1e-5)
        if gym_term or gym_trunc:
            gym_obs, _ = gym_env.reset()
    if policy == "random":
        assert terminations > 50
    else:
        assert truncations >= 2


class CountingEnv:
    """obs = steps taken; terminates after ``terminate_at`` steps; time limit ``limit``."""

    spec = EnvSpec(jax.ShapeDtypeStruct((), jnp.int32), 2)

    def __init__(self, terminate_at, limit):
        self.terminate_at, self.max_episode_steps = terminate_at, limit

    def reset(self, key):
        return jnp.int32(0), jnp.int32(0)

    def step(self, state, action, key):
        state = state + 1
        return state, state, jnp.float32(1.0), state == self.terminate_at


def _run(env, steps):
    state, obs = env.reset(jax.random.key(0))
    out = []
    for _ in range(steps):
        state, ts = env.step(state, jnp.int32(0))
        out.append(
            (
                int(ts.obs),
                float(ts.reward),
                float(ts.discount),
                bool(ts.valid),
                bool(ts.episode.done),
                float(ts.episode.episode_return),
                int(ts.episode.episode_length),
            )
        )
    return out


def test_autoreset_termination_resets_at_once():
    out = _run(AutoReset(CountingEnv(terminate_at=3, limit=None)), 6)
    obs, rewards, discounts, valid, done = [list(col) for col in zip(*out)][:5]
    assert obs == [1, 2, 0, 1, 2, 0]  # the terminal observation is replaced by the reset one
    assert discounts == [1, 1, 0, 1, 1, 0] and all(valid) and rewards == [1] * 6
    assert done == [False, False, True, False, False, True]
    assert out[2][5:] == (3.0, 3)


def test_autoreset_truncation_keeps_final_obs_then_resets():
    out = _run(AutoReset(CountingEnv(terminate_at=100, limit=3)), 8)
    obs, rewards, discounts, valid, done = [list(col) for col in zip(*out)][:5]
    assert obs == [1, 2, 3, 0, 1, 2, 3, 0]  # final obs 3 is seen, then a reset step
    assert discounts == [1.0] * 8  # truncation bootstraps
    assert valid == [True, True, True, False, True, True, True, False]
    assert rewards == [1, 1, 1, 0, 1, 1, 1, 0]
    assert done == [False, False, True, False, False, False, True, False]
    assert out[2][5:] == (3.0, 3) and out[6][5:] == (3.0, 3)


def _as_arrays(tree):
    return [
        np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
        for x in jax.tree.leaves(tree)
    ]


@pytest.mark.parametrize(
    "env",
    [AutoReset(CartPole()), AutoReset(CountingEnv(terminate_at=100, limit=3))],
    ids=["cartpole-terminations", "truncations"],
)
def test_step_batch_is_vmapped_step_with_resets_only_where_an_episode_ended(env):
    state, _ = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), 4))
    batch_state, vmapped = jax.jit(env.step_batch), jax.jit(jax.vmap(env.step))
    ours, theirs, steps_with_a_restart = state, state, 0
    for i in range(120):
        action = jax.random.randint(jax.random.key(i), (4,), 0, 2)
        ours, our_ts = batch_state(ours, action)
        theirs, their_ts = vmapped(theirs, action)
        for a, b in zip(_as_arrays((ours, our_ts)), _as_arrays((theirs, their_ts))):
            np.testing.assert_array_equal(a, b)
        steps_with_a_restart += bool(jnp.any(their_ts.discount == 0) | jnp.any(~their_ts.valid))
    assert 0 < steps_with_a_restart < 120  # both branches taken
    hlo = batch_state.lower(state, jnp.zeros(4, jnp.int32)).compile().as_text()
    assert " conditional(" in hlo  # the resets' work runs only on the steps that need it


def test_gymnax_cartpole_agrees_with_ours():
    ours, theirs = envs.make("cartpole"), envs.make("gymnax:CartPole-v1")
    assert ours.spec == theirs.spec and theirs.max_episode_steps == 500
    keys = jax.random.split(jax.random.key(1), 16)
    (s1, o1), (s2, o2) = jax.vmap(ours.reset)(keys), jax.vmap(theirs.reset)(keys)
    np.testing.assert_allclose(o1, o2, atol=1e-6)
    step1, step2 = jax.jit(jax.vmap(ours.step)), jax.jit(jax.vmap(theirs.step))
    for t in range(200):
        action = jnp.asarray((np.arange(16) + t) % 2, jnp.int32)
        (s1, t1), (s2, t2) = step1(s1, action), step2(s2, action)
        np.testing.assert_allclose(t1.obs, t2.obs, atol=1e-4)
        np.testing.assert_array_equal(t1.discount, t2.discount)
        np.testing.assert_array_equal(t1.episode.done, t2.episode.done)


def test_make_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown environment 'pong'.*gymnax:<id>"):
        envs.make("pong")
    with pytest.raises(ValueError, match="unknown gymnax environment 'Nope-v0'"):
        envs.make("gymnax:Nope-v0")


def test_gymnax_continuous_actions_and_time_limits_truncate():
    env = envs.make("gymnax:Pendulum-v1")
    assert env.spec.actions == Box((-2.0,), (2.0,)) and not env.spec.discrete and env.max_episode_steps == 200
    state, _ = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), 3))
    step = jax.jit(jax.vmap(env.step))
    discounts, dones, valid = [], [], []
    for _ in range(201):
        state, ts = step(state, jnp.ones((3, 1)))
        discounts.append(ts.discount), dones.append(ts.episode.done), valid.append(ts.valid)
    # gymnax calls step 200 terminal; here it is a truncation: discount stays 1, the next step only resets.
    assert np.all(np.stack(discounts) == 1.0)
    assert np.all(np.stack(dones)[199]) and np.stack(dones)[:199].sum() == 0 and not np.any(valid[200])


def test_action_bounds_must_be_finite_and_ordered():
    with pytest.raises(ValueError, match="must be finite"):
        Box((-np.inf,), (1.0,))
    with pytest.raises(ValueError, match="low < high"):
        Box((1.0, 0.0), (2.0, 0.0))
    space = gymnasium.spaces.Box(-np.inf, np.inf, (2,))
    with pytest.raises(ValueError, match="SomeEnv-v0: continuous action bounds must be finite"):
        action_spec("SomeEnv-v0", space)
    assert action_spec("x", gymnasium.spaces.Box(-1.0, 1.0, (2,))) == Box((-1.0, -1.0), (1.0, 1.0))


def test_brax_environments_terminate_and_truncate_by_the_contract():
    from podracer.envs.brax_adapter import BraxEnv

    env = AutoReset(BraxEnv("inverted_pendulum", episode_length=6))
    assert env.spec.actions == Box((-1.0,), (1.0,)) and env.spec.observation.shape == (4,)
    state, _ = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), 2))
    step = jax.jit(jax.vmap(env.step))
    # Pushing the cart hard one way tips the pole over within a few steps (termination); doing nothing
    # keeps it up until the 6-step limit (truncation: bootstrapped, then a reset step).
    action = jnp.array([[1.0], [0.0]])
    outcomes = []
    for _ in range(8):
        state, ts = step(state, action)
        outcomes.append(ts)
    pushed_end = next(t for t, ts in enumerate(outcomes) if ts.episode.done[0])
    assert outcomes[pushed_end].discount[0] == 0.0 and outcomes[pushed_end].episode.episode_length[0] < 6
    assert [float(ts.discount[1]) for ts in outcomes] == [1.0] * 8
    assert bool(outcomes[5].episode.done[1]) and outcomes[5].episode.episode_length[1] == 6
    assert not bool(outcomes[6].valid[1]) and outcomes[5].episode.episode_return[1] == 6.0


def test_brax_names_are_checked():
    with pytest.raises(ValueError, match="unknown Brax environment 'nope'.*halfcheetah"):
        envs.make("brax:nope")
    with pytest.raises(ValueError, match="unknown Brax backend 'warp'"):
        envs.make("brax:ant:warp")
