"""Runs an Anakin experiment from the host: the Anakin program handed to the shared driver.

Compile once, then call the program for a window of updates at a time (or one
update per call where a device loop is slow); :func:`podracer.driver.drive`
does the logging, checkpoints, signals and resume.
"""

from __future__ import annotations

import dataclasses
import threading

import jax
import numpy as np

from podracer import envs, evaluation
from podracer.agents import make_agent
from podracer.anakin.config import AnakinConfig, geometry, loop_on_device
from podracer.anakin.evaluate import AnakinEvaluator
from podracer.anakin.program import anakin_mesh, make_anakin
from podracer.checkpoint import CheckpointConfig, settings_fingerprint
from podracer.driver import Program, RunOptions, RunResult, drive, no_report, nothing_in_the_background
from podracer.evaluation import EvalConfig
from podracer.parallel import fetch_replicated
from podracer.types import Agent, BatchShape

AnakinResult = RunResult  # the final global RunnerState, the records, timings and counts


def select_devices(num_devices: int) -> list[jax.Device]:
    devices = jax.devices()
    if num_devices == 0:
        return devices
    if num_devices > len(devices):
        raise ValueError(f"--num-devices {num_devices} asks for more than the {len(devices)} device(s) available")
    return devices[:num_devices]


def train(
    agent_name: str,
    agent_config,
    env_name: str,
    config: AnakinConfig,
    run_dir: str | None = None,
    quiet: bool = False,
    checkpoint: CheckpointConfig = CheckpointConfig(),
    resume: bool = False,
    evaluation: EvalConfig = EvalConfig(),
) -> RunResult:
    """Trains ``agent_name`` on ``env_name`` with Anakin; see ``podracer anakin --help``.

    With ``resume``, continues the run in ``run_dir`` from its newest checkpoint.
    """
    env = envs.make(env_name)
    geo = geometry(config, len(select_devices(config.num_devices)))
    shape = BatchShape(geo.num_updates, geo.rollout_len, geo.envs_per_lane)
    agent = make_agent(agent_name, agent_config, env.spec, shape)
    about = {"agent": agent_name, "env": env_name, "agent_config": dataclasses.asdict(agent_config)}
    return train_agent(
        agent,
        env,
        config,
        about,
        run_dir=run_dir,
        quiet=quiet,
        checkpoint=checkpoint,
        resume=resume,
        evaluation=evaluation,
    )


def anakin_fingerprint(about: dict, config: AnakinConfig, num_devices: int) -> dict:
    """What decides an Anakin run's numbers (see :func:`podracer.checkpoint.settings_fingerprint`)."""
    return settings_fingerprint({**about, "anakin": dataclasses.asdict(config), "num_devices": num_devices})


def train_agent(agent: Agent, env, config: AnakinConfig, about: dict | None = None, **options) -> RunResult:
    """Runs any :class:`Agent` on an auto-resetting jittable ``env``; ``about`` goes into ``config.json``.

    ``options`` are :class:`podracer.driver.RunOptions`' fields: ``run_dir``,
    ``quiet``, ``checkpoint`` (a :class:`CheckpointConfig`), ``resume`` and
    ``evaluation`` (an :class:`EvalConfig`).

    Checkpoints (every ``checkpoint.checkpoint_every`` updates, on SIGINT/SIGTERM
    and at the end) hold the whole runner state: parameters, optimiser state,
    environment states, keys and counters, so a resumed run ends with exactly the
    parameters of an uninterrupted one. Only process 0 logs.
    """
    options = RunOptions(**options)
    evaluation.check(options.evaluation)
    return drive(anakin_program(agent, env, config, about or {}), options)


def anakin_program(agent: Agent, env, config: AnakinConfig, about: dict) -> Program:
    """The Anakin program for ``agent`` on ``env``, as :func:`podracer.driver.drive` runs it."""
    devices = select_devices(config.num_devices)
    geo = geometry(config, len(devices))
    on_device = loop_on_device(config.update_loop)
    program = make_anakin(agent, env, geo, anakin_mesh(devices, geo.lanes), on_device)

    def compile(state):
        run = program.run.lower(state, np.int32(geo.updates_per_call)).compile()
        jax.block_until_ready(state)

        def step(state, update: int, n: int):
            state, stats = run(state, np.int32(n))
            return state, fetch_replicated(stats)

        return step

    banner = (
        f"anakin: {about.get('agent', 'agent')} on {about.get('env', 'env')}, {geo.num_devices} device(s) x "
        f"{geo.lanes} lane(s) x {geo.envs_per_lane} envs x {geo.rollout_len} steps = "
        f"{geo.steps_per_update:,} steps/update, {geo.num_updates} updates, {geo.num_seeds} seed(s), "
        f"{'a device loop of' if on_device else 'one update per call, logging every'} {geo.updates_per_call} updates"
    )
    run_config = {
        "architecture": "anakin",
        **about,
        "anakin": dataclasses.asdict(config),
        "geometry": geo._asdict(),
        "devices": [str(d) for d in devices],
        "jax_version": jax.__version__,
    }
    return Program(
        banner=banner,
        config=run_config,
        fingerprint=anakin_fingerprint(about, config, len(devices)),
        num_updates=geo.num_updates,
        updates_per_window=geo.updates_per_call,
        updates_per_step=geo.updates_per_call if on_device else 1,
        steps_per_update=geo.steps_per_update,
        frame_skip=1,
        seed=config.seed,
        num_seeds=geo.num_seeds,
        init=lambda: program.init(config.seed),
        compile=compile,
        running=nothing_in_the_background,
        describe=lambda window, record: {},
        report=no_report,
        interrupt=threading.Event(),
        make_evaluator=lambda eval_config: (  # only process 0 logs, so only it evaluates
            AnakinEvaluator(agent, env, eval_config, config.seed, geo.steps_per_update)
            if jax.process_index() == 0
            else None
        ),
    )
