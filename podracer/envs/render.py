"""Pictures for videos of Anakin's jittable environments (host-side numpy; see ``podracer eval --video``):
drawn here for catch and cartpole, by gymnax's visualiser for gymnax's environments."""

from __future__ import annotations

import numpy as np

from podracer.envs.cartpole import X_LIMIT, CartPole
from podracer.envs.catch import Catch
from podracer.envs.gymnax_adapter import GymnaxEnv

CELL = 24  # pixels per Catch cell
WIDTH, HEIGHT = 480, 240  # CartPole frames
GYMNAX_PICTURES = (  # what gymnax's visualiser draws (classic control through gymnasium, which needs pygame)
    "Acrobot-v1",
    "CartPole-v1",
    "Pendulum-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Catch-bsuite",
    "Asterix-MinAtar",
    "Breakout-MinAtar",
    "Freeway-MinAtar",
    "Seaquest-MinAtar",
    "SpaceInvaders-MinAtar",
    "Pong-misc",
    "PointRobot-misc",
    "MetaMaze-misc",
    "FourRooms-misc",
)


def _catch_frame(env: Catch, state) -> np.ndarray:
    frame = np.full((env.rows * CELL, env.columns * CELL, 3), 30, np.uint8)
    for row, column, colour in (
        (int(state.ball_row), int(state.ball_column), (250, 200, 40)),
        (env.rows - 1, int(state.paddle_column), (80, 160, 250)),
    ):
        frame[row * CELL + 2 : (row + 1) * CELL - 2, column * CELL + 2 : (column + 1) * CELL - 2] = colour
    return frame


def _cartpole_frame(state) -> np.ndarray:
    x, _, theta, _ = (float(v) for v in np.asarray(state))
    frame = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)
    scale = WIDTH / (2 * X_LIMIT)
    ground = int(HEIGHT * 0.75)
    frame[ground, :] = 0
    cart_x = int(WIDTH / 2 + x * scale)
    frame[ground - 15 : ground + 5, max(cart_x - 25, 0) : max(min(cart_x + 25, WIDTH), 0)] = (40, 40, 40)
    pole = 2 * 0.5 * scale  # the pole is 1 m long (twice its half-length)
    for t in np.linspace(0.0, 1.0, 200):  # the pole, drawn as a thick line of dots
        px, py = int(cart_x + t * pole * np.sin(theta)), int(ground - 15 - t * pole * np.cos(theta))
        frame[max(py - 3, 0) : max(py + 3, 0), max(px - 3, 0) : max(px + 3, 0)] = (200, 120, 60)
    return frame


def draw(env, states: list) -> list[np.ndarray]:
    """``[H, W, 3]`` uint8 pictures of unbatched states of ``env`` (the raw environment, not auto-reset)."""
    if isinstance(env, Catch):
        return [_catch_frame(env, state) for state in states]
    if isinstance(env, CartPole):
        return [_cartpole_frame(state) for state in states]
    if isinstance(env, GymnaxEnv):
        return _gymnax_frames(env, states)
    raise ValueError(
        f"no pictures are drawn for {type(env).__name__} yet: videos come from catch, cartpole and "
        "gymnax's visualiser (Anakin), and from envpool's Atari and classic-control tasks (Sebulba)"
    )


def _gymnax_frames(env: GymnaxEnv, states: list) -> list[np.ndarray]:
    """gymnax's own visualiser (matplotlib), one canvas per state."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from gymnasium.error import DependencyNotInstalled
    from gymnax.visualize import Visualizer

    name = env.env.name
    if name not in GYMNAX_PICTURES:
        raise ValueError(f"gymnax's visualiser draws {', '.join(GYMNAX_PICTURES)}; not {name}")
    visualizer = Visualizer(env.env, env.params, states)
    try:
        visualizer.init()
        frames = []
        for i in range(len(states)):
            visualizer.update(i)
            visualizer.fig.canvas.draw()
            frames.append(np.asarray(visualizer.fig.canvas.buffer_rgba())[..., :3].copy())
        return frames
    except DependencyNotInstalled:  # classic control is drawn by gymnasium, with pygame
        raise ValueError(
            f'gymnax draws {name} through gymnasium, which needs pygame: pip install "gymnasium[classic_control]"'
        ) from None
    finally:
        plt.close(visualizer.fig)
