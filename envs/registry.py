"""Environment names accepted by the command line and :func:`make`."""

from __future__ import annotations

from envs.autoreset import AutoReset
from envs.cartpole import CartPole
from envs.catch import Catch
from envs.gymnax_adapter import GymnaxEnv

JAX_ENVS = {"catch": Catch, "cartpole": CartPole}
GYMNAX_PREFIX = "gymnax:"


def make(name: str) -> AutoReset:
    """An auto-resetting jittable environment: ``catch``, ``cartpole`` or ``gymnax:<id>``."""
    if name.startswith(GYMNAX_PREFIX):
        return AutoReset(GymnaxEnv(name[len(GYMNAX_PREFIX):]))
    if name not in JAX_ENVS:
        raise ValueError(
            f"unknown environment {name!r}: choose one of {sorted(JAX_ENVS)} or 'gymnax:<id>' "
            "(e.g. gymnax:Acrobot-v1)"
        )
    return AutoReset(JAX_ENVS[name]())
