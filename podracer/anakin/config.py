"""Anakin's knobs, and the batch geometry checked against the devices before compiling."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

from podracer.config import STEP_COUNT_MAX, check_knobs, check_update_count, even_windows, knob

UPDATE_LOOPS = ("auto", "device", "host")


@dataclasses.dataclass(frozen=True)
class AnakinConfig:
    num_envs: int = knob(64, "environments per seed in total, split evenly over devices x lanes", minimum=1)
    rollout_len: int = knob(128, "environment steps per environment between two updates", minimum=1)
    lanes: int = knob(1, "update lanes per device: vmapped learner replicas whose gradients are averaged", minimum=1)
    num_seeds: int = knob(1, "independent agents trained together in one program (seeds seed..seed+N-1)", minimum=1)
    pbt_interval: int = knob(
        0,
        "population-based training of the --sweep's agents: env steps per agent between two exploit-and-explore "
        "steps (rounded to whole updates); 0: none",
        minimum=0,
        maximum=STEP_COUNT_MAX,
    )
    pbt_quantile: float = knob(
        0.25,
        "PBT: the fraction of agents replaced at each step, by copies of the same fraction at the top",
        maximum=0.5,
    )
    pbt_factor: float = knob(1.25, "PBT: a copied setting is multiplied or divided by this, at random", minimum=1.0)
    total_env_steps: int = knob(
        500_000,
        "environment steps to train for, per seed (rounded up to whole updates)",
        minimum=1,
        maximum=STEP_COUNT_MAX,
    )
    seed: int = knob(0, "random seed")
    sweep: tuple[str, ...] = knob(
        (),
        "train a grid of agent settings in this one program, each with --num-seeds seeds: NAME=V1,V2 words, "
        "e.g. learning_rate=1e-4,3e-4 entropy_coef=0,0.01 (floating-point settings only)",
    )
    num_devices: int = knob(0, "devices to run on; 0 means every device of every process", minimum=0)
    log_interval: int = knob(
        0,
        "environment steps between log lines, evened out so that every line covers as many updates; "
        "0 means about 20 lines per run",
        minimum=0,
        maximum=STEP_COUNT_MAX,
    )
    update_loop: str = knob(
        "auto",
        "device: many updates per compiled call (a loop on the device); host: one update per call; auto: device",
        choices=UPDATE_LOOPS,
    )


def loop_on_device(choice: str) -> bool:
    """Whether the updates of one call run as a loop on the device (else one update per call): ``auto`` loops
    on the device. (Image observations on CPU used to loop on the host: XLA:CPU ran conv gradients ~8x slower
    inside a device loop until :mod:`podracer.agents.conv` gave them a form it runs fast there; measured on MinAtar
    Breakout with the conv torso, 3,391 steps/s looping on the host, 3,480 on the device.)
    """
    if choice not in UPDATE_LOOPS:
        raise ValueError(f"--update-loop must be one of {UPDATE_LOOPS}, got {choice!r}")
    return choice != "host"


class AnakinGeometry(NamedTuple):
    """How one update's batch is laid out (per seed)."""

    num_devices: int
    lanes: int
    envs_per_lane: int
    rollout_len: int
    num_seeds: int  # per member of a --sweep
    num_updates: int
    updates_per_call: int
    members: int = 1  # --sweep's grid points
    pbt_updates: int = 0  # updates between two PBT steps (0: no PBT)
    pbt_replace: int = 0  # agents replaced at each PBT step

    @property
    def agents(self) -> int:
        """Agents trained side by side in the program: members x seeds."""
        return self.members * self.num_seeds

    @property
    def replicas(self) -> int:
        return self.num_devices * self.lanes

    @property
    def steps_per_update(self) -> int:
        """Environment steps per update and seed, over all devices and lanes."""
        return self.replicas * self.envs_per_lane * self.rollout_len


def _suggest_multiples(value: int, factor: int) -> str:
    """The multiples of ``factor`` either side of ``value`` (only the one above when none is below)."""
    below = value // factor * factor
    above = below + factor
    return f"{below} or {above}" if below else str(above)


def geometry(config: AnakinConfig, num_devices: int, members: int = 1) -> AnakinGeometry:
    """Checks ``config`` against ``num_devices`` (no compilation), with errors that say what to change;
    ``members``: the points of its ``--sweep`` grid."""
    check_knobs(config)
    replicas = num_devices * config.lanes
    if config.num_envs % replicas:
        raise ValueError(
            f"--num-envs {config.num_envs} does not split evenly over {num_devices} device(s) x "
            f"{config.lanes} lane(s) = {replicas} replicas: use a multiple of {replicas} "
            f"(e.g. {_suggest_multiples(config.num_envs, replicas)}), or change --lanes/--num-devices"
        )
    steps_per_update = config.num_envs * config.rollout_len
    num_updates = math.ceil(config.total_env_steps / steps_per_update)
    check_update_count(num_updates, steps_per_update)
    interval = config.log_interval or max(1, config.total_env_steps // 20)
    updates_per_call = even_windows(num_updates, interval / steps_per_update)
    pbt_updates, pbt_replace = _pbt_schedule(config, members, steps_per_update, num_updates)
    return AnakinGeometry(
        num_devices=num_devices,
        lanes=config.lanes,
        envs_per_lane=config.num_envs // replicas,
        rollout_len=config.rollout_len,
        num_seeds=config.num_seeds,
        num_updates=num_updates,
        updates_per_call=updates_per_call,
        members=members,
        pbt_updates=pbt_updates,
        pbt_replace=pbt_replace,
    )


def _pbt_schedule(config: AnakinConfig, members: int, steps_per_update: int, num_updates: int) -> tuple[int, int]:
    """``(updates between PBT steps, agents replaced at each)``; ``(0, 0)`` without PBT. The schedule depends on
    what is learnt only (not on ``--log-interval``, which a resume may change)."""
    if not config.pbt_interval:
        return 0, 0
    agents = members * config.num_seeds
    if not config.sweep or agents < 2:
        raise ValueError(
            "--pbt-interval trains a population: the agents of a --sweep (members x --num-seeds, at least 2), whose "
            "swept settings it changes; e.g. --sweep learning_rate=1e-4,1e-3 --num-seeds 4"
        )
    if config.pbt_quantile <= 0:
        raise ValueError(f"--pbt-quantile must be above 0, got {config.pbt_quantile}")
    if config.pbt_factor <= 1:
        raise ValueError(
            f"--pbt-factor must be above 1, got {config.pbt_factor}: a copied setting is multiplied or divided by "
            "it, and by 1 no copy would ever explore"
        )
    interval = max(1, round(config.pbt_interval / steps_per_update))
    if interval >= num_updates:
        raise ValueError(
            f"--pbt-interval {config.pbt_interval} is {interval} updates of {steps_per_update:,} steps, and the run "
            f"has {num_updates}: no PBT step would happen; use a shorter interval"
        )
    return interval, max(1, int(agents * config.pbt_quantile))
