"""Agents: PPO, IMPALA/V-trace and MuZero, as :class:`podracer.Agent` bundles usable by any architecture."""

import dataclasses

from podracer.agents.actor_critic import ActorCriticConfig, LearnerState
from podracer.agents.impala import ImpalaConfig, make_impala
from podracer.agents.muzero import MuZeroConfig, make_muzero
from podracer.agents.ppo import PPOConfig, make_ppo
from podracer.agents.random_policy import make_random_policy
from podracer.types import BatchShape

AGENTS = {"ppo": (PPOConfig, make_ppo), "impala": (ImpalaConfig, make_impala), "muzero": (MuZeroConfig, make_muzero)}


def make_agent(name: str, config, spec, shape: BatchShape = BatchShape()):
    """The agent ``name`` built from its config for ``spec`` and the run's :class:`BatchShape`."""
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}: choose one of {sorted(AGENTS)}")
    return AGENTS[name][1](config, spec, shape)


def saved_agent_config(agent: str, values: dict):
    """The config of agent ``agent`` from its saved fields (``config.json``'s ``agent_config``; lists become
    tuples; fields the agent no longer has are dropped)."""
    if agent not in AGENTS:
        raise ValueError(f"unknown agent {agent!r}: choose one of {sorted(AGENTS)}")
    config_class = AGENTS[agent][0]
    fields = {f.name for f in dataclasses.fields(config_class)}
    return config_class(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in fields})


__all__ = [
    "AGENTS",
    "ActorCriticConfig",
    "ImpalaConfig",
    "LearnerState",
    "MuZeroConfig",
    "PPOConfig",
    "make_agent",
    "make_impala",
    "saved_agent_config",
    "make_muzero",
    "make_ppo",
    "make_random_policy",
]
