"""A replay buffer that lives on the learner device, one per data replica.

Each replica keeps its own environments' streams (Menger's sharded replay):
a time-circular store of ``capacity`` steps for each of its ``B``
environments. Every learner call appends its share of the new trajectory, so
each environment's column stays in time order and windows of consecutive steps
can be sampled for K-step model unrolls and n-step returns. Sampling is uniform
or proportional to priorities (``p ** alpha``, with importance weights).

Time indices are absolute (steps since the start); slot ``t % capacity`` holds
step ``t``. ``position`` is the index of the newest stored observation.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from podracer.types import ArrayTree, Trajectory


class Replay(NamedTuple):
    obs: ArrayTree  # [capacity, B, ...]: obs of step t in slot t % capacity
    action: jax.Array  # [capacity, B]: transition t (obs t -> obs t + 1)
    reward: jax.Array  # [capacity, B]
    discount: jax.Array  # [capacity, B]
    valid: jax.Array  # [capacity, B]
    extras: ArrayTree  # [capacity, B, ...]
    priority: jax.Array  # [capacity, B] float32
    position: jax.Array  # int32: index of the newest observation; -1 while empty


class Sample(NamedTuple):
    """``window`` consecutive steps of ``batch`` (time, env) starts, ``[batch, window, ...]``."""

    obs: ArrayTree
    action: jax.Array
    reward: jax.Array
    discount: jax.Array
    valid: jax.Array
    extras: ArrayTree
    weight: jax.Array  # [batch] importance weights (1 for uniform sampling), at most 1
    start: jax.Array  # [batch] absolute time of each start
    env: jax.Array  # [batch] environment column of each start


TRAJECTORY_FIELDS = ("obs", "action", "reward", "discount", "valid", "extras")  # what Replay and Sample keep


def _map_fields(fn, source) -> dict:
    """``fn`` on every array of ``source``'s trajectory fields (a Trajectory, Replay or their shapes)."""
    return {name: jax.tree.map(fn, getattr(source, name)) for name in TRAJECTORY_FIELDS}


def replay_init(example: Trajectory, capacity: int) -> Replay:
    """An empty buffer shaped like ``example`` (a ``[T(+1), B, ...]`` trajectory, or its shapes)."""

    def store(x):
        return jnp.zeros((capacity, *x.shape[1:]), x.dtype)

    b = example.action.shape[1]
    return Replay(
        **_map_fields(store, example),
        priority=jnp.zeros((capacity, b), jnp.float32),
        position=jnp.int32(-1),
    )


def capacity_of(replay: Replay) -> int:
    return replay.action.shape[0]


def replay_add(replay: Replay, traj: Trajectory) -> Replay:
    """Appends ``T`` transitions and ``T + 1`` observations; ``traj.obs[0]`` is the newest stored one (or the first)."""
    capacity = capacity_of(replay)
    t_len = traj.action.shape[0]
    if t_len >= capacity:
        raise ValueError(f"a replay of {capacity} steps per environment cannot hold trajectories of {t_len} steps")
    first = jnp.maximum(replay.position, 0)  # traj.obs[0] continues the stream at the newest position
    obs_slots = (first + jnp.arange(t_len + 1)) % capacity
    slots = obs_slots[:-1]

    def put(store, new, at):
        return store.at[at].set(new)

    stored = jnp.where(replay.position >= 0, jnp.max(replay.priority), 1.0)
    return Replay(
        obs=jax.tree.map(lambda s, n: put(s, n, obs_slots), replay.obs, traj.obs),
        action=put(replay.action, traj.action, slots),
        reward=put(replay.reward, traj.reward, slots),
        discount=put(replay.discount, traj.discount, slots),
        valid=put(replay.valid, traj.valid, slots),
        extras=jax.tree.map(lambda s, n: put(s, n, slots), replay.extras, traj.extras),
        priority=put(replay.priority, jnp.full(traj.action.shape, jnp.maximum(stored, 1e-6)), slots),
        position=first + t_len,
    )


def sample_mask(replay: Replay, window: int) -> jax.Array:
    """``[capacity, B]`` bool: the slots that can start a window of ``window`` stored observations.

    The whole window, and the transition out of its last observation (whose
    ``valid`` says whether that observation ended an episode), must be stored
    and not yet overwritten; the start must be a real step (not an auto-reset).
    """
    capacity = capacity_of(replay)
    slot = jnp.arange(capacity)
    time = replay.position - (replay.position - slot) % capacity  # the absolute step each slot holds
    stored = (time >= 0) & (time >= replay.position - capacity + 1) & (time + window <= replay.position)
    return stored[:, None] & replay.valid


def replay_sample(
    replay: Replay, key: jax.Array, batch: int, window: int, alpha: float = 0.0, beta: float = 0.0
) -> Sample:
    """Samples ``batch`` windows; ``alpha = 0`` is uniform, else proportional to ``priority ** alpha``.

    Callers must check ``sample_mask(...).any()`` (see :func:`can_sample`) and discard the result otherwise.
    """
    capacity, num_envs = replay.action.shape
    mask = sample_mask(replay, window).reshape(-1)
    # Inverse-CDF sampling: O(slots + batch log slots); jax.random.categorical would draw batch x slots Gumbels.
    weights = jnp.where(mask, replay.priority.reshape(-1) ** alpha if alpha > 0 else 1.0, 0.0)
    cdf = jnp.cumsum(weights)
    total = jnp.maximum(cdf[-1], 1e-12)
    flat = jnp.searchsorted(cdf, jax.random.uniform(key, (batch,)) * total, side="right")
    flat = jnp.minimum(flat, mask.size - 1)
    slot, env = flat // num_envs, flat % num_envs
    if alpha > 0:
        weight = (mask.sum() * weights[flat] / total) ** -beta
        weight = weight / weight.max()
    else:
        weight = jnp.ones(batch, jnp.float32)
    time = replay.position - (replay.position - slot) % capacity
    steps = (slot[:, None] + jnp.arange(window)) % capacity  # [batch, window]

    def gather(store):
        return store[steps, env[:, None]]

    return Sample(
        **_map_fields(gather, replay),
        weight=weight,
        start=time,
        env=env,
    )


def can_sample(replay: Replay, window: int, min_steps: int) -> jax.Array:
    """bool: at least ``min_steps`` steps per environment are stored and some window is complete."""
    return (replay.position >= min_steps) & sample_mask(replay, window).any()


def update_priorities(replay: Replay, sample: Sample, priority: jax.Array) -> Replay:
    """Sets the priorities of the sampled starts (``[batch]``)."""
    slot = sample.start % capacity_of(replay)
    return replay._replace(priority=replay.priority.at[slot, sample.env].set(jnp.maximum(priority, 1e-6)))
