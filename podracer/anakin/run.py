"""Runs an Anakin experiment from the host: the Anakin program handed to the shared driver.

Compile once, then call the program for a window of updates at a time (or one
update per call where a device loop is slow); :func:`podracer.driver.drive`
does the logging, checkpoints, signals and resume.
"""

from __future__ import annotations

import dataclasses
import functools
import threading

import jax
import numpy as np

from podracer import envs, evaluation
from podracer.agents import make_agent
from podracer.anakin.config import AnakinConfig, geometry, loop_on_device
from podracer.anakin.evaluate import AnakinEvaluator, first_lane
from podracer.anakin.program import anakin_mesh, make_anakin
from podracer.anakin.sweep import Sweep, make_sweep
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
    agent, sweep = build_agent(agent_name, agent_config, env, config)
    about = {"agent": agent_name, "env": env_name, "agent_config": dataclasses.asdict(agent_config)}
    return train_agent(
        agent,
        env,
        config,
        about,
        sweep=sweep,
        run_dir=run_dir,
        quiet=quiet,
        checkpoint=checkpoint,
        resume=resume,
        evaluation=evaluation,
    )


def build_agent(agent_name: str, agent_config, env, config: AnakinConfig) -> tuple[Agent, Sweep | None]:
    """The agent ``agent_name`` for ``env`` at ``config``'s batch shape, and its ``--sweep`` (None without)."""
    geo = geometry(dataclasses.replace(config, pbt_interval=0), len(select_devices(config.num_devices)))  # shape
    shape = BatchShape(geo.num_updates, geo.rollout_len, geo.envs_per_lane)
    make = functools.partial(make_agent, agent_name)
    return make(agent_config, env.spec, shape), make_sweep(make, agent_config, env.spec, shape, config.sweep)


def anakin_fingerprint(about: dict, config: AnakinConfig, num_devices: int) -> dict:
    """What decides an Anakin run's numbers (see :func:`podracer.checkpoint.settings_fingerprint`)."""
    return settings_fingerprint({**about, "anakin": dataclasses.asdict(config), "num_devices": num_devices})


def train_agent(
    agent: Agent, env, config: AnakinConfig, about: dict | None = None, sweep: Sweep | None = None, **options
) -> RunResult:
    """Runs any :class:`Agent` on an auto-resetting jittable ``env``; ``about`` goes into ``config.json``; a
    ``sweep`` (:func:`podracer.anakin.sweep.make_sweep`) trains each of its members beside the others.

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
    if config.sweep and sweep is None:
        raise ValueError("--sweep: pass train_agent the Sweep of podracer.anakin.sweep.make_sweep")
    return drive(anakin_program(agent, env, config, about or {}, sweep), options)


def agent_settings(state) -> dict:
    """``{"hparams": {name: [agents]}, "population": Population of [agents] or ()}`` on the host, from device 0."""
    return jax.device_get({"hparams": first_lane(state.hparams), "population": first_lane(state.population)})


def population_record(latest: dict) -> dict:
    """A record's ``hyperparameters`` (each agent's current values) and, after PBT steps in its window,
    ``pbt_steps`` (how many) and ``pbt_parents`` (whose learner, as the window began, each agent's descends
    from: its own index where it kept its own); nothing without a sweep."""
    if not latest:
        return {}
    record = {"hyperparameters": {n: [float(f"{v:.7g}") for v in values] for n, values in latest["hparams"].items()}}
    population = latest["population"]
    if population and int(population.steps[0]):
        record["pbt_steps"] = int(population.steps[0])
        record["pbt_parents"] = [int(p) for p in population.parent]
    return record


def name_agent(sweep: Sweep, latest: dict, agent: int, seeds: int, first_seed: int) -> str:
    """Agent ``agent`` as messages name it: its member's settings and its seed and, where PBT has changed its
    settings since, the settings the last step left it (``latest``: :func:`agent_settings`)."""
    name = sweep.describe(agent, seeds, first_seed)
    start = sweep.members[agent // seeds]
    now = {n: np.float32(values[agent]) for n, values in latest.get("hparams", {}).items()}
    if any(value != np.float32(start[n]) for n, value in now.items()):
        name += ", after PBT " + " ".join(f"{n}={float(value):g}" for n, value in now.items())
    return name


def anakin_program(agent: Agent, env, config: AnakinConfig, about: dict, sweep: Sweep | None = None) -> Program:
    """The Anakin program for ``agent`` on ``env`` (each member of ``sweep`` beside the others), as
    :func:`podracer.driver.drive` runs it."""
    devices = select_devices(config.num_devices)
    geo = geometry(config, len(devices), len(sweep.members) if sweep else 1)
    on_device = loop_on_device(config.update_loop)
    mesh = anakin_mesh(devices, geo.lanes)
    program = make_anakin(agent, env, geo, mesh, on_device, sweep, config.pbt_factor, config.seed)

    latest = {}  # the agents' settings and PBT bookkeeping after the last step, for the records

    def compile(state):
        run = program.run.lower(state, np.int32(geo.updates_per_call)).compile()
        jax.block_until_ready(state)

        def step(state, update: int, n: int):
            state, stats = run(state, np.int32(n))
            if sweep:
                latest.update(agent_settings(state))
            return state, fetch_replicated(stats)

        return step

    banner = (
        f"anakin: {about.get('agent', 'agent')} on {about.get('env', 'env')}, {geo.num_devices} device(s) x "
        f"{geo.lanes} lane(s) x {geo.envs_per_lane} envs x {geo.rollout_len} steps = "
        f"{geo.steps_per_update:,} steps/update, {geo.num_updates} updates, {geo.num_seeds} seed(s)"
        f"{f' x {geo.members} sweep members' if sweep else ''}, "
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
    if sweep:  # agent i of the records' per-seed lists is sweep member i // seeds, seed seed + i % seeds
        run_config["sweep"] = {"members": list(sweep.members), "seeds_per_member": geo.num_seeds}
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
        num_seeds=geo.agents,
        init=lambda: program.init(config.seed),
        compile=compile,
        running=nothing_in_the_background,
        describe=lambda window, record: population_record(latest),
        report=no_report,
        interrupt=threading.Event(),
        name_agent=(lambda i: name_agent(sweep, latest, i, geo.num_seeds, config.seed)) if sweep else None,
        make_evaluator=lambda eval_config: (  # only process 0 logs, so only it evaluates
            AnakinEvaluator(agent, env, eval_config, config.seed, geo.steps_per_update, sweep)
            if jax.process_index() == 0
            else None
        ),
    )
