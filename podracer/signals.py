"""Stopping a run cleanly on SIGINT (Ctrl-C) and SIGTERM (e.g. a TPU preemption notice)."""

from __future__ import annotations

import contextlib
import signal
import threading


class StopRequested(Exception):
    """Raised in a waiting thread when the run is stopping."""


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event, caught: list[str]):
    """While active, SIGINT and SIGTERM set ``stop`` (their names go into ``caught``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        caught.append(signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
