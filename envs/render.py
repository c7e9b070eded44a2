"""Frames for videos of the built-in jittable environments (host-side numpy; see ``podracer eval --video``)."""

from __future__ import annotations

import numpy as np

from envs.cartpole import X_LIMIT, CartPole
from envs.catch import Catch

CELL = 24  # pixels per Catch cell
WIDTH, HEIGHT = 480, 240  # CartPole frames


def _catch_frame(env: Catch, state) -> np.ndarray:
    frame = np.full((env.rows * CELL, env.columns * CELL, 3), 30, np.uint8)
    for row, column, colour in ((int(state.ball_row), int(state.ball_column), (250, 200, 40)),
                                (env.rows - 1, int(state.paddle_column), (80, 160, 250))):
        frame[row * CELL + 2:(row + 1) * CELL - 2, column * CELL + 2:(column + 1) * CELL - 2] = colour
    return frame


def _cartpole_frame(state) -> np.ndarray:
    x, _, theta, _ = (float(v) for v in np.asarray(state))
    frame = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)
    scale = WIDTH / (2 * X_LIMIT)
    ground = int(HEIGHT * 0.75)
    frame[ground, :] = 0
    cart_x = int(WIDTH / 2 + x * scale)
    frame[ground - 15:ground + 5, max(cart_x - 25, 0):max(min(cart_x + 25, WIDTH), 0)] = (40, 40, 40)
    pole = 2 * 0.5 * scale  # the pole is 1 m long (twice its half-length)
    for t in np.linspace(0.0, 1.0, 200):  # the pole, drawn as a thick line of dots
        px, py = int(cart_x + t * pole * np.sin(theta)), int(ground - 15 - t * pole * np.cos(theta))
        frame[max(py - 3, 0):max(py + 3, 0), max(px - 3, 0):max(px + 3, 0)] = (200, 120, 60)
    return frame


def frame(env, env_state) -> np.ndarray:
    """``[H, W, 3]`` uint8 picture of one (unbatched) state of ``env`` (the raw environment, not auto-reset)."""
    if isinstance(env, Catch):
        return _catch_frame(env, env_state)
    if isinstance(env, CartPole):
        return _cartpole_frame(env_state)
    raise ValueError(f"no frames are drawn for {type(env).__name__} yet: videos come from catch and cartpole "
                     "(Anakin) and from envpool's Atari games (Sebulba)")
