"""The functional environment interface that Anakin runs on the accelerator."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax
import numpy as np

from podracer.types import Box, Discrete, EnvSpec, EpisodeStats

EnvState = Any


class Environment(Protocol):
    """One jittable environment instance, without auto-reset (``vmap`` it for a batch).

    Attributes:
      spec: observation shape/dtype and number of actions.
      max_episode_steps: the time limit after which an episode is *truncated*
        (``None``: no limit). Applied by :class:`podracer.envs.autoreset.AutoReset`.
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


def action_spec(env_name: str, space) -> Discrete | Box:
    """The :class:`Discrete` or :class:`Box` of a gym-style action ``space`` (gymnax's or gymnasium's).

    Raises ValueError, naming ``env_name``, for actions podracer cannot take (not a set nor one vector) and for
    bounds that are not finite.
    """
    if hasattr(space, "n"):
        return Discrete(int(space.n))
    shape = tuple(getattr(space, "shape", None) or ())
    if not hasattr(space, "low") or len(shape) != 1:
        raise ValueError(
            f"{env_name} has actions of type {type(space).__name__} shaped {shape}; podracer takes a "
            "discrete set or one vector of continuous actions"
        )
    low, high = (tuple(np.broadcast_to(np.asarray(bound, np.float64), shape)) for bound in (space.low, space.high))
    try:
        return Box(low, high)
    except ValueError as error:
        raise ValueError(f"{env_name}: {error}") from None
