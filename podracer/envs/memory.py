"""Memory: remember a cue over a delay. A jittable task that a feed-forward policy cannot solve.

The first observation shows one of ``num_cues`` cues; ``delay`` blank observations follow; then an
observation with only the query flag set, where the action is scored: +1 if it names the cue, else 0, and the
episode terminates. Actions before the query change nothing. Every episode lasts ``delay + 2`` steps.

A feed-forward policy sees the same query observation whatever the cue, so it names the cue with probability
``1 / num_cues`` at best (its expected return); a policy with memory can score 1 every episode.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from podracer.types import Discrete, EnvSpec

NUM_CUES = 4
DELAY = 8


class MemoryState(NamedTuple):
    cue: jax.Array  # int32 scalar in [0, num_cues)
    time: jax.Array  # int32 scalar: steps taken in the episode


class Memory:
    """Observations are float32 ``[num_cues + 1]``: the cue one-hot (first step only), then the query flag."""

    max_episode_steps = None

    def __init__(self, num_cues: int = NUM_CUES, delay: int = DELAY):
        if num_cues < 2 or delay < 0:
            raise ValueError(f"Memory needs at least 2 cues and a delay of at least 0, got {num_cues} and {delay}")
        self.num_cues, self.delay = num_cues, delay
        self.spec = EnvSpec(jax.ShapeDtypeStruct((num_cues + 1,), jnp.float32), Discrete(num_cues))

    @property
    def query_time(self) -> int:
        return self.delay + 1

    def _observe(self, state: MemoryState) -> jax.Array:
        cue = jax.nn.one_hot(state.cue, self.num_cues) * (state.time == 0)
        return jnp.append(cue, (state.time == self.query_time).astype(jnp.float32))

    def reset(self, key):
        state = MemoryState(jax.random.randint(key, (), 0, self.num_cues, jnp.int32), jnp.int32(0))
        return state, self._observe(state)

    def step(self, state, action, key):
        del key  # deterministic after reset
        terminated = state.time == self.query_time
        reward = (terminated & (action.astype(jnp.int32) == state.cue)).astype(jnp.float32)
        state = state._replace(time=state.time + 1)
        return state, self._observe(state), reward, terminated
