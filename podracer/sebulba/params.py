"""Versioned actor parameters, copied once per actor device and shared by its threads.

The learner publishes version ``v`` (the parameters after ``v`` updates); the
store copies it to every actor device *once* and waits for the copies to land
before any actor thread can see them, so no thread ever reads a half-made
transfer. Actor threads of a device all read the same copy (Menger's
per-device parameter cache).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import jax

from podracer.signals import StopRequested

KEEP_VERSIONS = 3  # reproducible actors may still need the two before the newest


class ParamsStore:
    def __init__(self, devices: Sequence[jax.Device], stop: threading.Event):
        self.devices = tuple(devices)
        self._stop = stop
        self._versions: dict[int, dict[jax.Device, Any]] = {}
        self._newest = -1
        self._changed = threading.Condition()

    def publish(self, version: int, params) -> None:
        """Makes ``params`` the newest version; blocks until every actor device holds its copy."""
        # Always a copy: the learner donates its state, which must not free what actors read.
        copies = {device: jax.device_put(params, device, may_alias=False) for device in self.devices}
        jax.block_until_ready(list(copies.values()))
        with self._changed:
            self._versions[version] = copies
            self._newest = max(self._newest, version)
            for old in [v for v in self._versions if v <= self._newest - KEEP_VERSIONS]:
                del self._versions[old]
            self._changed.notify_all()

    def newest(self, device: jax.Device) -> tuple[int, Any]:
        """The newest version on ``device`` (throughput mode)."""
        with self._changed:
            self._wait(lambda: self._newest >= 0)
            return self._newest, self._versions[self._newest][device]

    def exactly(self, version: int, device: jax.Device) -> Any:
        """Version ``version`` on ``device``, waiting for it if needed (reproducible mode)."""
        with self._changed:
            self._wait(lambda: self._newest >= version)
            if version not in self._versions:
                raise RuntimeError(f"parameter version {version} was dropped before an actor read it")
            return self._versions[version][device]

    def _wait(self, ready) -> None:
        while not ready():
            if self._stop.is_set():
                raise StopRequested
            self._changed.wait(timeout=0.1)
