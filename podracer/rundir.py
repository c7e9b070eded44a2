"""A run directory's saved settings (``config.json``), read back and checked as the command line checks flags.

Above the configs it checks (every agent's, both architectures', checkpoints', evaluation's, host environments')
and below what reads runs back (``podracer eval``, ``--resume``, :func:`podracer.anakin.load_run`,
:func:`podracer.sebulba.load_run`). :mod:`podracer.runlog` writes the file; this module reads it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from podracer.agents import AGENTS
from podracer.checkpoint import CheckpointConfig
from podracer.config import config_from_saved
from podracer.envs.host import HostEnvConfig
from podracer.errors import RunDirectoryError
from podracer.evaluation import EvalConfig
from podracer.runlog import CONFIG_FILE


def read_run_config(run_dir: str) -> dict:
    """A run directory's saved settings (``config.json``).

    Raises FileNotFoundError if there is none, and ValueError if it does not
    hold a podracer run's settings (architecture, agent, env, agent_config).
    """
    path = os.path.join(run_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {CONFIG_FILE} in {run_dir}")
    try:
        with open(path) as f:
            saved = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise ValueError(f"{path} does not hold a podracer run's settings ({type(error).__name__}: {error})") from None
    check_run_config(saved, path)
    return saved


def check_run_config(saved: Any, path: str) -> None:
    """Refuses (ValueError naming ``path`` and the key) saved settings that the command line would refuse: an
    unknown architecture or agent, a missing group, an unknown key, a value of the wrong type or out of bounds."""
    from podracer.anakin.config import AnakinConfig  # here: importing either package imports this module
    from podracer.sebulba.config import SebulbaConfig

    if not isinstance(saved, dict):
        raise ValueError(f"{path} does not hold a podracer run's settings (a JSON object)")
    groups = {"anakin": {"anakin": AnakinConfig}, "sebulba": {"sebulba": SebulbaConfig, "host_env": HostEnvConfig}}
    architecture, agent = saved.get("architecture"), saved.get("agent")
    if not isinstance(architecture, str) or architecture not in groups:  # a list or an object is no name either
        raise ValueError(f"{path}: architecture must be one of {sorted(groups)}, got {architecture!r}")
    if not isinstance(agent, str) or agent not in AGENTS:
        raise ValueError(f"{path}: agent must be one of {sorted(AGENTS)}, got {agent!r}")
    if not isinstance(saved.get("env"), str) or not saved["env"]:
        raise ValueError(f"{path}: env must be an environment's name, got {saved.get('env')!r}")
    required = {**groups[architecture], "agent_config": AGENTS[agent][0]}
    for key, cls in {**required, "checkpoint": CheckpointConfig, "evaluation": EvalConfig}.items():
        if key in saved:
            config_from_saved(cls, saved[key], f"{path}: {key}")
        elif key in required:
            raise ValueError(f"{path} has no {key!r} settings, which every {architecture} run saves")
    processes = saved.get("processes", 1)
    if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
        raise ValueError(f"{path}: processes must be a positive integer, got {processes!r}")


def read_saved_run(run_dir: str, architecture: str) -> dict:
    """:func:`read_run_config` for reading back a run of ``architecture`` (``anakin`` or ``sebulba``), refused
    in one line (:class:`podracer.errors.RunDirectoryError`) where there is none."""
    try:
        saved = read_run_config(run_dir)
    except FileNotFoundError:
        raise RunDirectoryError(f"{run_dir}: no {CONFIG_FILE} there, so no podracer run to read") from None
    except ValueError as error:
        raise RunDirectoryError(str(error)) from None
    if saved["architecture"] != architecture:
        raise RunDirectoryError(f"{run_dir} holds a {saved['architecture']!r} run, not an {architecture} one")
    return saved
