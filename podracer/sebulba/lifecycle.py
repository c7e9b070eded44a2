"""Thread lifecycle: a failing thread stops the run with its traceback.

Every blocking wait in Sebulba (queues, parameter versions) polls a shared
``stop`` event, so setting it always ends the run within a fraction of a second
(:func:`podracer.signals.stop_on_signals` sets it on SIGINT and SIGTERM).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

JOIN_TIMEOUT_S = 30.0


class WorkerFailed(RuntimeError):
    """A Sebulba thread raised; the original exception (and traceback) is chained as ``__cause__``."""


class ThreadGroup:
    def __init__(self, stop: threading.Event):
        self.stop = stop
        self.threads: list[threading.Thread] = []
        self._failure: tuple[str, BaseException] | None = None
        self._lock = threading.Lock()

    def start(self, name: str, target: Callable[[], None]) -> None:
        def guarded():
            try:
                target()
            except BaseException as error:  # noqa: BLE001 - any failure must stop the run
                with self._lock:
                    if self._failure is None:
                        self._failure = (name, error)
                self.stop.set()

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def raise_failure(self) -> None:
        """Re-raises the first thread failure, if any, in the calling thread."""
        if self._failure is not None:
            name, error = self._failure
            raise WorkerFailed(f"{name} failed: {type(error).__name__}: {error}") from error

    def join(self) -> list[str]:
        """Stops and joins every thread; returns the names of threads that did not end in time."""
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=JOIN_TIMEOUT_S)
        return [t.name for t in self.threads if t.is_alive()]
