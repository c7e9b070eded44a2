"""Data parallelism: the axis names gradients are averaged over, and the meshes.

Every architecture runs ``Agent.learn`` once per *data replica*. A replica is one
update lane on one device: devices are a ``shard_map`` mesh axis
(:data:`DEVICE_AXIS`), lanes a ``vmap`` axis inside each device
(:data:`LANE_AXIS`, the paper's inner batch axis). Agents average over both with
:func:`mean_over_replicas`, so an architecture must bind both names, even where
one of them has size 1.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh

DEVICE_AXIS = "device"
LANE_AXIS = "lane"
DATA_AXES = (DEVICE_AXIS, LANE_AXIS)


def mean_over_replicas(tree):
    """Averages every leaf over all data replicas (devices x lanes)."""
    return jax.lax.pmean(tree, DATA_AXES)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """This replica's share of the mean of ``x`` where ``mask``, over *all* replicas' data.

    The local masked sum is divided by the average count of valid entries per
    replica, so that :func:`mean_over_replicas` of the result (and of its
    gradients) is exactly the masked mean over the global batch, whatever the
    number of valid entries on each replica. With one replica it is the plain
    masked mean.

    Args:
      x: any shape.
      mask: same shape as ``x``, bool or 0/1.
    """
    mask = mask.astype(x.dtype)
    count = jax.lax.pmean(mask.sum(), DATA_AXES)
    return (x * mask).sum() / jnp.where(count > 0, count, 1.0)


def global_masked_moments(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean and variance of ``x`` where ``mask`` over the global batch (no gradient)."""
    x = jax.lax.stop_gradient(x)
    mean = mean_over_replicas(masked_mean(x, mask))
    var = mean_over_replicas(masked_mean(jnp.square(x - mean), mask))
    return mean, var


def single_replica(fn: Callable) -> Callable:
    """Runs ``fn`` as the only data replica, binding :data:`DATA_AXES` with size 1.

    For calling ``Agent.learn`` outside an architecture: in a notebook or a test.
    """

    def add_axes(tree):
        return jax.tree.map(lambda x: x[None, None], tree)

    def wrapped(*args):
        replicated = jax.vmap(jax.vmap(fn, axis_name=LANE_AXIS), axis_name=DEVICE_AXIS)
        return jax.tree.map(lambda x: x[0, 0], replicated(*add_axes(args)))

    return wrapped


def device_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A one-axis mesh (:data:`DEVICE_AXIS`) over ``devices`` (default: every device of every process)."""
    if devices is None:
        devices = jax.devices()
        return jax.make_mesh((len(devices),), (DEVICE_AXIS,), axis_types=(AxisType.Auto,))
    return Mesh(np.asarray(devices), (DEVICE_AXIS,), axis_types=(AxisType.Auto,))


def fetch_replicated(tree):
    """Brings a pytree of fully replicated (possibly multi-process) arrays to host numpy."""
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)
