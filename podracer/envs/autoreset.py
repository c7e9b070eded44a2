"""Time limit, auto-reset and episode statistics around a functional environment.

Termination resets at once (the terminal observation is never needed: nothing
bootstraps from it). Truncation keeps the true final observation for one step,
so the learner can bootstrap from it, and the *next* step performs the reset
with ``valid = False`` (its action is ignored), the same convention envpool
follows. Both architectures therefore produce the same :class:`Trajectory`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from podracer.envs.base import Environment, TimeStep
from podracer.types import EnvSpec, EpisodeStats


class AutoResetState(NamedTuple):
    env_state: Any
    key: jax.Array
    episode_return: jax.Array  # float32: return so far of the running episode
    episode_length: jax.Array  # int32: steps so far of the running episode
    needs_reset: jax.Array  # bool: the current observation ended a truncated episode


def _select(pred, on_true, on_false):
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


class AutoReset:
    """Wraps one :class:`Environment` instance; ``vmap`` ``reset`` for batches, and ``step_batch`` steps them."""

    def __init__(self, env: Environment):
        self.env = env
        self.spec: EnvSpec = env.spec
        limit = env.max_episode_steps
        self.max_episode_steps = jnp.iinfo(jnp.int32).max if limit is None else int(limit)

    def reset(self, key: jax.Array) -> tuple[AutoResetState, jax.Array]:
        """``key -> (state, obs)``."""
        key, reset_key = jax.random.split(key)
        env_state, obs = self.env.reset(reset_key)
        zero = jnp.zeros((), jnp.int32)
        return AutoResetState(env_state, key, jnp.float32(0.0), zero, jnp.bool_(False)), obs

    def step(self, state: AutoResetState, action: jax.Array) -> tuple[AutoResetState, TimeStep]:
        """``(state, action) -> (state, TimeStep)``; the env's own key travels in ``state``. For a batch, see
        :meth:`step_batch`."""
        return self._restart(*self._advance(state, action))

    def step_batch(self, state: AutoResetState, action: jax.Array) -> tuple[AutoResetState, TimeStep]:
        """:meth:`step` over a batch (leaves ``[B, ...]``), with the same result as ``jax.vmap(step)``, but the
        resets computed only on the steps where an episode of the batch ended: at small batches, most steps end
        none and a reset's draws cost more than the step itself."""
        advanced = jax.vmap(self._advance)(state, action)
        restart = advanced[2]
        return jax.lax.cond(jnp.any(restart), jax.vmap(self._restart), lambda s, t, r, k: (s, t), *advanced)

    def _advance(self, state: AutoResetState, action: jax.Array):
        """The step before any reset: the state and time step as if the episode went on, whether it restarts
        now, and the key its reset takes."""
        key, step_key, reset_key = jax.random.split(state.key, 3)
        env_state, obs, reward, terminated = self.env.step(state.env_state, action, step_key)
        pending = state.needs_reset
        length = state.episode_length + 1
        episode_return = state.episode_return + reward
        truncated = ~terminated & (length >= self.max_episode_steps)
        done = (terminated | truncated) & ~pending
        timestep = TimeStep(
            obs=obs,
            reward=jnp.where(pending, 0.0, reward).astype(jnp.float32),
            discount=jnp.where(terminated & ~pending, 0.0, 1.0).astype(jnp.float32),
            valid=~pending,
            episode=EpisodeStats(done, episode_return, length),
        )
        clear = done | pending
        state = AutoResetState(
            env_state=env_state,
            key=key,
            episode_return=jnp.where(clear, 0.0, episode_return),
            episode_length=jnp.where(clear, 0, length),
            needs_reset=truncated & ~pending,
        )
        return state, timestep, pending | terminated, reset_key

    def _restart(self, state: AutoResetState, timestep: TimeStep, restart: jax.Array, reset_key: jax.Array):
        """``state`` and ``timestep`` with a fresh episode's where ``restart``."""
        reset_state, reset_obs = self.env.reset(reset_key)
        env_state, obs = _select(restart, (reset_state, reset_obs), (state.env_state, timestep.obs))
        return state._replace(env_state=env_state), timestep._replace(obs=obs)
