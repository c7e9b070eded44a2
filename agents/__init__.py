"""Agents: PPO, IMPALA/V-trace and MuZero, as :class:`podracer.Agent` bundles usable by any architecture."""

from agents.actor_critic import ActorCriticConfig, LearnerState
from podracer.types import BatchShape
from agents.impala import ImpalaConfig, make_impala
from agents.muzero import MuZeroConfig, make_muzero
from agents.ppo import PPOConfig, make_ppo
from agents.random_policy import make_random_policy

AGENTS = {"ppo": (PPOConfig, make_ppo), "impala": (ImpalaConfig, make_impala), "muzero": (MuZeroConfig, make_muzero)}


def make_agent(name: str, config, spec, shape: BatchShape = BatchShape()):
    """The agent ``name`` built from its config for ``spec`` and the run's :class:`BatchShape`."""
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}: choose one of {sorted(AGENTS)}")
    return AGENTS[name][1](config, spec, shape)


__all__ = [
    "AGENTS", "ActorCriticConfig", "ImpalaConfig", "LearnerState", "MuZeroConfig", "PPOConfig",
    "make_agent", "make_impala", "make_muzero", "make_ppo", "make_random_policy",
]
