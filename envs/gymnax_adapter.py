"""Runs any discrete-action gymnax environment (``gymnax>=1.0``) through :class:`envs.base.Environment`.

gymnax's own ``step`` auto-resets and folds the time limit into its outputs; the
adapter calls the underlying ``reset_env``/``step_env`` instead, so that
termination comes from the environment and truncation from
:class:`envs.autoreset.AutoReset` at the environment's ``max_steps_in_episode``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from podracer.types import EnvSpec


class GymnaxEnv:
    def __init__(self, env_id: str):
        import gymnax  # optional at import time: only needed for gymnax ids

        if env_id not in gymnax.registered_envs:
            known = ", ".join(sorted(gymnax.registered_envs))
            raise ValueError(f"unknown gymnax environment {env_id!r}; gymnax knows: {known}")
        self.env, self.params = gymnax.make(env_id)
        action_space = self.env.action_space(self.params)
        if not hasattr(action_space, "n"):
            raise ValueError(f"gymnax:{env_id} has a continuous action space; podracer's agents need discrete actions")
        self.max_episode_steps = getattr(self.params, "max_steps_in_episode", None)
        _, obs = jax.eval_shape(self.reset, jax.random.key(0))
        self.spec = EnvSpec(jax.ShapeDtypeStruct(obs.shape, obs.dtype), int(action_space.n))

    @staticmethod
    def _as_float(obs):
        return obs.astype(jnp.float32)

    def reset(self, key):
        obs, state = self.env.reset_env(key, self.params)
        return state, self._as_float(obs)

    def step(self, state, action, key):
        obs, state, reward, terminated, _ = self.env.step_env(key, state, action, self.params)
        return state, self._as_float(obs), jnp.asarray(reward, jnp.float32), jnp.asarray(terminated, bool)
