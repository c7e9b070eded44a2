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
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def knob(default: Any, help: str) -> Any:
    """A dataclass field with a default and the help text its flag shows."""
    if isinstance(default, (list, dict)):
        raise TypeError("knob defaults must be immutable; use a tuple")
    return dataclasses.field(default=default, metadata={"help": help})


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, defaults: dict | None = None) -> None:
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
    """Builds dataclass ``cls`` from the flags :func:`add_flags` added."""
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        value = getattr(namespace, field.name)
        values[field.name] = tuple(value) if typing.get_origin(hints[field.name]) is tuple else value
    return cls(**values)


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The fields whose flags ``argv`` sets explicitly (rather than leaving a default or a preset's value)."""
    unset = object()
    probe = copy.deepcopy(parser)
    probe.set_defaults(**dict.fromkeys(vars(parser.parse_args(argv)), unset))
    return {name for name, value in vars(probe.parse_args(argv)).items() if value is not unset}


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``value``."""
    return -(-value // multiple) * multiple


def require_at_least_one(config: Any, *names: str) -> None:
    """Raises ValueError, naming the flag, for the first field in ``names`` whose value is below 1."""
    for name in names:
        value = getattr(config, name)
        if value < 1:
            raise ValueError(f"{flag_name(name)} must be at least 1, got {value}")


def require_choice(config: Any, name: str, choices: tuple[str, ...]) -> None:
    """Raises ValueError, naming the flag, when field ``name`` is not one of ``choices``."""
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"{flag_name(name)} must be one of {choices}, got {value!r}")
