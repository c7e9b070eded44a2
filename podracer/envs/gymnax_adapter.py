"""Runs any gymnax environment (``gymnax>=1.0``), discrete or continuous, through :class:`podracer.envs.base.Environment`.

gymnax's own ``step`` auto-resets and folds the time limit into its outputs; the
adapter calls the underlying ``reset_env``/``step_env`` instead, so that
termination comes from the environment and truncation from
:class:`podracer.envs.autoreset.AutoReset` at the environment's ``max_steps_in_episode``.
gymnax's ``is_terminal`` counts reaching that limit as termination; the adapter
asks it again with the limit lifted, so a time limit keeps bootstrapping.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from podracer.envs.base import action_spec
from podracer.types import EnvSpec

NO_LIMIT = np.iinfo(np.int32).max


class GymnaxEnv:
    def __init__(self, env_id: str):
        import gymnax  # optional at import time: only needed for gymnax ids

        if env_id not in gymnax.registered_envs:
            known = ", ".join(sorted(gymnax.registered_envs))
            raise ValueError(f"unknown gymnax environment {env_id!r}; gymnax knows: {known}")
        self.env, self.params = gymnax.make(env_id)
        self.max_episode_steps = getattr(self.params, "max_steps_in_episode", None)
        self._unlimited = self.params.replace(max_steps_in_episode=NO_LIMIT) if self.max_episode_steps else self.params
        actions = action_spec(f"gymnax:{env_id}", self.env.action_space(self.params))
        _, obs = jax.eval_shape(self.reset, jax.random.key(0))
        self.spec = EnvSpec(jax.ShapeDtypeStruct(obs.shape, obs.dtype), actions)

    @staticmethod
    def _as_float(obs):
        return obs.astype(jnp.float32)

    def reset(self, key):
        obs, state = self.env.reset_env(key, self.params)
        return state, self._as_float(obs)

    def step(self, state, action, key):
        obs, state, reward, _, _ = self.env.step_env(key, state, action, self.params)
        terminated = self.env.is_terminal(state, self._unlimited)
        return state, self._as_float(obs), jnp.asarray(reward, jnp.float32), jnp.asarray(terminated, bool)
