"""A finished or stopped Sebulba run read back from its run directory: agent, settings and restored learner state."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax

from podracer.agents import make_agent, saved_agent_config
from podracer.checkpoint import restore_for_reading
from podracer.config import config_from_saved
from podracer.envs.host import HostEnvConfig
from podracer.parallel import device_mesh, first_local_replica, per_device
from podracer.rundir import read_saved_run
from podracer.sebulba.config import SebulbaConfig, SebulbaGeometry, Topology, geometry, topology
from podracer.sebulba.run import batch_shape, env_spec, sebulba_fingerprint
from podracer.types import Agent


class SebulbaRun(NamedTuple):
    """What :func:`load_run` rebuilds: the agent as trained, the run's settings and its restored learner state."""

    agent_name: str
    agent_config: object
    agent: Agent
    env_id: str
    env_config: HostEnvConfig
    config: SebulbaConfig
    topology: Topology
    geometry: SebulbaGeometry
    state: object  # the learner state, replicated over the learner devices
    update: int  # the restored checkpoint's update

    def actor_params(self, device: jax.Device | None = None):
        """The acting parameters of the first learner replica, on ``device`` (default: the first actor device)."""
        device = device or self.topology.actor_devices[0]
        return jax.device_put(first_local_replica(self.agent.actor_params(self.state)), device)


def load_run(run_dir: str, update: int | None = None) -> SebulbaRun:
    """The Sebulba run in ``run_dir`` at its newest checkpoint (or at ``update``), read-only.

    Needs the run's devices (``--actor-devices``/``--learner-devices`` as saved).
    Raises :class:`podracer.errors.RunDirectoryError` when the directory holds no
    Sebulba run or no checkpoint that fits its settings.
    """
    saved = read_saved_run(run_dir, "sebulba")
    config, env_config = (
        SebulbaConfig(**saved["sebulba"]),
        config_from_saved(HostEnvConfig, saved["host_env"], "host_env"),
    )
    topo = topology(config)
    geo = geometry(config, topo)
    agent_config = saved_agent_config(saved["agent"], saved["agent_config"])
    agent = make_agent(saved["agent"], agent_config, env_spec(saved["env"], env_config), batch_shape(config))
    about = {"agent": saved["agent"], "agent_config": dataclasses.asdict(agent_config), "env": saved["env"]}
    like = per_device(
        agent.init(jax.random.fold_in(jax.random.key(config.seed), 0)), device_mesh(topo.global_learner_devices)
    )
    fingerprint = sebulba_fingerprint(about, config, env_config, geo.num_learners * geo.processes)
    state, counters = restore_for_reading(run_dir, like, fingerprint, update)
    return SebulbaRun(
        saved["agent"], agent_config, agent, saved["env"], env_config, config, topo, geo, state, int(counters["update"])
    )
