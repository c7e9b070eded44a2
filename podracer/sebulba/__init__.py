"""Sebulba: host environments (envpool), actor threads on actor devices, a data-parallel learner.

Sebulba's actor threads wait for every inference call, so on CPU devices they run
faster with JAX's asynchronous dispatch off: call :func:`prefer_synchronous_cpu_dispatch`
before JAX starts (the ``podracer`` command does). Importing this package changes no setting.
"""

from podracer.sebulba.actor import prefer_synchronous_cpu_dispatch
from podracer.sebulba.config import SebulbaConfig
from podracer.sebulba.load import SebulbaRun, load_run
from podracer.sebulba.run import SebulbaResult, batch_shape, env_spec, train, train_agent

__all__ = [
    "SebulbaConfig",
    "SebulbaResult",
    "SebulbaRun",
    "batch_shape",
    "env_spec",
    "load_run",
    "prefer_synchronous_cpu_dispatch",
    "train",
    "train_agent",
]
