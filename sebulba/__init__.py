"""Sebulba: host environments (envpool), actor threads on actor devices, a data-parallel learner.

Importing it turns off JAX's asynchronous dispatch on CPU devices, which Sebulba's
actor threads pay for on every inference call (see :func:`sebulba.actor.prefer_synchronous_cpu_dispatch`).
"""

from sebulba.actor import prefer_synchronous_cpu_dispatch
from sebulba.config import SebulbaConfig
from sebulba.run import SebulbaResult, batch_shape, env_spec, train, train_agent

prefer_synchronous_cpu_dispatch()

__all__ = ["SebulbaConfig", "SebulbaResult", "batch_shape", "env_spec", "train", "train_agent"]
