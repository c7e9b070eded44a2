"""Configuration dataclasses and their command-line flags.

Every knob is a dataclass field declared with :func:`knob`, so its default and
its help text live in one place; :func:`add_flags` turns a dataclass into
``argparse`` flags (``num_envs`` becomes ``--num-envs``) and :func:`from_flags`
builds the dataclass back from the parsed namespace.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def knob(default: Any, help: str, *, minimum: float | None = None, choices: tuple[str, ...] | None = None) -> Any:
    """A dataclass field with a default, the help text its flag shows, and its bounds (see :func:`check_knobs`)."""
    if isinstance(default, (list, dict)):
        raise TypeError("knob defaults must be immutable; use a tuple")
    return dataclasses.field(default=default, metadata={"help": help, "minimum": minimum, "choices": choices})


def check_knobs(config: Any) -> None:
    """Raises ValueError, naming the flag, for the first field of dataclass ``config`` out of bounds.

    Every float must be finite; a field with a ``minimum`` must reach it; sizes
    in a tuple (layer widths, channels) must be at least 1; a field with
    ``choices`` must be one of them. Called where a config is consumed, so bad
    input is refused before anything compiles, from the command line or a notebook.
    """
    for field in dataclasses.fields(config):
        value, flag = getattr(config, field.name), flag_name(field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{flag} must be a finite number, got {value}")
        minimum, choices = field.metadata.get("minimum"), field.metadata.get("choices")
        if minimum is not None and value < minimum:
            raise ValueError(f"{flag} must be at least {minimum}, got {value}")
        if isinstance(value, tuple) and not all(isinstance(v, int) and v >= 1 for v in value):
            raise ValueError(f"{flag} takes sizes of at least 1, got {' '.join(map(str, value)) or 'none'}")
        if choices is not None and value not in choices:
            raise ValueError(f"{flag} must be one of {choices}, got {value!r}")


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, defaults: dict | None = None
) -> None:
    """Adds one flag per field of dataclass ``cls``; ``defaults`` overrides field defaults (presets)."""
    hints = typing.get_type_hints(cls)
    defaults = defaults or {}
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        default = defaults.get(field.name, field.default)
        help_text = f"{field.metadata.get('help', '')} (default: {default})"
        name = flag_name(field.name)
        if kind is bool:
            parser.add_argument(name, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        elif typing.get_origin(kind) is tuple:
            (item,) = {arg for arg in typing.get_args(kind) if arg is not Ellipsis}
            parser.add_argument(name, type=item, nargs="+", default=default, help=help_text, metavar=field.name.upper())
        else:
            optional = typing.get_args(kind)
            base = next((a for a in optional if a is not type(None)), kind) if optional else kind
            parser.add_argument(name, type=base, default=default, help=help_text, metavar=field.name.upper())


def from_flags(cls: type[T], namespace: argparse.Namespace) -> T:
    """Builds dataclass ``cls`` from the flags :func:`add_flags` added, checked with :func:`check_knobs`."""
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        value = getattr(namespace, field.name)
        values[field.name] = tuple(value) if typing.get_origin(hints[field.name]) is tuple else value
    config = cls(**values)
    check_knobs(config)
    return config


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The fields whose flags ``argv`` sets explicitly (rather than leaving a default or a preset's value)."""
    unset = object()
    probe = copy.deepcopy(parser)
    probe.set_defaults(**dict.fromkeys(vars(parser.parse_args(argv)), unset))
    return {name for name, value in vars(probe.parse_args(argv)).items() if value is not unset}


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``value``."""
    return -(-value // multiple) * multiple
