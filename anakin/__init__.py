"""Anakin: environments, acting and learning together on every device, one compiled program."""

from anakin.config import AnakinConfig, AnakinGeometry, geometry
from anakin.program import Anakin, RunnerState, anakin_mesh, make_anakin
from anakin.run import AnakinResult, train, train_agent
from podracer.errors import NonFiniteLossError

__all__ = [
    "Anakin", "AnakinConfig", "AnakinResult", "AnakinGeometry", "NonFiniteLossError", "RunnerState",
    "anakin_mesh", "geometry", "make_anakin", "train", "train_agent",
]
