"""Starting JAX's distributed runtime: the same command on every host of a multi-host run.

* TPU VM pod slices and Slurm jobs with several tasks are detected and started
  with ``jax.distributed.initialize()``'s own cluster detection.
* Elsewhere ``--coordinator HOST:PORT --num-processes N --process-id I`` start it
  by hand (process 0 serves the coordinator at that address).

After this, ``jax.devices()`` lists every process's devices. On CPU the
collectives between processes use gloo.
"""

from __future__ import annotations

import os
import socket
import time

import jax
import numpy as np


class CoordinatorUnreachable(ConnectionError):
    """No coordinator answered at the given address within the timeout."""


def cluster_detected() -> bool:
    """Whether this process is one task of a multi-host TPU slice or Slurm job."""
    slurm_tasks = int(os.environ.get("SLURM_NTASKS", "1") or 1)
    tpu_hosts = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    return slurm_tasks > 1 or len(tpu_hosts) > 1


def _wait_for(address: str, timeout_s: float) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--coordinator must be HOST:PORT, got {address!r}")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
            return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise CoordinatorUnreachable(
                    f"no coordinator answered at {address} within {timeout_s:.0f}s ({error}); start process 0 "
                    "first, check the address and port, or raise --coordinator-timeout"
                ) from None
            time.sleep(0.25)


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout_s: float = 300.0,
) -> bool:
    """Starts the distributed runtime when this is a multi-process run; returns whether it did.

    With no arguments, starts it only where :func:`cluster_detected`. Raises
    ValueError for an incomplete or inconsistent set of flags and
    :class:`CoordinatorUnreachable` (after ``timeout_s``) when a process other
    than 0 finds no coordinator, instead of hanging.
    """
    given = [coordinator is not None, num_processes is not None, process_id is not None]
    if not any(given):
        if not cluster_detected():
            return False
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(initialization_timeout=int(timeout_s))
        return True
    if not all(given):
        raise ValueError("--coordinator, --num-processes and --process-id go together: give all three")
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(f"--process-id must be in 0..{num_processes - 1} for --num-processes {num_processes}, "
                         f"got {process_id}")
    if num_processes == 1:
        return False
    if process_id != 0:
        _wait_for(coordinator, timeout_s)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes, process_id, initialization_timeout=int(timeout_s))
    return True


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is set on any process (every process must call this at the same point)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.array(flag))))
