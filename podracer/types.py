"""The contracts every architecture and agent share.

Shapes are time-major: ``T`` is the rollout length, ``B`` the number of
environments in one batch (one device's, one lane's or one actor thread's).

An :class:`Agent` is a bundle of pure functions. Anakin and Sebulba are two
ways of scheduling the *same* bundle onto devices: neither knows which
algorithm it runs, and no agent knows which architecture runs it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array
PRNGKey = jax.Array
ArrayTree = Any
Params = ArrayTree
LearnerState = ArrayTree
Metrics = dict[str, Array]


class Discrete(NamedTuple):
    """A discrete action set: one int32 action in ``[0, num_actions)`` per environment."""

    num_actions: int


@dataclasses.dataclass(frozen=True)
class Box:
    """Continuous actions: one float32 vector ``[A]`` per environment, each entry within its bounds.

    Attributes:
      low, high: ``A`` finite floats each, ``low < high`` entry by entry.
    """

    low: tuple[float, ...]
    high: tuple[float, ...]

    def __post_init__(self):
        low, high = tuple(float(x) for x in self.low), tuple(float(x) for x in self.high)
        if not low or len(low) != len(high):
            raise ValueError(f"continuous action bounds need as many lows as highs (at least one): {low} vs {high}")
        if not all(math.isfinite(x) for x in low + high):
            raise ValueError(
                f"continuous action bounds must be finite, got low={low}, high={high}: the Gaussian "
                "policies map their samples into the bounds"
            )
        if not all(lo < hi for lo, hi in zip(low, high)):
            raise ValueError(f"continuous action bounds need low < high in every dimension, got {low} and {high}")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    @property
    def shape(self) -> tuple[int]:
        return (len(self.low),)


ActionSpec = Discrete | Box


class EnvSpec(NamedTuple):
    """What an agent needs to know about an environment to build its networks.

    Attributes:
      observation: shape and dtype of one observation (no batch axis).
      actions: :class:`Discrete` (``n`` actions) or :class:`Box` (a float vector within bounds).
    """

    observation: jax.ShapeDtypeStruct
    actions: ActionSpec

    @property
    def images(self) -> bool:
        """Whether observations are images (``[H, W, C]``): what decides every "auto" network and loop choice."""
        return len(self.observation.shape) >= 3

    @property
    def discrete(self) -> bool:
        return isinstance(self.actions, Discrete)

    @property
    def num_actions(self) -> int:
        """The size of a discrete action set (an error for continuous actions)."""
        if not self.discrete:
            raise ValueError(
                f"this environment's actions are continuous ({self.actions.shape[0]}-dimensional), not a discrete set"
            )
        return self.actions.num_actions


class BatchShape(NamedTuple):
    """What every learner call of a run will see, known before anything compiles.

    Agent factories take it to size what depends on the batch (learning-rate
    schedules, replay buffers); ``None`` fields mean "unknown".

    Attributes:
      num_updates: learner calls in the run.
      rollout_len: ``T`` of each trajectory.
      envs_per_replica: ``B`` of each data replica's share of a trajectory.
    """

    num_updates: int | None = None
    rollout_len: int | None = None
    envs_per_replica: int | None = None


class Trajectory(NamedTuple):
    """``T`` transitions of ``B`` environments, with the observation to bootstrap from.

    Transition ``t`` goes from ``obs[t]`` through ``action[t]`` to ``obs[t + 1]``.

    Termination and truncation are kept apart: ``discount[t]`` is 0 only when the
    transition *terminated* the episode, so a time-limit truncation keeps
    bootstrapping from ``obs[t + 1]`` (the true final observation). When an
    environment resets after an episode ends, the step that performs the reset
    has ``valid[t] = False``: its action was ignored and it must not be learnt
    from, and no return may flow across it.

    Attributes:
      obs: ``[T + 1, B, ...]`` observations; ``obs[T]`` is the bootstrap one.
      action: ``[T, B]`` int32 actions (:class:`Discrete`) or ``[T, B, A]`` float32 ones (:class:`Box`), as
        the environment received them.
      reward: ``[T, B]`` float32 reward of each transition.
      discount: ``[T, B]`` float32, 0. where the transition terminated, else 1.
      valid: ``[T, B]`` bool, False on auto-reset steps.
      extras: ``[T, B, ...]`` what ``Agent.act`` returned beside the actions
        (behaviour log-probabilities, search policies, ...).
    """

    obs: ArrayTree
    action: Array
    reward: Array
    discount: Array
    valid: Array
    extras: ArrayTree


class EpisodeStats(NamedTuple):
    """Per-step episode bookkeeping that travels beside a trajectory, for logging.

    Attributes:
      done: ``[..., ]`` bool, an episode ended (terminated or truncated) at this step.
      episode_return: the finished episode's undiscounted return where ``done``
        (for Atari: the real game score, whatever the training reward was).
      episode_length: the finished episode's length in agent steps where ``done``.
    """

    done: Array
    episode_return: Array
    episode_length: Array

    def ended_sums(self) -> tuple[Array, Array, Array]:
        """Scalars over every step: the summed returns and lengths of the episodes that ended, and their count."""
        done = self.done.astype(jnp.float32)
        return jnp.sum(done * self.episode_return), jnp.sum(done * self.episode_length), jnp.sum(done)


def no_core(batch: int) -> tuple:
    """A feed-forward agent's core state: nothing."""
    return ()


class Agent(NamedTuple):
    """One learning algorithm as pure functions; runs unchanged on Anakin and Sebulba.

    Acting carries a *core state* per environment: a recurrent policy's memory
    (``()`` for a feed-forward one). Architectures start it at
    ``initial_core(B)``, thread it from each ``act`` to the next, and put it back
    to the initial one before acting on an observation that begins an episode
    (:func:`reset_core` where :func:`episode_restarts` of the last step).

    Attributes:
      init: ``key -> LearnerState``: parameters, optimiser state, counters (and
        for replay-based agents, the replay buffer).
      actor_params: ``LearnerState -> Params``: selects what acting needs,
        nothing more (the part that is copied to actor devices). A selection,
        not a computation: it is also applied to states stacked per device.
      act: ``(params, obs[B, ...], key, core[B, ...]) -> (action[B, ...], extras, core[B, ...])``: batched
        inference; ``extras`` is a pytree of ``[B, ...]`` arrays stored in the
        :class:`Trajectory` (a recurrent agent keeps there the core it acted from, to replay from).
      learn: ``(LearnerState, Trajectory, key) -> (LearnerState, Metrics)``:
        one update from one replica's share of the batch. It runs on every data
        replica at once (inside ``shard_map``, and ``vmap`` over update lanes)
        and averages gradients over :data:`podracer.parallel.DATA_AXES`, so the
        architecture must bind both axis names. ``key`` is the same on every
        replica. Metrics are scalars.
      act_greedy: ``(params, obs[B, ...], key, core) -> (action[B, ...], core)``: the action the
        agent rates best, for evaluation (the most likely action, the
        Gaussian's mean, the search's most visited action); ``None`` if it has none.
      initial_core: ``B -> core[B, ...]``, the core state of a fresh episode.
    """

    init: Callable[[PRNGKey], LearnerState]
    actor_params: Callable[[LearnerState], Params]
    act: Callable[[Params, ArrayTree, PRNGKey, ArrayTree], tuple[Array, ArrayTree, ArrayTree]]
    learn: Callable[[LearnerState, Trajectory, PRNGKey], tuple[LearnerState, Metrics]]
    act_greedy: Callable[[Params, ArrayTree, PRNGKey, ArrayTree], tuple[Array, ArrayTree]] | None = None
    initial_core: Callable[[int], ArrayTree] = no_core


def episode_restarts(valid: Array, discount: Array) -> Array:
    """Where the observation a step returned begins an episode (``[...]`` bool): after a reset step (``~valid``)
    and after a termination (Anakin resets at once; on Sebulba that observation is the final one, acted on with
    the action ignored, so a fresh core there changes nothing learnt)."""
    return ~valid | (discount == 0.0)


def reset_core(core: ArrayTree, initial: ArrayTree, restart: Array) -> ArrayTree:
    """``core`` (leaves ``[B, ...]``) with the ``initial`` core where ``restart`` (``[B]`` bool)."""

    def pick(fresh, kept):
        return jnp.where(restart.reshape(restart.shape + (1,) * (kept.ndim - 1)), fresh, kept)

    return jax.tree.map(pick, initial, core)
