"""podracer's shared core: the Agent/Trajectory contracts, data parallelism, configuration, run logs,
checkpoints and the host driver both architectures run on (:mod:`podracer.driver`)."""

from podracer.parallel import DATA_AXES, DEVICE_AXIS, LANE_AXIS, masked_mean, mean_over_replicas, single_replica
from podracer.types import Agent, EnvSpec, EpisodeStats, Trajectory, episode_restarts, no_core, reset_core

__version__ = "0.1.0"

__all__ = [
    "DATA_AXES",
    "DEVICE_AXIS",
    "LANE_AXIS",
    "Agent",
    "EnvSpec",
    "EpisodeStats",
    "Trajectory",
    "episode_restarts",
    "masked_mean",
    "mean_over_replicas",
    "no_core",
    "reset_core",
    "single_replica",
]
