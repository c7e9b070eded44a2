"""Sebulba's knobs, the device split and the batch geometry, checked before anything starts."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import NamedTuple

import jax

from podracer.config import STEP_COUNT_MAX, check_knobs, check_update_count, even_windows, knob

SYNC_MODES = ("throughput", "reproducible")


@dataclasses.dataclass(frozen=True)
class SebulbaConfig:
    actor_devices: str = knob(
        "auto",
        "comma-separated local device indices for acting, or 'cpu' for inference on the host CPU (auto: device 0)",
    )
    learner_devices: str = knob(
        "auto", "comma-separated local device indices for learning (auto: every other device, or device 0 if alone)"
    )
    actor_threads: int = knob(1, "Python actor threads per actor device, each with its own envpool batch", minimum=1)
    envs_per_thread: int = knob(16, "environments per actor thread (the batch of its trajectories)", minimum=1)
    env_batches: int = knob(
        0,
        "envpool batches each actor thread steps in turn, so envpool steps one while the "
        "device infers for another; one inference call takes envs-per-thread / env-batches envs; "
        "0: 2 for Atari, 1 for cheaper envs (whichever measured faster)",
        minimum=0,
    )
    rollout_len: int = knob(32, "agent steps per environment in one trajectory", minimum=1)
    total_env_steps: int = knob(
        1_000_000,
        "agent steps to train for, over all environments (frames = steps x frame-skip)",
        minimum=1,
        maximum=STEP_COUNT_MAX,
    )
    queue_size: int = knob(
        1,
        "trajectories each actor thread may have waiting for the learner; more means more "
        "off-policy data and more memory",
        minimum=1,
    )
    sync: str = knob(
        "throughput",
        "throughput: actors use the newest parameters; reproducible: rollout k uses "
        "exactly the parameters after update k-1, so a run is reproducible from its seed",
        choices=SYNC_MODES,
    )
    seed: int = knob(0, "random seed")
    log_interval: int = knob(
        0, "agent steps between log lines; 0 means about 20 lines per run", minimum=0, maximum=STEP_COUNT_MAX
    )


class Topology(NamedTuple):
    actor_devices: tuple[jax.Device, ...]  # this host's
    learner_devices: tuple[jax.Device, ...]  # this host's
    global_learner_devices: tuple[jax.Device, ...]  # every process's, at the same local indices, in process order


class SebulbaGeometry(NamedTuple):
    """How one learner update's batch is laid out."""

    actor_threads: int  # in total, over this host's actor devices
    envs_per_thread: int
    env_batches: int  # envpool batches per thread
    rollout_len: int
    num_learners: int  # this host's learner devices
    num_updates: int
    updates_per_log: int
    processes: int = 1  # hosts, each with the same actors and learners

    @property
    def steps_per_update(self) -> int:
        """Agent steps per update over every host."""
        return self.processes * self.actor_threads * self.envs_per_thread * self.rollout_len

    @property
    def envs_per_learner(self) -> int:
        """Environments in each learner device's share of one update."""
        return self.actor_threads * self.envs_per_thread // self.num_learners


def _parse_indices(text: str, flag: str, num_devices: int) -> tuple[int, ...]:
    try:
        indices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated device indices such as 0 or 1,2,3, got {text!r}") from None
    if not indices:
        raise ValueError(f"{flag} names no device")
    bad = [i for i in indices if not 0 <= i < num_devices]
    if bad:
        raise ValueError(f"{flag} {text}: this host has {num_devices} device(s), indices 0-{num_devices - 1}")
    if len(set(indices)) != len(indices):
        raise ValueError(f"{flag} {text} names a device twice")
    return tuple(indices)


def actor_indices(config: SebulbaConfig, num_devices: int) -> tuple[int, ...]:
    """The local indices of the actor devices among ``num_devices`` (not for ``--actor-devices cpu``)."""
    if config.actor_devices == "auto":
        return (0,)
    return _parse_indices(config.actor_devices, "--actor-devices", num_devices)


def learner_indices(config: SebulbaConfig, num_devices: int, acting: tuple[int, ...]) -> tuple[int, ...]:
    """The local indices of the learner devices, given the actors' (``acting``): auto is every other device, or
    device 0 where the actors take them all."""
    if config.learner_devices == "auto":
        return tuple(i for i in range(num_devices) if i not in acting) or (0,)
    return _parse_indices(config.learner_devices, "--learner-devices", num_devices)


def topology(config: SebulbaConfig) -> Topology:
    """The actor and learner devices of this host (they may overlap on a single-device host)."""
    devices = jax.local_devices()
    if config.actor_devices == "cpu":
        actors = (jax.local_devices(backend="cpu")[0],)
        acting = tuple(i for i, d in enumerate(devices) if d in actors)
    else:
        acting = actor_indices(config, len(devices))
        actors = tuple(devices[i] for i in acting)
    indices = learner_indices(config, len(devices), acting)
    learners = tuple(devices[i] for i in indices)
    everywhere = tuple(jax.local_devices(process_index=p)[i] for p in range(jax.process_count()) for i in indices)
    return Topology(actors, learners, everywhere)


def default_env_threads(total_actor_threads: int) -> int:
    """envpool threads per actor thread when not set: the host's cores shared out."""
    return max(1, (os.cpu_count() or 1) // total_actor_threads)


def resolve_env_batches(config: SebulbaConfig, env_id: str, topo: Topology) -> SebulbaConfig:
    """``config`` with ``--env-batches 0`` (auto) made concrete for ``env_id``.

    Two batches let inference for one hide behind envpool stepping the other, which
    pays where a step is slow: on Breakout-v5 (32 envs per thread, 2 cores) 1,458
    agent steps/s in 2 batches against 1,317 in one. Where a step is cheap, the
    second inference call costs more than it hides: CartPole-v1 at 64 envs, 117K
    steps/s in one batch against 96K in two (``experiments/benchmark_sebulba.py``);
    with the actors' rbg keys (cheaper inference), three alternated runs each gave
    51.7K (one) vs 49.1K (two) at 16 envs and 162K vs 172K at 64: no clear winner.
    Two only where they split the envs evenly for every learner device.
    """
    if config.env_batches:
        return config
    from podracer.envs.host import is_atari

    learners = len(topo.learner_devices)
    two = is_atari(env_id) and config.envs_per_thread % (2 * learners) == 0
    return dataclasses.replace(config, env_batches=2 if two else 1)


def check_batch_split(config: SebulbaConfig, learners: int) -> None:
    """The trainer's checks of ``config``'s knobs and of how its batch splits over envpool batches and ``learners``
    learner devices (ValueError saying what to change); ``podracer tune`` checks its candidates with it."""
    check_knobs(config)
    batches = config.env_batches or 1
    if config.envs_per_thread % batches:
        raise ValueError(
            f"--envs-per-thread {config.envs_per_thread} does not split into --env-batches {batches} "
            f"equal envpool batches; use a multiple of {batches} or --env-batches 1"
        )
    if config.envs_per_thread % learners:
        raise ValueError(
            f"--envs-per-thread {config.envs_per_thread} does not split evenly over {learners} learner device(s): "
            f"each actor thread sends every learner an equal share; use a multiple of {learners}"
        )


def check_layout(config: SebulbaConfig, num_devices: int) -> None:
    """Checks a layout on a host of ``num_devices`` local devices without starting JAX's backends: the device
    lists and :func:`check_batch_split`, as :func:`topology` and :func:`geometry` check them."""
    acting = actor_indices(config, num_devices)
    check_batch_split(config, len(learner_indices(config, num_devices, acting)))


def geometry(config: SebulbaConfig, topo: Topology) -> SebulbaGeometry:
    """Checks the batch knobs against the devices, with errors that say what to change (``--env-batches 0``
    counts as one batch until :func:`resolve_env_batches` has made it concrete)."""
    learners = len(topo.learner_devices)
    check_batch_split(config, learners)
    threads = config.actor_threads * len(topo.actor_devices)
    processes = jax.process_count()
    steps_per_update = processes * threads * config.envs_per_thread * config.rollout_len
    num_updates = math.ceil(config.total_env_steps / steps_per_update)
    check_update_count(num_updates, steps_per_update)
    interval = config.log_interval or max(1, config.total_env_steps // 20)
    return SebulbaGeometry(
        actor_threads=threads,
        envs_per_thread=config.envs_per_thread,
        env_batches=config.env_batches or 1,
        rollout_len=config.rollout_len,
        num_learners=learners,
        num_updates=num_updates,
        updates_per_log=even_windows(num_updates, interval / steps_per_update),
        processes=processes,
    )
