"""What every ``podracer`` command does with its command line and its output, in one place.

* A refused command line is one line on stderr, ``podracer <command>: error: ...``, and exit code 2 (argparse's
  own prints the whole usage first: for ``podracer anakin`` that is every flag of the agent).
* Output to a reader that went away (``podracer | head``) ends the command quietly with exit code 1, whichever
  command wrote it and whenever it meets the closed pipe: while it runs, or when what is still buffered is flushed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose refusals are one line, naming ``--help`` for the usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def ends_quietly_on_a_closed_pipe(command: Callable[[], int]) -> int:
    """``command()``'s exit code, or 1 where its output met a closed pipe (nothing more is printed, as Python's
    documentation of SIGPIPE advises). What is still buffered is flushed here, inside, where a closed pipe can
    still be caught, not at the interpreter's exit, where it would print a traceback."""
    try:
        try:
            return command()
        finally:  # also after SystemExit (argparse's --help and refusals)
            sys.stdout.flush()
            sys.stderr.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):  # the interpreter flushes both again at its exit
            os.dup2(devnull, stream.fileno())
        return 1


def at_least_one(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


MAX_CPU_DEVICES = 1024  # 1,024 simulated devices start in 4 s on 2 cores; 100,000 hung with no output


def cpu_device_count(text: str) -> int:
    """An argparse type: a count of simulated CPU devices, 1 to ``MAX_CPU_DEVICES``."""
    value = at_least_one(text)
    if value > MAX_CPU_DEVICES:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_CPU_DEVICES}, got {value}")
    return value
