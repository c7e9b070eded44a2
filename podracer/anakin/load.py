"""A finished or stopped Anakin run read back from its run directory: agent, environment and restored state."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax

from podracer import envs
from podracer.agents import saved_agent_config
from podracer.anakin.config import AnakinConfig
from podracer.anakin.program import RunnerState
from podracer.anakin.run import anakin_program, build_agent
from podracer.anakin.sweep import Sweep
from podracer.checkpoint import restore_for_reading
from podracer.driver import Program
from podracer.rundir import read_saved_run
from podracer.types import Agent


class AnakinRun(NamedTuple):
    """What :func:`load_run` rebuilds: the agent and env as trained, the program, the restored global state."""

    agent_name: str
    agent_config: object
    agent: Agent
    sweep: Sweep | None  # the run's --sweep (each agent's settings are in ``state.hparams``), None without
    env_name: str
    env: envs.AutoReset
    config: AnakinConfig
    program: Program
    state: RunnerState  # global arrays over the run's devices (leading axes: devices, lanes, seeds)
    update: int  # the restored checkpoint's update


def load_run(run_dir: str, update: int | None = None) -> AnakinRun:
    """The Anakin run in ``run_dir`` at its newest checkpoint (or at ``update``), read-only.

    Needs as many devices as the run had (a CPU run: set ``jax_num_cpu_devices``
    before JAX starts). Raises :class:`podracer.errors.RunDirectoryError` when
    the directory holds no Anakin run or no checkpoint that fits its settings.
    """
    saved = read_saved_run(run_dir, "anakin")
    env = envs.make(saved["env"])
    config = AnakinConfig(**saved["anakin"])
    agent_config = saved_agent_config(saved["agent"], saved["agent_config"])
    agent, sweep = build_agent(saved["agent"], agent_config, env, config)
    about = {"agent": saved["agent"], "env": saved["env"], "agent_config": dataclasses.asdict(agent_config)}
    program = anakin_program(agent, env, config, about, sweep)
    state, counters = restore_for_reading(run_dir, program.init(), program.fingerprint, update)
    return AnakinRun(
        saved["agent"], agent_config, agent, sweep, saved["env"], env, config, program, state, int(counters["update"])
    )


def first_seed_params(run: AnakinRun):
    """The acting parameters of the run's first seed on its first device and lane, as host-local arrays."""
    from podracer.anakin.evaluate import seed_learners

    local = jax.tree.map(lambda x: x[0], seed_learners(run.state))
    return run.agent.actor_params(local)
