"""Environments: jittable ones for Anakin (Catch, CartPole, any gymnax id) and their wrappers."""

from envs.autoreset import AutoReset, AutoResetState
from envs.base import Environment, TimeStep
from envs.cartpole import CartPole
from envs.catch import Catch
from envs.gymnax_adapter import GymnaxEnv
from envs.registry import make

__all__ = ["AutoReset", "AutoResetState", "CartPole", "Catch", "Environment", "GymnaxEnv", "TimeStep", "make"]
