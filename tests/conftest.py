"""Eight simulated CPU devices for every test; set before jax is imported anywhere."""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402

from podracer.sebulba import prefer_synchronous_cpu_dispatch  # noqa: E402

prefer_synchronous_cpu_dispatch()  # before JAX starts its backends, as the podracer command does

assert jax.device_count() == 8, "tests need 8 simulated devices: XLA_FLAGS was set too late"
