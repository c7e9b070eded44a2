"""The functional environment interface that Anakin runs on the accelerator."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax

from podracer.types import EnvSpec, EpisodeStats

EnvState = Any


class Environment(Protocol):
    """One jittable environment instance, without auto-reset (``vmap`` it for a batch).

    Attributes:
      spec: observation shape/dtype and number of actions.
      max_episode_steps: the time limit after which an episode is *truncated*
        (``None``: no limit). Applied by :class:`envs.autoreset.AutoReset`.
    """

    spec: EnvSpec
    max_episode_steps: int | None

    def reset(self, key: jax.Array) -> tuple[EnvState, jax.Array]:
        """Starts an episode: ``key -> (state, obs)``."""
        ...

    def step(
        self, state: EnvState, action: jax.Array, key: jax.Array
    ) -> tuple[EnvState, jax.Array, jax.Array, jax.Array]:
        """One transition: ``(state, action, key) -> (state, obs, reward, terminated)``."""
        ...


class TimeStep(NamedTuple):
    """What an auto-resetting environment returns after each step (one instance).

    Attributes:
      obs: the observation to act on next (a reset one after a termination, the
        true final one after a truncation).
      reward: float32 reward of the transition just taken.
      discount: float32, 0. if that transition terminated the episode.
      valid: bool, False if this step only reset the environment (action ignored).
      episode: statistics of the episode that ended at this step, if any.
    """

    obs: jax.Array
    reward: jax.Array
    discount: jax.Array
    valid: jax.Array
    episode: EpisodeStats
