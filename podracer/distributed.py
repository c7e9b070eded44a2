"""Starting JAX's distributed runtime: the same command on every host of a multi-host run.

* TPU VM pod slices and Slurm jobs with several tasks are detected and started
  with ``jax.distributed.initialize()``'s own cluster detection.
* Elsewhere ``--coordinator HOST:PORT --num-processes N --process-id I`` start it
  by hand (process 0 serves the coordinator at that address).

After this, ``jax.devices()`` lists every process's devices. On CPU the
collectives between processes use gloo.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import threading
import time

import jax
import numpy as np

MAX_TIMEOUT_S = 86_400.0  # a day: --coordinator-timeout beyond it is a typo (and inf overflowed JAX's int)
HEARTBEAT_TIMEOUT_S = 60  # JAX's own verdict on a silent process (it aborts); the peer watch answers first
KEEPALIVE = (10, 5, 4)  # TCP keepalive idle, interval, probes: a host that vanished is noticed in ~30 s
PEER_LOST_EXIT = 1


class CoordinatorUnreachable(ConnectionError):
    """No coordinator answered at the given address within the timeout (or not every process arrived)."""


def cluster_detected() -> bool:
    """Whether this process is one task of a multi-host TPU slice or Slurm job."""
    slurm_tasks = int(os.environ.get("SLURM_NTASKS", "1") or 1)
    tpu_hosts = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    return slurm_tasks > 1 or len(tpu_hosts) > 1


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` checked: a port in 1..65535 and a host that resolves."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--coordinator must be HOST:PORT (a port in 1..65535), got {address!r}")
    try:
        socket.getaddrinfo(host, int(port))
    except socket.gaierror as error:
        raise ValueError(f"--coordinator {address}: cannot resolve {host!r} ({error.strerror})") from None
    return host, int(port)


def _keep_alive(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in zip(("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"), KEEPALIVE):
        if hasattr(socket, option):  # Linux; elsewhere the system's keepalive times apply
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    return sock


def _gather_peers(host: str, port: int, num_processes: int, timeout_s: float) -> dict[int, socket.socket]:
    """Process 0: waits on the coordinator's address until every other process said hello."""
    try:  # on every interface, as JAX's coordinator binds: the host's name may resolve to a loopback address
        if socket.has_dualstack_ipv6():
            listener = socket.create_server(
                ("", port), family=socket.AF_INET6, backlog=num_processes, dualstack_ipv6=True
            )
        else:
            listener = socket.create_server(("", port), backlog=num_processes)
    except OSError as error:
        raise ValueError(f"--coordinator {host}:{port}: process 0 cannot listen there ({error.strerror})") from None
    peers, deadline = {}, time.monotonic() + timeout_s
    try:
        while len(peers) < num_processes - 1:
            listener.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                conn, _ = listener.accept()
                conn.settimeout(max(0.01, deadline - time.monotonic()))
                peers[int(conn.recv(32).split()[1])] = _keep_alive(conn)
            except (TimeoutError, ValueError, IndexError, OSError):
                if time.monotonic() >= deadline:
                    missing = sorted(set(range(1, num_processes)) - set(peers))
                    raise CoordinatorUnreachable(
                        f"process(es) {missing} did not arrive at {host}:{port} within {timeout_s:.0f}s: start every "
                        f"process with the same --coordinator and --num-processes {num_processes}, or raise "
                        "--coordinator-timeout"
                    ) from None
        for conn in peers.values():
            conn.settimeout(None)
            conn.sendall(b"go\n")
    finally:
        listener.close()  # JAX's coordinator binds this port next; the peers' connections stay open
    return peers


def _join(host: str, port: int, process_id: int, timeout_s: float) -> dict[int, socket.socket]:
    """A process other than 0: says hello at the coordinator's address and waits for every process to arrive."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=1.0)
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            conn.sendall(f"podracer {process_id}\n".encode())
            if conn.recv(8).startswith(b"go"):
                conn.settimeout(None)
                return {0: _keep_alive(conn)}
            conn.close()
        except OSError as error:
            if time.monotonic() >= deadline:
                raise CoordinatorUnreachable(
                    f"no coordinator answered at {host}:{port} within {timeout_s:.0f}s ({error}); start process 0 "
                    "first, check the address and port, or raise --coordinator-timeout"
                ) from None
            time.sleep(0.25)


def _watch(peers: dict[int, socket.socket]) -> None:
    """Ends this process with a message as soon as a peer's connection closes without a goodbye.

    Without it JAX notices a lost process only after its heartbeat timeout and
    then aborts (a C++ stack trace, exit 134). A process that dies closes its
    connections at once; a host that vanishes is noticed by TCP keepalive.
    """

    def watch(process: int, conn: socket.socket) -> None:
        try:
            said = conn.recv(8)
        except OSError:
            said = b""
        if said.startswith(b"bye"):
            return
        print(
            f"podracer: process {process} is gone (its connection to this one closed without a goodbye), so "
            f"process {jax.process_index()} stops too; resume the run from its last checkpoint with --resume",
            file=sys.stderr,
            flush=True,
        )
        os._exit(PEER_LOST_EXIT)  # JAX's runtime cannot shut down cleanly without its peer

    for process, conn in peers.items():
        threading.Thread(target=watch, args=(process, conn), name=f"peer watch {process}", daemon=True).start()


def _detect_cluster(timeout_s: float) -> tuple[str, int, int, list[int] | None]:
    """The coordinator, process count, process id and local devices JAX finds on a TPU slice or under Slurm.

    Asked of JAX's own cluster detection (the same that ``jax.distributed.initialize()``
    uses), so that these launchers get the same meeting and peer watch as a run started by hand.
    """
    from jax._src.clusters import ClusterEnv  # JAX's detection; it has no public entry that only detects

    coordinator, num_processes, process_id, local_device_ids = ClusterEnv.auto_detect_unset_distributed_params(
        None, None, None, None, None, int(timeout_s)
    )
    if coordinator is None or num_processes is None or process_id is None:
        raise ValueError(
            "a TPU slice or Slurm job was detected, but JAX could not tell its coordinator, process "
            "count and id: start the processes with --coordinator, --num-processes and --process-id"
        )
    return coordinator, num_processes, process_id, local_device_ids


_PEERS: dict[int, socket.socket] = {}


def say_goodbye() -> None:
    """Tells the peers that this process ends on purpose (its run finished or stopped cleanly)."""
    for conn in _PEERS.values():
        try:
            conn.sendall(b"bye\n")
        except OSError:
            pass


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout_s: float = 300.0,
) -> bool:
    """Starts the distributed runtime when this is a multi-process run; returns whether it did.

    With no arguments, starts it only where :func:`cluster_detected`, with the
    coordinator and process numbers JAX detects there. Raises
    ValueError for an incomplete or inconsistent set of flags or a malformed
    address, and :class:`CoordinatorUnreachable` (after ``timeout_s``) when
    the processes do not all meet, instead of hanging or aborting. Every
    process keeps a connection to process 0 for the whole run: when one is
    lost, the others stop at once with a message (:func:`say_goodbye` marks a
    deliberate end).
    """
    if not (math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S):  # nan hung, inf overflowed
        raise ValueError(f"--coordinator-timeout must be a number of seconds in (0, {MAX_TIMEOUT_S}], got {timeout_s}")
    given = [coordinator is not None, num_processes is not None, process_id is not None]
    local_device_ids = None
    if not any(given):
        if not cluster_detected():
            return False
        coordinator, num_processes, process_id, local_device_ids = _detect_cluster(timeout_s)
    elif not all(given):
        raise ValueError("--coordinator, --num-processes and --process-id go together: give all three")
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(
            f"--process-id must be in 0..{num_processes - 1} for --num-processes {num_processes}, got {process_id}"
        )
    host, port = parse_address(coordinator)
    if num_processes == 1:
        return False
    if process_id == 0:
        peers = _gather_peers(host, port, num_processes, timeout_s)
    else:
        peers = _join(host, port, process_id, timeout_s)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator,
        num_processes,
        process_id,
        local_device_ids=local_device_ids,
        initialization_timeout=int(timeout_s),
        heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S,
    )
    _PEERS.update(peers)
    _watch(peers)
    return True


def agree_on_step(stop: bool, updates: int) -> tuple[bool, int]:
    """In one collective: whether any process was asked to stop, and the fewest updates any process offers to take.

    Each process times its own steps (:class:`podracer.driver.Pace`), but one step's
    collectives need every process to run the same number of updates: a process
    that took fewer would wait in its next collective for ever.
    """
    if jax.process_count() == 1:
        return stop, updates
    from jax.experimental import multihost_utils

    gathered = np.asarray(multihost_utils.process_allgather(np.array([int(stop), updates], np.int32)))
    return bool(gathered[..., 0].any()), int(gathered[..., 1].min())


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is set on any process (every process must call this at the same point)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.array(flag))))
