"""Data parallelism: the axis names gradients are averaged over, and the meshes.

Every architecture runs ``Agent.learn`` once per *data replica*. A replica is one
update lane on one device: devices are a ``shard_map`` mesh axis
(:data:`DEVICE_AXIS`), lanes a ``vmap`` axis inside each device
(:data:`LANE_AXIS`, the paper's inner batch axis). Agents average over both with
:func:`mean_over_replicas`, so an architecture must bind both names, even where
one of them has size 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DEVICE_AXIS = "device"
LANE_AXIS = "lane"
DATA_AXES = (DEVICE_AXIS, LANE_AXIS)


def _bound_axes() -> tuple[str, ...]:
    # Collectives over size-1 axes still cost a runtime call on some backends (XLA:CPU).
    return tuple(axis for axis in DATA_AXES if jax.lax.axis_size(axis) > 1)


def _packed(collective: Callable, tree, axes: tuple[str, ...]):
    """``collective(tree, axes)`` as one collective per dtype: the leaves are concatenated into one vector first.

    XLA:CPU runs a many-operand all-reduce as one gloo call per operand, each a
    round trip between processes; one vector makes it one. Each element is
    reduced as before, though XLA may fuse the code around the concatenation
    differently (catch_ppo's losses moved by ~1e-7 relative). On GPU and TPU,
    whose compilers combine all-reduces themselves, it is one small copy.
    """
    leaves, treedef = jax.tree.flatten(tree)
    if len(leaves) < 2:
        return collective(tree, axes)
    by_dtype: dict = {}
    for i, leaf in enumerate(leaves):
        by_dtype.setdefault(jnp.result_type(leaf), []).append(i)
    out = list(leaves)
    for indices in by_dtype.values():
        flat = collective(jnp.concatenate([jnp.ravel(leaves[i]) for i in indices]), axes)
        ends = np.cumsum([np.size(leaves[i]) for i in indices])
        for i, part in zip(indices, jnp.split(flat, ends[:-1])):
            out[i] = part.reshape(jnp.shape(leaves[i]))
    return jax.tree.unflatten(treedef, out)


def mean_over_replicas(tree):
    """Averages every leaf over all data replicas (devices x lanes)."""
    axes = _bound_axes()
    return _packed(jax.lax.pmean, tree, axes) if axes else tree


def sum_over_replicas(tree):
    """Sums every leaf over all data replicas (devices x lanes)."""
    axes = _bound_axes()
    return _packed(jax.lax.psum, tree, axes) if axes else tree


def replica_count() -> int:
    """How many data replicas (devices x lanes) there are, where the data axes are bound."""
    count = 1
    for axis in DATA_AXES:
        count *= jax.lax.axis_size(axis)
    return count


def replica_index() -> jax.Array:
    """This replica's index in ``range(replica_count())`` (for per-replica randomness)."""
    index = jnp.int32(0)
    for axis in DATA_AXES:
        index = index * jax.lax.axis_size(axis) + jax.lax.axis_index(axis)
    return index


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """This replica's share of the mean of ``x`` where ``mask``, over *all* replicas' data.

    The local masked sum is divided by the average count of valid entries per
    replica, so that :func:`mean_over_replicas` of the result (and of its
    gradients) is exactly the masked mean over the global batch, whatever the
    number of valid entries on each replica. With one replica it is the plain
    masked mean.

    Args:
      x: ``[*mask.shape, ...]``: the leading axes, those of ``mask``, are averaged;
        stacking several quantities on a trailing axis averages them in one reduction.
      mask: bool or 0/1.

    Returns:
      ``x.shape[mask.ndim:]``.
    """
    mask = mask.astype(x.dtype)
    count = mean_over_replicas(mask.sum())
    weights = mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))
    axes = tuple(range(mask.ndim))
    return (x * weights).sum(axis=axes) / jnp.where(count > 0, count, 1.0)


def global_masked_moments(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean and variance of ``x`` where ``mask`` over the global batch (no gradient)."""
    x = jax.lax.stop_gradient(x)
    mean, mean_square = mean_over_replicas(masked_mean(jnp.stack([x, jnp.square(x)], axis=-1), mask))
    return mean, jnp.maximum(mean_square - jnp.square(mean), 0.0)


def backends_started() -> bool:
    """Whether JAX has started its backends in this process: from then on its device count and dispatch settings
    are fixed."""
    from jax._src import xla_bridge  # the one place JAX tells

    return xla_bridge.backends_are_initialized()


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


def device_mesh(devices: Sequence[jax.Device] | None = None, lane_axis: bool = True) -> Mesh:
    """A mesh over ``devices`` (default: every device of every process).

    With ``lane_axis`` its axes are ``(DEVICE_AXIS, LANE_AXIS)`` shaped ``(n, 1)``:
    the trivial lane axis binds the second data-axis name at no cost, for
    programs with one lane per device. Without it the mesh has ``DEVICE_AXIS``
    alone and the caller binds ``LANE_AXIS`` itself (``vmap`` over lanes).
    """
    if devices is None:
        devices = jax.devices()
        grid = jax.make_mesh((len(devices),), (DEVICE_AXIS,), axis_types=(AxisType.Auto,)).devices
    else:
        grid = np.asarray(devices)
    if lane_axis:
        return Mesh(grid.reshape(-1, 1), DATA_AXES, axis_types=(AxisType.Auto,) * 2)
    return Mesh(grid, (DEVICE_AXIS,), axis_types=(AxisType.Auto,))


def vmap_unless_single(fn: Callable, size: int, axis_name: str | None = None) -> Callable:
    """``jax.vmap(fn)`` over a leading axis of ``size``, or a plain call when ``size`` is 1.

    A size-1 ``vmap`` is not free on XLA:CPU (measured: it halved Anakin's
    throughput), so single seeds and single lanes skip it. With ``size`` 1 the
    caller must bind ``axis_name`` some other way (see :func:`device_mesh`).
    """
    if size > 1:
        return jax.vmap(fn, axis_name=axis_name)

    def call_once(*args):
        out = fn(*jax.tree.map(lambda x: x[0], args))
        return jax.tree.map(lambda x: x[None], out)

    return call_once


def shard_map(fn: Callable, mesh: Mesh, in_specs, out_specs) -> Callable:
    """``jax.shard_map`` without its varying-axis check.

    rlax's and mctx's loops start from unannotated constants, which the check
    rejects; agents average over replicas explicitly, so it adds nothing here.
    """
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


TRAJECTORY_SPEC = P(None, DEVICE_AXIS)  # [T, B, ...] arrays split along the batch axis
REPLICA_SPEC = P(DEVICE_AXIS)  # [devices, ...]: what each device holds is its own


def per_device(tree, mesh: Mesh):
    """A copy of ``tree`` for every device of ``mesh``, stacked on a new leading axis split over the devices.

    Learner states live this way: the parameters stay equal on every device
    (gradients are averaged), while per-device parts, such as a replay shard,
    may differ.
    """
    size = mesh.shape[DEVICE_AXIS]
    stack = jax.jit(
        lambda t: jax.tree.map(lambda x: jnp.broadcast_to(x, (size, *x.shape)), t),
        out_shardings=NamedSharding(mesh, REPLICA_SPEC),
    )
    return stack(tree)


def put_local_share(tree, sharding: NamedSharding):
    """This process's ``[T, B_local, ...]`` share of a batch split along axis 1 over a (multi-process) mesh.

    With one process it is ``jax.device_put``. With several, each process holds
    the ``B_local`` columns that fall on its own devices of ``sharding`` (in
    process order), and the result is the global ``[T, B_local x processes, ...]``
    array; no data crosses hosts.
    """
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)

    def put(x):
        global_shape = (x.shape[0], x.shape[1] * jax.process_count(), *x.shape[2:])
        index_map = sharding.addressable_devices_indices_map(global_shape)
        base = min(index[1].start or 0 for index in index_map.values())
        pieces = [
            jax.device_put(x[:, (index[1].start or 0) - base : index[1].stop - base], device)
            for device, index in index_map.items()
        ]
        return jax.make_array_from_single_device_arrays(global_shape, sharding, pieces)

    return jax.tree.map(put, tree)


def first_local_shards(tree):
    """This process's first device's shard of every leaf of a :func:`per_device` tree: ``[1, ...]`` each, read
    without computing anything."""
    return jax.tree.map(lambda x: x.addressable_shards[0].data, tree)


# One call for every leaf: indexing each leaf's shard is a dispatch per leaf (12 for a 64-64 MLP actor-critic),
# which the Sebulba learner paid with the GIL held at every publish, stalling the actor threads.
_first_rows = jax.jit(lambda tree: jax.tree.map(lambda x: x[0], tree))


def first_local_replica(tree):
    """This process's first device's copy of a :func:`per_device` tree (e.g. to read parameters)."""
    return _first_rows(first_local_shards(tree))


def data_parallel_learn(learn: Callable, mesh: Mesh) -> Callable:
    """``learn`` compiled to run data-parallel over ``mesh``: ``(state, trajectories, key) -> (state, metrics)``.

    ``state`` is a :func:`per_device` learner state. ``trajectories`` is a tuple
    of trajectories, each split along its batch axis over the devices
    (:data:`TRAJECTORY_SPEC`); every device concatenates its shares locally (no
    data moves between devices) and learns from them, and the agent averages
    gradients, so the parameters stay equal on every device. Metrics come back
    averaged over replicas. The input state is donated.
    """

    def replica_learn(state, trajectories, key):
        traj = jax.tree.map(lambda *parts: jnp.concatenate(parts, axis=1), *trajectories)
        state, metrics = learn(jax.tree.map(lambda x: x[0], state), traj, key)
        return jax.tree.map(lambda x: x[None], state), mean_over_replicas(metrics)

    sharded = shard_map(
        replica_learn, mesh, in_specs=(REPLICA_SPEC, TRAJECTORY_SPEC, P()), out_specs=(REPLICA_SPEC, P())
    )
    return jax.jit(sharded, donate_argnums=0)


def fetch_replicated(tree):
    """Brings a pytree of fully replicated (possibly multi-process) arrays to host numpy."""
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)
