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
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


INT32_MAX = 2**31 - 1  # the default bound of an integer knob: counts, sizes and seeds become int32 on the device
STEP_COUNT_MAX = 2**53  # for knobs counted in env steps, which stay Python integers


def knob(
    default: Any,
    help: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] | None = None,
    sweepable: bool = True,
) -> Any:
    """A dataclass field with a default, the help text its flag shows, and its bounds (see :func:`check_knobs`);
    an integer knob's ``maximum`` is :data:`INT32_MAX` unless given. A float knob is ``sweepable`` (``--sweep``
    may give each agent of a program its own value) unless the program's shapes or loop counts depend on it."""
    if isinstance(default, (list, dict)):
        raise TypeError("knob defaults must be immutable; use a tuple")
    metadata = {"help": help, "minimum": minimum, "maximum": maximum, "choices": choices, "sweepable": sweepable}
    return dataclasses.field(default=default, metadata=metadata)


def check_knobs(config: Any) -> None:
    """Raises ValueError, naming the flag, for the first field of dataclass ``config`` out of bounds.

    Every float must be finite; a field with a ``minimum`` must reach it and
    one with a ``maximum`` stay within it (an integer: :data:`INT32_MAX` by
    default); the integers of a tuple (layer widths, channels, indices) must be
    between the ``minimum`` (1 unless given) and that; a field with ``choices`` must be one of them. Called where a config is
    consumed, so bad input is refused before anything compiles, from the command
    line or a notebook.
    """
    for field in dataclasses.fields(config):
        value, flag = getattr(config, field.name), flag_name(field.name)
        if is_traced(value):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{flag} must be a finite number, got {value}")
        minimum, maximum, choices = (field.metadata.get(key) for key in ("minimum", "maximum", "choices"))
        if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
            continue  # words (--sweep's NAME=VALUES): their reader checks them
        if isinstance(value, tuple):
            low = 1 if minimum is None else minimum
            if not all(isinstance(v, int) and not isinstance(v, bool) and low <= v <= INT32_MAX for v in value):
                kind = "sizes" if minimum is None else "integers"
                raise ValueError(f"{flag} takes {kind} of at least {low}, got {' '.join(map(str, value)) or 'none'}")
            continue
        if maximum is None and isinstance(value, int) and not isinstance(value, bool):
            maximum = INT32_MAX
        if minimum is not None and value < minimum:
            raise ValueError(f"{flag} must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ValueError(f"{flag} must be at most {maximum}, got {value}")
        if choices is not None and value not in choices:
            raise ValueError(f"{flag} must be one of {choices}, got {value!r}")


def check_update_count(num_updates: int, steps_per_update: int) -> None:
    """Raises ValueError, naming ``--total-env-steps``, where the run's updates outnumber what an int32 counter
    on the device holds."""
    if num_updates > INT32_MAX:
        raise ValueError(
            f"--total-env-steps makes {num_updates:,} updates of {steps_per_update:,} steps, more than the "
            f"{INT32_MAX:,} a run counts; use at most {INT32_MAX * steps_per_update:,} steps"
        )


def even_windows(num_updates: int, interval_updates: float) -> int:
    """Updates per log window: about ``interval_updates``, evened out so every window holds as many.

    A short last window (say 1 update after 1953) would often end no episode.
    """
    per_window = min(num_updates, max(1, round(interval_updates)))
    return -(-num_updates // -(-num_updates // per_window))


def is_traced(value: Any) -> bool:
    """Whether a knob's ``value`` is a JAX tracer rather than a Python value: a ``--sweep`` member's setting
    inside the compiled program (:mod:`podracer.anakin.sweep`), whose concrete values were checked before."""
    return not isinstance(value, (bool, int, float, str, tuple, type(None)))


def config_from_saved(cls: type[T], values: Any, where: str) -> T:
    """Dataclass ``cls`` from saved JSON ``values`` (a group of ``config.json``) with the command line's checks.

    A missing key takes its default (a run saved before a knob existed); an unknown key, a value of the wrong
    type or one out of bounds raises ValueError naming ``where`` and the key.
    """
    if not isinstance(values, dict):
        raise ValueError(f"{where} must be an object of settings, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    known = {field.name for field in dataclasses.fields(cls)}
    typed = {}
    for key, value in values.items():
        if key not in known:
            raise ValueError(f"{where}.{key} is not a setting of {cls.__name__}")
        typed[key] = _typed(hints[key], value, f"{where}.{key}")
    config = cls(**typed)
    try:
        check_knobs(config)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    return config


def _typed(kind: Any, value: Any, where: str) -> Any:
    """``value`` as field type ``kind`` (a JSON list as a tuple, an int as a float), or ValueError."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is tuple:
        item = str if str in args else int
        if isinstance(value, (list, tuple)) and all(isinstance(v, item) and not isinstance(v, bool) for v in value):
            return tuple(value)
        raise ValueError(f"{where} must be a list of {'words' if item is str else 'integers'}, got {value!r}")
    if origin in (typing.Union, types.UnionType):  # X | None
        if value is None and type(None) in args:
            return None
        kind = next(arg for arg in args if arg is not type(None))
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {bool: isinstance(value, bool), int: number and isinstance(value, int), float: number}.get(
        kind, isinstance(value, kind)
    )
    if not ok:
        raise ValueError(f"{where} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return float(value) if kind is float else value


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
