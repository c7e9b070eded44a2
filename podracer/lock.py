"""One writer per run directory: a run holds an advisory lock on ``RUN_DIR/lock`` while it writes there.

The lock is ``flock``'s, so it dies with its holder: a killed run leaves a stale ``lock`` file that the next run
simply takes over (no pid checks needed). The file names the holder (pid and host) for the refusal message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
from collections.abc import Iterator

from podracer.errors import RunDirectoryError

LOCK_FILE = "lock"


class RunDirectoryInUse(RunDirectoryError):
    """Another live process writes this run directory (exit code 2 from the command)."""


def _holder(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 256).decode(errors="replace").strip()
    return text or "another process"


@contextlib.contextmanager
def hold_run_directory(run_dir: str) -> Iterator[None]:
    """Holds ``run_dir``'s lock for the ``with`` block; raises :class:`RunDirectoryInUse`, naming the holder,
    when another process holds it."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirectoryInUse(
                f"{run_dir} is being written by {_holder(fd)}; one run writes a run directory at a time "
                "(stop that run first, or choose another --logdir)"
            ) from None
        except OSError as error:  # a file system without locks (some network and FUSE mounts)
            print(
                f"warning: cannot lock {path} ({error.strerror or error}); nothing stops a second run from "
                "writing this run directory at the same time",
                file=sys.stderr,
            )
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock
