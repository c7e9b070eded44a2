"""Stopping a run cleanly on SIGINT (Ctrl-C) and SIGTERM (e.g. a TPU preemption notice)."""

from __future__ import annotations

import _thread
import collections
import contextlib
import signal
import threading

_routed: collections.deque[int] = collections.deque()  # signals the watcher has handed on, in arrival order


class StopRequested(Exception):
    """Raised in a waiting thread when the run is stopping."""


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event, caught: list[str]):
    """While active, SIGINT and SIGTERM set ``stop`` (their names go into ``caught``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        caught.append(arrived(signum))
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def arrived(signum: int) -> str:
    """The name of the signal a handler runs for, taken in the order the signals arrived.

    Where :func:`route_signals_to_main_thread` hands signals on, two that are
    pending at once have their handlers run by Python in signal-number order
    (SIGINT before SIGTERM), not in the order they came; every handler of a
    routed signal calls this, and gets the oldest one not yet handled.
    """
    try:
        signum = _routed.popleft()
    except IndexError:  # not routed: the handler's own signal is the one that came
        pass
    return signal.Signals(signum).name


def route_signals_to_main_thread() -> None:
    """Makes SIGINT and SIGTERM reach only a watcher thread, which runs their handlers in the main thread.

    A process-wide signal goes to any thread that does not block it; one that lands
    on an XLA worker thread during a computation can leave the computation waiting
    forever (measured on CPU: a SIGTERM in the first seconds of ``podracer anakin``
    hung 7 of 25 runs, the worker pool idle and the main thread waiting on the
    result). So the calling thread, the main one, blocks both signals before any
    backend starts; every thread created afterwards (XLA's pools, actor threads)
    inherits the block, and a daemon thread ``sigwait``-s for them and hands each
    to the main thread with ``_thread.interrupt_main``, where Python runs the
    handler installed for it (``signal.signal``) as usual, at the next bytecode:
    podracer's waits poll every 0.1 s. Handlers take the signal's name from
    :func:`arrived`, which keeps the order the signals came in. Call it once, first thing, from the main
    thread, after installing handlers for both signals (a signal whose handler is
    the default is dropped by ``interrupt_main``). Child processes inherit the
    blocked mask: this is for a process that starts none.
    """
    watched = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)

    def watch():
        while True:
            signum = signal.sigwait(watched)
            _routed.append(signum)
            _thread.interrupt_main(signum)

    threading.Thread(target=watch, name="podracer-signals", daemon=True).start()
