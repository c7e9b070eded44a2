"""Host (envpool) environments: reset steps, termination vs truncation, Atari's episodic life and real scores."""

import jax
import numpy as np
import pytest

from podracer.envs.host import EpisodeState, HostEnv, HostEnvConfig, episode_transitions
from podracer.types import Box


def _transitions(flags):
    """Runs episode_transitions over ``[(reward, terminated, truncated, game_over), ...]`` for one env."""
    columns = [np.array([[row[i]] for row in flags]) for i in range(4)]
    real = columns[0].astype(np.float32)
    state, out = episode_transitions(
        EpisodeState.initial(1),
        np.sign(real),
        real,
        columns[1].astype(bool),
        columns[2].astype(bool),
        columns[3].astype(bool),
    )
    reward, discount, valid, stats = (np.asarray(x)[:, 0] if not isinstance(x, tuple) else x for x in out)
    return reward, discount, valid, jax.tree.map(lambda x: np.asarray(x)[:, 0], stats), state


def test_episode_transitions_mark_reset_steps_and_keep_scores_across_lives():
    reward, discount, valid, stats, _ = _transitions(
        [
            (4.0, 0, 0, 0),
            (7.0, 1, 0, 0),  # a life lost: the training episode ends, the game goes on
            (0.0, 0, 0, 0),  # envpool's reset step after the lost life
            (1.0, 1, 0, 1),  # game over
            (0.0, 0, 0, 0),  # the reset into a new game
            (2.0, 0, 1, 1),  # the time limit: bootstraps, ends the game
        ]
    )
    assert list(valid) == [True, True, False, True, False, True]
    assert list(discount) == [1, 0, 1, 0, 1, 1]
    assert list(reward) == [1, 1, 0, 1, 0, 1]  # clipped, and nothing on reset steps
    assert list(stats.done) == [False, False, False, True, False, True]
    assert stats.episode_return[3] == 12.0 and stats.episode_length[3] == 3
    assert stats.episode_return[5] == 2.0 and stats.episode_length[5] == 1


def test_episode_transitions_carry_across_rollouts():
    flags = [(1.0, 0, 0, 0), (1.0, 1, 0, 1), (0.0, 0, 0, 0), (3.0, 1, 0, 1)]
    columns = [np.array([[row[i]] for row in flags]) for i in range(4)]

    def args(sl):
        return (columns[0][sl].astype(np.float32),) * 2 + tuple(c[sl].astype(bool) for c in columns[1:])

    state, (_, _, valid_a, stats_a) = episode_transitions(EpisodeState.initial(1), *args(slice(0, 2)))
    state, (_, _, valid_b, stats_b) = episode_transitions(state, *args(slice(2, 4)))
    assert not bool(valid_b[0, 0])  # the reset step at the start of the second rollout
    assert float(stats_a.episode_return[1, 0]) == 2.0 and float(stats_b.episode_return[1, 0]) == 3.0


def _run_host_env(env, steps, policy):
    """Steps ``env``; returns per-step (reward, discount, valid, EpisodeStats) as numpy arrays."""
    obs = env.reset()
    state = EpisodeState.initial(env.num_envs)
    transitions = jax.jit(episode_transitions)
    out = []
    for _ in range(steps):
        env.send(policy(obs))
        step = env.recv()
        state, (reward, discount, valid, stats) = transitions(state, *(np.asarray(x)[None] for x in step[1:]))
        out.append(jax.tree.map(lambda x: np.asarray(x)[0], (reward, discount, valid, stats)))
        obs = step.obs
    return out


def _balancing_actions(obs):
    """A linear controller that keeps the pole up and the cart near the centre for 500+ steps."""
    return (obs @ np.array([0.1, 0.3, 1.0, 1.0]) > 0).astype(np.int32)


def test_envpool_cartpole_truncates_at_500_steps_and_then_resets():
    env = HostEnv("CartPole-v1", num_envs=2, seed=0)
    steps = _run_host_env(env, 501, _balancing_actions)
    for t, (reward, discount, valid, stats) in enumerate(steps, start=1):
        if t < 500:
            assert valid.all() and not stats.done.any()
        elif t == 500:
            assert stats.done.all() and (discount == 1).all()  # truncated, not terminated
            np.testing.assert_array_equal(stats.episode_length, [500, 500])
            np.testing.assert_array_equal(stats.episode_return, [500.0, 500.0])
        else:
            assert not valid.any() and (reward == 0).all()  # the reset step
    env.close()


def test_envpool_cartpole_termination_does_not_bootstrap():
    env = HostEnv("CartPole-v1", num_envs=4, seed=1)
    ended = 0
    for _reward, discount, _valid, stats in _run_host_env(env, 200, lambda obs: np.zeros(4, np.int32)):
        assert (discount[stats.done] == 0).all() and (discount[~stats.done] == 1).all()
        ended += stats.done.sum()
    assert ended >= 40
    env.close()


@pytest.mark.slow
def test_atari_preset_layout_clipping_and_episodic_life():
    env = HostEnv("Breakout-v5", num_envs=4, seed=3, config=HostEnvConfig())
    assert env.spec.observation.shape == (84, 84, 4) and env.spec.observation.dtype == np.uint8
    assert env.frame_skip == 4 and env.spec.num_actions == 4
    assert env.reset().shape == (4, 4, 84, 84)
    assert env.to_agent_layout(np.zeros((3, 4, 84, 84), np.uint8)).shape == (3, 84, 84, 4)
    rng = np.random.default_rng(0)
    terminations, train_reward, games = np.zeros(4, int), np.zeros(4), []
    for reward, discount, _valid, stats in _run_host_env(
        env, 3000, lambda obs: rng.integers(4, size=4, dtype=np.int32)
    ):
        assert set(np.unique(reward)) <= {0.0, 1.0}  # clipped for training
        terminations += discount == 0
        train_reward += reward
        for i in np.flatnonzero(stats.done):
            games.append((terminations[i], train_reward[i], stats.episode_return[i]))
            terminations[i], train_reward[i] = 0, 0
    assert len(games) >= 4
    for lives_lost, clipped, score in games:
        assert lives_lost == 5  # every life lost ended a training episode; the game ended with the last
        assert score >= clipped  # the logged score is the unclipped game score (bricks are worth 1, 4 or 7)
    env.close()


def test_unknown_envpool_ids_and_atari_flags_elsewhere_are_refused():
    with pytest.raises(ValueError, match="unknown envpool environment 'Brekout-v5'"):
        HostEnv("Brekout-v5", 2, 0)
    with pytest.raises(ValueError, match="--sticky-actions, --reward-clip apply to Atari games; HalfCheetah-v4"):
        HostEnv("HalfCheetah-v4", 2, 0, HostEnvConfig(sticky_actions=True, reward_clip=False))


def test_mujoco_tasks_take_float_actions_and_give_float32_observations():
    env = HostEnv("HalfCheetah-v4", 2, 0)
    try:
        assert env.spec.actions == Box((-1.0,) * 6, (1.0,) * 6) and not env.spec.discrete
        assert env.spec.observation.shape == (17,) and env.spec.observation.dtype == np.float32
        env.reset()
        env.send(np.full((2, 6), 0.5, np.float32))
        step = env.recv()
        assert step.obs.shape == (2, 17) and np.all(step.reward == step.real_reward)
        assert not step.terminated.any() and not step.game_over.any()
    finally:
        env.close()
