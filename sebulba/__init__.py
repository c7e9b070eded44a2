"""Sebulba: host environments (envpool), actor threads on actor devices, a data-parallel learner."""

from sebulba.config import SebulbaConfig
from sebulba.run import SebulbaResult, train

__all__ = ["SebulbaConfig", "SebulbaResult", "train"]
