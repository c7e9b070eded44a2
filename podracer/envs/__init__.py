"""Environments: jittable ones for Anakin (Catch, CartPole, Memory, any gymnax id) and their wrappers."""

from podracer.envs.autoreset import AutoReset, AutoResetState
from podracer.envs.base import Environment, TimeStep
from podracer.envs.cartpole import CartPole
from podracer.envs.catch import Catch
from podracer.envs.gymnax_adapter import GymnaxEnv
from podracer.envs.memory import Memory
from podracer.envs.registry import make

__all__ = ["AutoReset", "AutoResetState", "CartPole", "Catch", "Environment", "GymnaxEnv", "Memory", "TimeStep", "make"]
