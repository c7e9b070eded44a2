"""Host (envpool) environments: reset steps, termination vs truncation, Atari's episodic life and real scores."""

import numpy as np
import pytest

from envs.host import HostEnv, HostEnvConfig, HostEpisodes


def test_episodes_mark_reset_steps_and_keep_scores_across_lives():
    episodes = HostEpisodes(1)
    zero, one = np.zeros(1, bool), np.ones(1, bool)

    def step(reward, terminated=zero, truncated=zero, game_over=zero):
        r = np.full(1, reward, np.float32)
        return episodes.step(None, np.sign(r), r, terminated, truncated, game_over)

    s = step(4.0)
    assert s.valid[0] and s.discount[0] == 1 and s.reward[0] == 1
    s = step(7.0, terminated=one)  # a life lost: the training episode ends, the game goes on
    assert s.discount[0] == 0 and not s.episode.done[0]
    s = step(0.0)  # envpool's reset step after the lost life
    assert not s.valid[0] and s.reward[0] == 0
    s = step(1.0, terminated=one, game_over=one)  # game over
    assert s.discount[0] == 0 and s.episode.done[0]
    assert s.episode.episode_return[0] == 12.0 and s.episode.episode_length[0] == 3
    assert not step(0.0).valid[0]  # the reset into a new game
    s = step(2.0, truncated=one, game_over=one)  # time limit: bootstraps, ends the game
    assert s.discount[0] == 1 and s.episode.done[0] and s.episode.episode_return[0] == 2.0


def _balancing_actions(obs):
    """A linear controller that keeps the pole up and the cart near the centre for 500+ steps."""
    return (obs @ np.array([0.1, 0.3, 1.0, 1.0]) > 0).astype(np.int32)


def test_envpool_cartpole_truncates_at_500_steps_and_then_resets():
    env = HostEnv("CartPole-v1", num_envs=2, seed=0)
    obs = env.reset()
    for t in range(1, 502):
        env.send(_balancing_actions(obs))
        step = env.recv()
        obs = step.obs
        if t < 500:
            assert step.valid.all() and not step.episode.done.any()
        elif t == 500:
            assert step.episode.done.all() and (step.discount == 1).all()  # truncated, not terminated
            np.testing.assert_array_equal(step.episode.episode_length, [500, 500])
            np.testing.assert_array_equal(step.episode.episode_return, [500.0, 500.0])
        else:
            assert not step.valid.any() and (step.reward == 0).all()  # the reset step
    env.close()


def test_envpool_cartpole_termination_does_not_bootstrap():
    env = HostEnv("CartPole-v1", num_envs=4, seed=1)
    env.reset()
    ended = 0
    for _ in range(200):
        env.send(np.zeros(4, np.int32))  # always push left: falls within ~10 steps
        step = env.recv()
        done = step.episode.done
        assert (step.discount[done] == 0).all() and (step.discount[~done] == 1).all()
        ended += done.sum()
    assert ended >= 40
    env.close()


def test_atari_preset_layout_clipping_and_episodic_life():
    env = HostEnv("Breakout-v5", num_envs=4, seed=3, config=HostEnvConfig())
    assert env.spec.observation.shape == (84, 84, 4) and env.spec.observation.dtype == np.uint8
    assert env.frame_skip == 4 and env.spec.num_actions == 4
    obs = env.reset()
    assert obs.shape == (4, 4, 84, 84)
    rng = np.random.default_rng(0)
    terminations = np.zeros(4, int)
    train_reward = np.zeros(4)
    games = []
    for _ in range(3000):
        env.send(rng.integers(4, size=4, dtype=np.int32))
        step = env.recv()
        assert set(np.unique(step.reward)) <= {0.0, 1.0}  # clipped for training
        terminations += step.discount == 0
        train_reward += step.reward
        for i in np.flatnonzero(step.episode.done):
            games.append((terminations[i], train_reward[i], step.episode.episode_return[i]))
            terminations[i] = 0
            train_reward[i] = 0
    assert len(games) >= 4
    for lives_lost, clipped, score in games:
        assert lives_lost == 5  # every life lost ended a training episode; the game ended with the last
        assert score >= clipped  # the logged score is the unclipped game score (bricks are worth 1, 4 or 7)
    env.close()


def test_unknown_or_continuous_envpool_ids_are_refused():
    with pytest.raises(ValueError, match="unknown envpool environment 'Brekout-v5'"):
        HostEnv("Brekout-v5", 2, 0)
    with pytest.raises(ValueError, match="continuous action space"):
        HostEnv("Pendulum-v1", 2, 0)
