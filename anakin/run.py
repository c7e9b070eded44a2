"""Runs an Anakin experiment from the host: compile once, then call, log, repeat."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, NamedTuple

import jax
import numpy as np

import envs
from agents import make_agent
from anakin.config import AnakinConfig, geometry, loop_on_device
from anakin.program import CallStats, RunnerState, anakin_mesh, make_anakin
from podracer.checkpoint import CheckpointConfig, Checkpointer, restore
from podracer.checkpoint import fingerprint as settings_fingerprint
from podracer.distributed import any_process
from podracer.errors import NonFiniteLossError
from podracer.parallel import fetch_replicated
from podracer.runlog import RunLog, Stopwatch
from podracer.signals import stop_on_signals
from podracer.types import Agent, BatchShape


class AnakinResult(NamedTuple):
    state: RunnerState  # the final global runner state
    records: list[dict]  # what was logged, one dict per call
    compile_seconds: float
    train_seconds: float  # wall time of the compiled calls alone
    env_steps: int  # per seed, reached by this run (all of them, unless stopped)
    stopped_by: str | None = None  # the signal that stopped the run early (a checkpoint was written)


def select_devices(num_devices: int) -> list[jax.Device]:
    devices = jax.devices()
    if num_devices == 0:
        return devices
    if num_devices > len(devices):
        raise ValueError(f"--num-devices {num_devices} asks for more than the {len(devices)} device(s) available")
    return devices[:num_devices]


def _episode_means(stats: CallStats) -> dict[str, Any]:
    episodes = stats.episodes
    with np.errstate(invalid="ignore", divide="ignore"):
        returns = np.where(episodes > 0, stats.episode_return / episodes, np.nan)
        lengths = np.where(episodes > 0, stats.episode_length / episodes, np.nan)
    record = {
        "episode_return": float(np.nanmean(returns)) if np.isfinite(returns).any() else None,
        "episode_length": float(np.nanmean(lengths)) if np.isfinite(lengths).any() else None,
        "episodes": int(episodes.sum()),
    }
    if len(episodes) > 1:
        record["episode_return_per_seed"] = returns
        record["episode_return_min"] = float(np.nanmin(returns)) if np.isfinite(returns).any() else None
        record["episode_return_max"] = float(np.nanmax(returns)) if np.isfinite(returns).any() else None
    return record


def _check_finite(stats: CallStats, first_update: int, seed: int) -> None:
    bad = np.flatnonzero(stats.first_nonfinite >= 0)
    if bad.size:
        s = int(bad[0])
        update = first_update + int(stats.first_nonfinite[s]) + 1
        raise NonFiniteLossError(
            f"the loss became non-finite at update {update} (seed {seed + s}); "
            "try a lower --learning-rate or --max-grad-norm"
        )


def train(
    agent_name: str,
    agent_config,
    env_name: str,
    config: AnakinConfig,
    run_dir: str | None = None,
    quiet: bool = False,
    checkpoint: CheckpointConfig = CheckpointConfig(),
    resume: bool = False,
) -> AnakinResult:
    """Trains ``agent_name`` on ``env_name`` with Anakin; see ``podracer anakin --help``.

    With ``resume``, continues the run in ``run_dir`` from its newest checkpoint.
    """
    env = envs.make(env_name)
    geo = geometry(config, len(select_devices(config.num_devices)))
    shape = BatchShape(geo.num_updates, geo.rollout_len, geo.envs_per_lane)
    agent = make_agent(agent_name, agent_config, env.spec, shape)
    about = {"agent": agent_name, "env": env_name, "agent_config": dataclasses.asdict(agent_config)}
    return train_agent(agent, env, config, run_dir, quiet, about, checkpoint, resume)


def fingerprint(about: dict, config: AnakinConfig, num_devices: int) -> dict:
    """What decides an Anakin run's numbers (see :func:`podracer.checkpoint.fingerprint`)."""
    return settings_fingerprint({**about, "anakin": dataclasses.asdict(config), "num_devices": num_devices})


def train_agent(
    agent: Agent,
    env,
    config: AnakinConfig,
    run_dir: str | None = None,
    quiet: bool = False,
    about: dict | None = None,
    checkpoint: CheckpointConfig = CheckpointConfig(),
    resume: bool = False,
) -> AnakinResult:
    """Runs any :class:`Agent` on an auto-resetting jittable ``env``; ``about`` goes into ``config.json``.

    Checkpoints (every ``checkpoint.checkpoint_every`` updates, on SIGINT/SIGTERM
    and at the end) hold the whole runner state: parameters, optimiser state,
    environment states, keys and counters, so a resumed run ends with exactly the
    parameters of an uninterrupted one. Only process 0 logs.
    """
    about = about or {}
    if resume and run_dir is None:
        raise ValueError("resuming needs the run directory that holds the checkpoints")
    devices = select_devices(config.num_devices)
    geo = geometry(config, len(devices))
    on_device = loop_on_device(config.update_loop, len(env.spec.observation.shape))
    program = make_anakin(agent, env, geo, anakin_mesh(devices, geo.lanes), on_device)
    total_steps = geo.num_updates * geo.steps_per_update
    run_fingerprint = fingerprint(about, config, len(devices))
    state = program.init(config.seed)
    done, clock = 0, Stopwatch()
    if resume:
        state, counters = restore(run_dir, state, run_fingerprint)
        done, clock.total = counters["update"], counters["time"]
    logging_process = jax.process_index() == 0
    log = RunLog(
        run_dir if logging_process else None,
        {
            "architecture": "anakin",
            **about,
            "anakin": dataclasses.asdict(config),
            "geometry": geo._asdict(),
            "devices": [str(d) for d in devices],
            "jax_version": jax.__version__,
        },
        total_steps,
        quiet or not logging_process,
        resume_update=done if resume else None,
    )
    checkpointer = Checkpointer(run_dir, run_fingerprint, checkpoint, start_update=done)
    stop, caught = threading.Event(), []
    try:
        log.message(
            f"anakin: {about.get('agent', 'agent')} on {about.get('env', 'env')}, {geo.num_devices} device(s) x "
            f"{geo.lanes} lane(s) x {geo.envs_per_lane} envs x {geo.rollout_len} steps = "
            f"{geo.steps_per_update:,} steps/update, {geo.num_updates} updates, {geo.num_seeds} seed(s), "
            f"{'a device loop of' if on_device else 'one update per call, logging every'} {geo.updates_per_call} updates"
        )
        if resume:
            log.message(f"resumed from the checkpoint at update {done} ({done * geo.steps_per_update:,} env steps)")
        start = time.perf_counter()
        run = program.run.lower(state, np.int32(geo.updates_per_call)).compile()
        jax.block_until_ready(state)
        compile_seconds = time.perf_counter() - start
        log.message(f"compiled in {compile_seconds:.1f}s")

        def save():
            checkpointer.save(done, state, {"update": done, "time": clock.total})

        per_call = geo.updates_per_call if program.loop_on_device else 1
        window, window_updates, window_start = None, 0, clock.total
        stopping = False  # agreed by every process: a signal may reach only some of them
        with stop_on_signals(stop, caught):
            while done < geo.num_updates and not stopping:
                n = min(per_call, geo.num_updates - done)
                with clock:
                    state, stats = run(state, np.int32(n))
                    stats = fetch_replicated(stats)
                _check_finite(stats, done, config.seed)
                done += n
                window = stats if window is None else jax.tree.map(np.add, window, stats)
                window_updates += n
                stopping = any_process(stop.is_set())
                if window_updates >= geo.updates_per_call or done == geo.num_updates or stopping:
                    _log_window(log, geo, done, clock.total, clock.total - window_start, window, window_updates)
                    window, window_updates, window_start = None, 0, clock.total
                    if checkpointer.due(done):
                        save()
            save()
        if stopping:
            reason = caught[0] if caught else "SIGTERM"  # another process was signalled
            log.message(f"stopped by {reason} at update {done}; resume with --resume {run_dir}")
            return AnakinResult(state, log.records, compile_seconds, clock.total, done * geo.steps_per_update,
                                reason)
        log.message(
            f"done: {total_steps:,} env steps per seed in {clock.total:.1f}s "
            f"({total_steps * geo.num_seeds / clock.total:,.0f} steps/s after a {compile_seconds:.1f}s compile)"
        )
        return AnakinResult(state, log.records, compile_seconds, clock.total, total_steps)
    finally:
        checkpointer.close()
        log.close()


def _log_window(log: RunLog, geo, done: int, total_seconds: float, seconds: float, window: CallStats,
                window_updates: int) -> None:
    """One record for the ``window_updates`` updates that end at update ``done``."""
    steps = window_updates * geo.steps_per_update
    log.write({
        "update": done,
        "env_steps": done * geo.steps_per_update,
        "time": total_seconds,
        "sps": steps * geo.num_seeds / seconds,
        "sps_per_seed": steps / seconds,
        **_episode_means(window),
        **{key: float(np.mean(value)) / window_updates for key, value in window.metrics.items()},
    })
