"""Anakin: environments, acting and learning together on every device, one compiled program."""

from podracer.anakin.config import AnakinConfig, AnakinGeometry, geometry
from podracer.anakin.load import AnakinRun, load_run
from podracer.anakin.program import Anakin, RunnerState, anakin_mesh, make_anakin
from podracer.anakin.run import AnakinResult, train, train_agent
from podracer.errors import NonFiniteLossError

__all__ = [
    "Anakin",
    "AnakinConfig",
    "AnakinResult",
    "AnakinRun",
    "AnakinGeometry",
    "NonFiniteLossError",
    "RunnerState",
    "anakin_mesh",
    "geometry",
    "load_run",
    "make_anakin",
    "train",
    "train_agent",
]
