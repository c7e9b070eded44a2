"""Host environments for Sebulba: batches of envpool environments stepped in C++ threads.

:class:`HostEnv` is one batch (one actor thread's). Any envpool task runs: Atari,
classic control, and continuous control (MuJoCo: ``HalfCheetah-v4``,
``Hopper-v4``, ...; DeepMind Control: ``CheetahRun-v1``, ...), whose float64
observations reach the agents as float32 and whose actions the agents keep
within the task's bounds (envpool does not clip them). Atari ids get the
standard protocol: frame-skip 4, 84x84 grayscale, a 4-frame stack, up to 30
no-op starts, a 108k-frame (27k-step) limit and, for training, episodic life and
reward clipping, while the *logged* episode return is the real game score over
all lives. Sticky actions (probability 0.25) are an option.

envpool resets an environment on the step *after* it ended, ignoring that
step's action; :func:`episode_transitions` turns envpool's flags into the
``discount``/``valid`` convention of :class:`podracer.types.Trajectory`, on
device, once per rollout.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from podracer.config import flag_name, knob
from podracer.envs.base import action_spec
from podracer.types import EnvSpec, EpisodeStats

ATARI_FRAME_SKIP = 4
ATARI_MAX_EPISODE_FRAMES = 108_000
STICKY_ACTION_PROBABILITY = 0.25
ATARI_KNOBS = ("sticky_actions", "episodic_life", "reward_clip")  # HostEnvConfig fields that only Atari reads


@dataclasses.dataclass(frozen=True)
class HostEnvConfig:
    sticky_actions: bool = knob(False, "Atari: repeat the previous action with probability 0.25")
    episodic_life: bool = knob(
        True, "Atari: a lost life terminates the training episode (the logged score spans all lives)"
    )
    reward_clip: bool = knob(True, "Atari: train on rewards clipped to their sign (the logged score is unclipped)")
    mask_observations: tuple[int, ...] = knob(
        (),
        "zero these entries of vector observations before the agent sees them, e.g. 1 3: CartPole-v1 without "
        "its velocities (a partially observed task for --core)",
        minimum=0,
    )
    env_threads: int = knob(
        0,
        "envpool worker threads per actor thread; 0: the host's cores shared among actor threads",
        minimum=0,
        maximum=1024,  # envpool aborted the process natively (exit 134) at 100,000
    )


class HostStep(NamedTuple):
    """envpool's raw outputs for one batched step (numpy, ``[B]`` unless stated).

    :func:`episode_transitions` turns a rollout of these flags into the
    ``reward``/``discount``/``valid`` of a :class:`podracer.types.Trajectory`.

    Attributes:
      obs: ``[B, ...]`` next observations, in envpool's layout.
      reward: the training reward (clipped for Atari).
      real_reward: the game's own reward (the logged score adds these up).
      terminated: the training episode terminated (a lost life counts, with episodic life).
      truncated: the time limit was reached.
      game_over: the real episode (all lives) ended.
    """

    obs: np.ndarray
    reward: np.ndarray
    real_reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    game_over: np.ndarray


class EpisodeState(NamedTuple):
    """What :func:`episode_transitions` carries from one rollout to the next (``[B]`` each)."""

    ended: jax.Array  # bool: the last observation ended a training episode (envpool resets it next step)
    game_over: jax.Array  # bool: ... and the real episode with it
    episode_return: jax.Array  # float32: real score so far
    episode_length: jax.Array  # int32: agent steps so far

    @classmethod
    def initial(cls, num_envs: int) -> EpisodeState:
        false = jnp.zeros(num_envs, bool)
        return cls(false, false, jnp.zeros(num_envs, jnp.float32), jnp.zeros(num_envs, jnp.int32))


def episode_transitions(state: EpisodeState, reward, real_reward, terminated, truncated, game_over):
    """envpool's flags ``[T, B]`` to the Trajectory convention, and statistics of the games that ended.

    envpool resets an environment on the step after it ended, ignoring that
    step's action: those steps are ``valid = False``. Only termination (a lost
    life, with episodic life) zeroes the discount. After a lost life the game
    goes on, so the logged score keeps adding up until the game is over.

    Returns:
      ``(state, (reward, discount, valid, EpisodeStats))``, each ``[T, B]``.
    """

    def step(state, flags):
        reward, real_reward, terminated, truncated, game_over = flags
        valid = ~state.ended
        new_game = state.ended & state.game_over
        returns = jnp.where(new_game, 0.0, state.episode_return) + jnp.where(valid, real_reward, 0.0)
        lengths = jnp.where(new_game, 0, state.episode_length) + valid
        done = valid & game_over
        state = EpisodeState(valid & (terminated | truncated), done, returns, lengths)
        out = (
            jnp.where(valid, reward, 0.0),
            jnp.where(valid & terminated, 0.0, 1.0),
            valid,
            EpisodeStats(done, jnp.where(done, returns, 0.0), jnp.where(done, lengths, 0)),
        )
        return state, out

    flags = (reward.astype(jnp.float32), real_reward.astype(jnp.float32), terminated, truncated, game_over)
    return jax.lax.scan(step, state, flags)


def host_restarts(ended: np.ndarray, step: HostStep) -> tuple[np.ndarray, np.ndarray]:
    """On the host, per step: where the observation ``step`` returned begins an episode for the agent's core
    state (:func:`podracer.types.episode_restarts` of the step :func:`episode_transitions` makes of it), and
    the new ``ended`` (``[B]`` bool: that observation ended a training episode, so envpool resets it next)."""
    valid = ~ended
    return ended | step.terminated, valid & (step.terminated | step.truncated)


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

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int,
        config: HostEnvConfig = HostEnvConfig(),
        num_threads: int = 1,
        render: bool = False,
    ):
        import envpool

        if env_id not in envpool.list_all_envs():
            raise ValueError(
                f"unknown envpool environment {env_id!r} (see envpool.list_all_envs(), e.g. Breakout-v5, CartPole-v1)"
            )
        self.atari = is_atari(env_id)
        if not self.atari:
            changed = [
                f.name
                for f in dataclasses.fields(config)
                if f.name in ATARI_KNOBS and getattr(config, f.name) != f.default
            ]
            if changed:
                verb = "applies" if len(changed) == 1 else "apply"
                raise ValueError(f"{', '.join(map(flag_name, changed))} {verb} to Atari games; {env_id} is not one")
        options = dict(num_envs=num_envs, batch_size=num_envs, seed=seed, num_threads=num_threads)
        if render:  # frames for videos (:meth:`render`)
            options["render_mode"] = "rgb_array"
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
        dtype = np.float32 if space.dtype == np.float64 else space.dtype  # JAX computes in float32
        self.spec = EnvSpec(jax.ShapeDtypeStruct(shape, dtype), action_spec(env_id, self.env.action_space))
        self._action_dtype = np.int32 if self.spec.discrete else np.float32
        self._masked = np.asarray(config.mask_observations, np.int32)
        if self._masked.size and (self.spec.images or self._masked.max() >= math.prod(shape)):
            self.env.close()
            masked = f"--mask-observations {' '.join(map(str, config.mask_observations))}"
            if self.spec.images:
                raise ValueError(f"{masked}: {env_id}'s observations are images {shape}; it masks vector entries")
            raise ValueError(
                f"{masked}: {env_id}'s observations have {math.prod(shape)} entries; give indices below it"
            )
        self._env_ids = np.arange(num_envs, dtype=np.int32)

    def to_agent_layout(self, obs: jax.Array) -> jax.Array:
        """Device-side: envpool's ``[..., C, H, W]`` frames to the agents' ``[..., H, W, C]``; entries of
        ``--mask-observations`` zeroed."""
        if self._masked.size:
            return obs.at[..., self._masked].set(0)
        return _to_channels_last(obs) if self.atari else obs

    def reset(self) -> np.ndarray:
        obs, _ = self.env.reset()
        return obs

    def send(self, action: np.ndarray) -> None:
        self.env.send(np.asarray(action, self._action_dtype), self._env_ids)

    def recv(self) -> HostStep:
        obs, reward, terminated, truncated, info = self.env.recv()
        real_reward = info["reward"] if self.atari else reward
        game_over = (info["terminated"].astype(bool) if self.atari else terminated) | truncated
        return HostStep(obs, reward, real_reward, terminated, truncated, game_over)

    def render(self) -> np.ndarray:
        """``[B, H, W, 3]`` uint8 pictures of the environments (made with ``render=True``; Atari works anywhere,
        MuJoCo needs an OpenGL context)."""
        return np.asarray(self.env.render())

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()
