"""One writer per run directory: a run holds an advisory lock on ``RUN_DIR/lock`` while it writes there.

The lock is ``flock``'s, so it dies with its holder: a killed run leaves a stale ``lock`` file that the next run
simply takes over (no pid checks needed). The file names the holder (pid and host) for the refusal message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
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


def _open_lock_file(path: str) -> int:
    """The lock file's descriptor, made if missing. A lock that is a symbolic link is not followed (the run writes
    its pid into the lock: through a link to another file, say one of the system's, it would overwrite that file),
    and one that is a directory or any other non-file is refused: :class:`RunDirectoryError` naming it."""
    why = "podracer keeps its lock there as a file of its own; remove it"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as error:
        kind = "a symbolic link" if os.path.islink(path) else "a directory" if os.path.isdir(path) else None
        if kind:
            raise RunDirectoryError(f"{path} is {kind}; {why}") from None
        raise RunDirectoryError(f"cannot open {path} ({error.strerror or error})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device
        os.close(fd)
        raise RunDirectoryError(f"{path} is not a regular file; {why}")
    return fd


@contextlib.contextmanager
def hold_run_directory(run_dir: str) -> Iterator[None]:
    """Holds ``run_dir``'s lock for the ``with`` block; raises :class:`RunDirectoryInUse`, naming the holder,
    when another process holds it."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, LOCK_FILE)
    fd = _open_lock_file(path)
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


def held_elsewhere(run_dir: str) -> bool:
    """Whether another open lock of ``run_dir`` holds it now (a run that started beside this command)."""
    try:
        fd = os.open(os.path.join(run_dir, LOCK_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # a file system without locks: nothing to go by
        return False
    finally:
        os.close(fd)  # releases it if taken
    return False
