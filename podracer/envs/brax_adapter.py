"""Runs Brax environments (``pip install ".[brax]"``) through :class:`podracer.envs.base.Environment`.

``--env brax:<name>`` (e.g. ``brax:ant``, ``brax:halfcheetah``, ``brax:hopper``,
``brax:inverted_pendulum``) uses Brax's default physics pipeline;
``brax:<name>:<backend>`` picks one (``generalized``, ``positional``, ``spring``
or ``mjx``; on a CPU ``spring`` is the fastest). The environment is Brax's raw
one, without Brax's training wrappers: its ``done`` is termination only, and
the time limit (Brax's usual 1000 steps) is a truncation applied by
:class:`podracer.envs.autoreset.AutoReset`, so the last step of a timed-out episode
bootstraps, where Brax's own ``EpisodeWrapper`` folds it into ``done``.
Actions are vectors in ``[-1, 1]``, as Brax defines them.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import jax
import jax.numpy as jnp

from podracer.types import Box, EnvSpec

EPISODE_LENGTH = 1000
BACKENDS = ("generalized", "positional", "spring", "mjx")


def _import_brax_envs():
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # mujoco's mjx prints that the optional warp is missing
            from brax import envs
    except ImportError as error:
        raise ValueError(f'Brax environments need the optional extra: pip install ".[brax]" ({error})') from None
    return envs


class BraxEnv:
    def __init__(self, name: str, episode_length: int = EPISODE_LENGTH):
        env_name, _, backend = name.partition(":")
        if backend and backend not in BACKENDS:
            raise ValueError(f"unknown Brax backend {backend!r} in brax:{name}: choose one of {BACKENDS}")
        brax_envs = _import_brax_envs()
        known = sorted(brax_envs._envs) if hasattr(brax_envs, "_envs") else None
        if known is not None and env_name not in known:
            raise ValueError(f"unknown Brax environment {env_name!r}; Brax knows: {', '.join(known)}")
        with warnings.catch_warnings():  # Brax's note that it is no longer actively developed, on every env
            warnings.simplefilter("ignore", UserWarning)
            self.env = brax_envs.get_environment(env_name, **({"backend": backend} if backend else {}))
        self.max_episode_steps = episode_length
        size = self.env.action_size
        _, obs = jax.eval_shape(self.reset, jax.random.key(0))
        self.spec = EnvSpec(jax.ShapeDtypeStruct(obs.shape, jnp.float32), Box((-1.0,) * size, (1.0,) * size))

    def reset(self, key):
        state = self.env.reset(jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key)
        return state, state.obs.astype(jnp.float32)

    def step(self, state, action, key):
        del key  # Brax's physics is deterministic
        state = self.env.step(state, action)
        reward = jnp.asarray(state.reward, jnp.float32)  # some envs return a Python float
        return state.replace(reward=reward), state.obs.astype(jnp.float32), reward, jnp.asarray(state.done) > 0.5
