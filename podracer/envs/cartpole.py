"""CartPole-v1 in JAX with gymnasium's dynamics, termination and time limit.

Same constants and explicit-Euler integration as ``gymnasium.envs.classic_control.
CartPoleEnv``; reward 1 on every step, the terminating one included; terminated
when the cart leaves +-2.4 or the pole passes +-12 degrees; truncated after 500
steps (gymnasium's registration of ``CartPole-v1``). Computed in float32, where
gymnasium integrates in float64 (``tests/test_envs.py`` compares them).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from podracer.types import Discrete, EnvSpec

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_CART + MASS_POLE
HALF_POLE_LENGTH = 0.5
POLE_MASS_LENGTH = MASS_POLE * HALF_POLE_LENGTH
FORCE = 10.0
TAU = 0.02
THETA_LIMIT = 12 * 2 * math.pi / 360
X_LIMIT = 2.4
RESET_BOUND = 0.05
MAX_EPISODE_STEPS = 500


class CartPole:
    """State and observation are the same float32 ``[4]`` vector: x, x_dot, theta, theta_dot."""

    spec = EnvSpec(jax.ShapeDtypeStruct((4,), jnp.float32), Discrete(2))
    max_episode_steps = MAX_EPISODE_STEPS

    def reset(self, key):
        state = jax.random.uniform(key, (4,), jnp.float32, -RESET_BOUND, RESET_BOUND)
        return state, state

    def step(self, state, action, key):
        del key  # deterministic
        x, x_dot, theta, theta_dot = state
        force = jnp.where(action == 1, FORCE, -FORCE)
        cos, sin = jnp.cos(theta), jnp.sin(theta)
        temp = (force + POLE_MASS_LENGTH * theta_dot**2 * sin) / TOTAL_MASS
        theta_acc = (GRAVITY * sin - cos * temp) / (HALF_POLE_LENGTH * (4.0 / 3.0 - MASS_POLE * cos**2 / TOTAL_MASS))
        x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS
        state = jnp.stack([x + TAU * x_dot, x_dot + TAU * x_acc, theta + TAU * theta_dot, theta_dot + TAU * theta_acc])
        terminated = (jnp.abs(state[0]) > X_LIMIT) | (jnp.abs(state[2]) > THETA_LIMIT)
        return state, state, jnp.float32(1.0), terminated
