"""Host environments for Sebulba: batches of envpool environments stepped in C++ threads.

:func:`make_host_env` builds one batch (one actor thread's). Atari ids get the
standard protocol: frame-skip 4, 84x84 grayscale, a 4-frame stack, up to 30
no-op starts, a 108k-frame (27k-step) limit and, for training, episodic life and
reward clipping, while the *logged* episode return is the real game score over
all lives. Sticky actions (probability 0.25) are an option.

envpool resets an environment on the step *after* it ended, ignoring that
step's action; :class:`HostEpisodes` turns envpool's flags into the
``discount``/``valid`` convention of :class:`podracer.types.Trajectory`.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from podracer.config import knob
from podracer.types import EnvSpec, EpisodeStats

ATARI_FRAME_SKIP = 4
ATARI_MAX_EPISODE_FRAMES = 108_000
STICKY_ACTION_PROBABILITY = 0.25


@dataclasses.dataclass(frozen=True)
class HostEnvConfig:
    sticky_actions: bool = knob(False, "Atari: repeat the previous action with probability 0.25")
    episodic_life: bool = knob(True, "Atari: a lost life terminates the training episode (the logged score spans all lives)")
    reward_clip: bool = knob(True, "Atari: train on rewards clipped to their sign (the logged score is unclipped)")
    env_threads: int = knob(0, "envpool worker threads per actor thread; 0: the host's cores shared among actor threads")


class HostStep(NamedTuple):
    """One batched step as the learner needs it (numpy, ``[B]`` unless stated).

    Attributes:
      obs: ``[B, ...]`` next observations, in envpool's layout.
      reward: the training reward (clipped for Atari).
      discount: 0. where the transition terminated (a lost life counts, with episodic life).
      valid: False where this step only reset the environment.
      episode: statistics of the real episodes (games) that ended at this step.
    """

    obs: np.ndarray
    reward: np.ndarray
    discount: np.ndarray
    valid: np.ndarray
    episode: EpisodeStats


def is_atari(env_id: str) -> bool:
    from envpool.registration import registry

    return env_id in registry.specs and registry.specs[env_id][0] == "envpool.atari"


def _to_channels_last(obs: jax.Array) -> jax.Array:
    return jnp.moveaxis(obs, -3, -1)  # [..., C, H, W] -> [..., H, W, C]


class HostEnv:
    """``num_envs`` envpool environments; step with :meth:`send` then :meth:`recv`.

    Between ``send`` and ``recv`` the environments step in envpool's threads, so
    the caller can do other work (the actor copies data meanwhile).

    Attributes:
      spec: observation and action spec, images channels-last (the layout the
        agents' conv torsos take); :meth:`to_agent_layout` converts on device.
      frame_skip: emulator frames per agent step (4 for Atari, else 1).
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, config: HostEnvConfig = HostEnvConfig(), num_threads: int = 1):
        import envpool

        if env_id not in envpool.list_all_envs():
            raise ValueError(f"unknown envpool environment {env_id!r} (see envpool.list_all_envs(), e.g. Breakout-v5, CartPole-v1)")
        self.atari = is_atari(env_id)
        options = dict(num_envs=num_envs, batch_size=num_envs, seed=seed, num_threads=num_threads)
        if self.atari:
            options.update(
                episodic_life=config.episodic_life,
                reward_clip=config.reward_clip,
                repeat_action_probability=STICKY_ACTION_PROBABILITY if config.sticky_actions else 0.0,
                max_episode_steps=ATARI_MAX_EPISODE_FRAMES // ATARI_FRAME_SKIP,
                noop_max=30,
                frame_skip=ATARI_FRAME_SKIP,
                stack_num=4,
            )
        with warnings.catch_warnings():  # gymnasium's notes on envpool's float64 bounds
            warnings.simplefilter("ignore", UserWarning)
            self.env = envpool.make(env_id, env_type="gymnasium", **options)
            space = self.env.observation_space
        self.num_envs = num_envs
        self.frame_skip = ATARI_FRAME_SKIP if self.atari else 1
        shape = space.shape[1:] + space.shape[:1] if self.atari else space.shape
        if not hasattr(self.env.action_space, "n"):
            raise ValueError(f"{env_id} has a continuous action space; podracer's agents need discrete actions")
        self.spec = EnvSpec(jax.ShapeDtypeStruct(shape, space.dtype), int(self.env.action_space.n))
        self.episodes = HostEpisodes(num_envs)
        self._env_ids = np.arange(num_envs, dtype=np.int32)

    def to_agent_layout(self, obs: jax.Array) -> jax.Array:
        """Device-side: envpool's ``[..., C, H, W]`` frames to the agents' ``[..., H, W, C]``."""
        return _to_channels_last(obs) if self.atari else obs

    def reset(self) -> np.ndarray:
        obs, _ = self.env.reset()
        self.episodes = HostEpisodes(self.num_envs)
        return obs

    def send(self, action: np.ndarray) -> None:
        self.env.send(np.asarray(action, np.int32), self._env_ids)

    def recv(self) -> HostStep:
        obs, reward, terminated, truncated, info = self.env.recv()
        real_reward = info["reward"] if self.atari else reward
        game_over = (info["terminated"].astype(bool) if self.atari else terminated) | truncated
        return self.episodes.step(obs, reward, real_reward, terminated, truncated, game_over)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


class HostEpisodes:
    """Tracks which steps are resets and the real episodes' returns and lengths."""

    def __init__(self, num_envs: int):
        self.ended = np.zeros(num_envs, bool)  # the last observation ended a training episode
        self.game_over = np.zeros(num_envs, bool)  # ... and the real episode (all lives) too
        self.returns = np.zeros(num_envs, np.float64)
        self.lengths = np.zeros(num_envs, np.int64)

    def step(self, obs, reward, real_reward, terminated, truncated, game_over) -> HostStep:
        valid = ~self.ended  # envpool ignored the action of an env that had ended: this step reset it
        # A life lost with episodic life "resets" without starting a new game: keep counting the score.
        new_game = self.ended & self.game_over
        self.returns = np.where(new_game, 0.0, self.returns) + np.where(valid, real_reward, 0.0)
        self.lengths = np.where(new_game, 0, self.lengths) + valid
        done = valid & game_over
        stats = EpisodeStats(done, np.where(done, self.returns, 0.0), np.where(done, self.lengths, 0))
        self.ended = valid & (terminated | truncated)
        self.game_over = done
        discount = np.where(valid & terminated, 0.0, 1.0).astype(np.float32)
        return HostStep(obs, np.where(valid, reward, 0.0).astype(np.float32), discount, valid, stats)
