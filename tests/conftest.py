"""Eight simulated CPU devices for every test; set before jax is imported anywhere."""

import os
import signal
import subprocess

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import pytest  # noqa: E402

from podracer.sebulba import prefer_synchronous_cpu_dispatch  # noqa: E402

prefer_synchronous_cpu_dispatch()  # before JAX starts its backends, as the podracer command does

assert jax.device_count() == 8, "tests need 8 simulated devices: XLA_FLAGS was set too late"


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sigterm_after_progress(command: list[str], lines: int) -> int:
    """Runs ``command`` from the checkout, sends SIGTERM once it printed ``lines`` progress lines ("env steps ..."
    on stderr), and returns its exit code."""
    proc = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    seen = 0
    for line in proc.stderr:
        seen += line.startswith("env steps")
        if seen == lines:
            proc.send_signal(signal.SIGTERM)
            break
    proc.stderr.read()
    return proc.wait(timeout=120)


@pytest.fixture
def sigterm_after_progress():
    """:func:`_sigterm_after_progress`, for the tests that stop a run mid-way."""
    return _sigterm_after_progress
