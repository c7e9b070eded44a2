"""Environment names accepted by the command line and :func:`make`."""

from __future__ import annotations

from podracer.envs.autoreset import AutoReset
from podracer.envs.brax_adapter import BraxEnv
from podracer.envs.cartpole import CartPole
from podracer.envs.catch import Catch
from podracer.envs.gymnax_adapter import GymnaxEnv
from podracer.envs.memory import Memory

JAX_ENVS = {"catch": Catch, "cartpole": CartPole, "memory": Memory}
GYMNAX_PREFIX = "gymnax:"
BRAX_PREFIX = "brax:"


def make(name: str) -> AutoReset:
    """An auto-resetting jittable environment: ``catch``, ``cartpole``, ``memory``, ``gymnax:<id>`` or
    ``brax:<name>[:<backend>]``."""
    if name.startswith(GYMNAX_PREFIX):
        return AutoReset(GymnaxEnv(name[len(GYMNAX_PREFIX) :]))
    if name.startswith(BRAX_PREFIX):
        return AutoReset(BraxEnv(name[len(BRAX_PREFIX) :]))
    if name not in JAX_ENVS:
        raise ValueError(
            f"unknown environment {name!r}: choose one of {sorted(JAX_ENVS)}, 'gymnax:<id>' (e.g. gymnax:Acrobot-v1) "
            "or 'brax:<name>' (e.g. brax:ant, with the brax extra)"
        )
    return AutoReset(JAX_ENVS[name]())
