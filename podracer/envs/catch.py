"""Catch: the grid world of the Podracer paper's Anakin example (bsuite's ``catch``).

A ball falls from a random column of the top row, one row per step; the agent
moves a paddle along the bottom row (left, stay, right). The episode terminates
when the ball reaches the bottom row: reward +1 if the paddle is under it, else -1.
Every episode lasts ``rows - 1`` steps, so returns lie in {-1, +1}.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from podracer.types import Discrete, EnvSpec

ROWS = 10
COLUMNS = 5
NUM_ACTIONS = 3  # left, stay, right


class CatchState(NamedTuple):
    ball_row: jax.Array  # int32 scalar
    ball_column: jax.Array  # int32 scalar
    paddle_column: jax.Array  # int32 scalar


class Catch:
    """Observations are a float32 ``[rows, columns]`` board with the ball and paddle set to 1."""

    max_episode_steps = None

    def __init__(self, rows: int = ROWS, columns: int = COLUMNS):
        self.rows = rows
        self.columns = columns
        self.spec = EnvSpec(jax.ShapeDtypeStruct((rows, columns), jnp.float32), Discrete(NUM_ACTIONS))

    def _observe(self, state: CatchState) -> jax.Array:
        board = jnp.zeros((self.rows, self.columns), jnp.float32)
        board = board.at[state.ball_row, state.ball_column].set(1.0)
        return board.at[self.rows - 1, state.paddle_column].set(1.0)

    def reset(self, key):
        state = CatchState(
            ball_row=jnp.int32(0),
            ball_column=jax.random.randint(key, (), 0, self.columns, jnp.int32),
            paddle_column=jnp.int32(self.columns // 2),
        )
        return state, self._observe(state)

    def step(self, state, action, key):
        del key  # deterministic after reset
        paddle = jnp.clip(state.paddle_column + action.astype(jnp.int32) - 1, 0, self.columns - 1)
        state = CatchState(state.ball_row + 1, state.ball_column, paddle)
        terminated = state.ball_row == self.rows - 1
        caught = state.ball_column == paddle
        reward = jnp.where(terminated, jnp.where(caught, 1.0, -1.0), 0.0).astype(jnp.float32)
        return state, self._observe(state), reward, terminated
