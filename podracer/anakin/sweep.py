"""Hyperparameter batches: ``--sweep NAME=V1,V2 ...`` trains the grid of settings (x seeds) in one Anakin program.

Each agent of the program carries its own values of the swept settings in its
runner state (:attr:`podracer.anakin.program.RunnerState.hparams`, one float32
scalar per setting); inside the compiled update the agent is rebuilt from its
config with those values in place of the fixed ones, so one trace serves every
member. Only floating-point settings can be swept: an integer, a switch or a
choice decides the program's shapes, loop counts or structure (a float that does,
such as MuZero's ``replay_ratio``, is declared with ``knob(..., sweepable=False)``).

Agents are laid out member-major: agent ``i`` is member ``i // seeds`` with seed
``seed + i % seeds``, so every member sees the same seeds.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import typing
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from podracer.config import check_knobs, flag_name
from podracer.types import Agent


class Sweep(NamedTuple):
    """The grid of a ``--sweep`` and how to build each member's agent."""

    names: tuple[str, ...]  # the swept settings, in the order given
    members: tuple[dict[str, float], ...]  # each member's values, the grid in row-major order of ``names``
    agent_with: Callable[[dict], Agent]  # {name: value (a float or a traced scalar)} -> the agent with them
    bounds: dict  # {name: (minimum, maximum)} of each knob, None where it has none (PBT clips into them)

    def values(self, seeds: int) -> dict[str, np.ndarray]:
        """``{name: [members * seeds] float32}``: every agent's value, member-major."""
        return {name: np.repeat(np.array([m[name] for m in self.members], np.float32), seeds) for name in self.names}

    def describe(self, agent: int, seeds: int, first_seed: int) -> str:
        """``"learning_rate=0.001 entropy_coef=0.01 seed 2"`` for agent ``agent`` of the program."""
        settings = " ".join(f"{name}={value:g}" for name, value in self.members[agent // seeds].items())
        return f"{settings} seed {first_seed + agent % seeds}"


def sweepable(config_class: type) -> list[str]:
    """The settings of agent config ``config_class`` that ``--sweep`` can vary."""
    hints = typing.get_type_hints(config_class)
    return [
        f.name for f in dataclasses.fields(config_class) if hints[f.name] is float and f.metadata.get("sweepable", True)
    ]


def _parse(spec: str, config) -> tuple[str, tuple[float, ...]]:
    """``"learning_rate=1e-4,3e-4"`` -> ``("learning_rate", (1e-4, 3e-4))``, checked against ``config``'s fields."""
    name, equals, text = spec.partition("=")
    name = name.strip().lstrip("-").replace("-", "_")
    if not equals or not name or not text.strip():
        raise ValueError(f"--sweep {spec!r}: write NAME=VALUE,VALUE,... (e.g. learning_rate=1e-4,3e-4)")
    fields = {f.name for f in dataclasses.fields(config)}
    allowed = sweepable(type(config))
    if name not in fields:
        raise ValueError(f"--sweep {spec!r}: the agent has no setting {name!r}; it can sweep {', '.join(allowed)}")
    if name not in allowed:
        raise ValueError(
            f"--sweep {spec!r}: {flag_name(name)} decides the program's shapes or structure, so each of its values "
            f"needs a program of its own (run them one by one); --sweep varies {', '.join(allowed)}"
        )
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"--sweep {spec!r}: the values must be numbers separated by commas") from None
    if len(set(values)) != len(values):
        raise ValueError(f"--sweep {spec!r}: a value appears twice")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"--sweep {spec!r}: the values must be finite")
    return name, values


def make_sweep(make: Callable, config, spec, shape, specs: Sequence[str]) -> Sweep | None:
    """The :class:`Sweep` of ``specs`` (``--sweep``'s words) for the agent ``make(config, spec, shape)``, or
    None without one. Every member's agent is built once here, so its settings pass the agent's own checks (a
    negative learning rate is refused naming the member) before anything is traced."""
    if not specs:
        return None
    grid = dict(_parse(s, config) for s in specs)
    if len(grid) != len(specs):
        raise ValueError("--sweep: a setting is named twice; give all its values in one NAME=V1,V2 word")
    names = tuple(grid)
    members = tuple(dict(zip(names, values)) for values in itertools.product(*grid.values()))
    for member in members:
        try:
            member_config = dataclasses.replace(config, **member)
            check_knobs(member_config)
            make(member_config, spec, shape)
        except ValueError as error:
            settings = " ".join(f"{k}={v:g}" for k, v in member.items())
            raise ValueError(f"--sweep member {settings}: {error}") from None

    def agent_with(values: dict) -> Agent:
        return make(dataclasses.replace(config, **values), spec, shape)

    fields = {f.name: f for f in dataclasses.fields(config)}
    bounds = {name: (fields[name].metadata.get("minimum"), fields[name].metadata.get("maximum")) for name in names}
    return Sweep(names, members, agent_with, bounds)
