"""Checkpoints of a run with orbax-checkpoint: periodic, on a stop signal, the last K kept, exact resume.

A checkpoint is ``RUN_DIR/checkpoints/<update>/`` holding the architecture's
whole state (an arbitrary pytree of possibly sharded, multi-process arrays,
PRNG keys included) and a JSON ``meta`` record: the format version, the run's
*fingerprint* (everything that decides its numbers) and counters (updates done,
training seconds, ...). Every process calls :meth:`Checkpointer.save`; orbax
writes each process's shards and coordinates the commit.
"""

from __future__ import annotations

import ast
import dataclasses
import gc
import json
import logging
import os
import shutil
import sys
import time
from typing import Any

import jax

from podracer.config import check_knobs, knob
from podracer.distributed import any_process

FORMAT_VERSION = 1
CHECKPOINT_DIR = "checkpoints"
DAMAGED_DIR = "damaged_checkpoints"  # where resume moves checkpoints that do not restore


class IncompatibleCheckpoint(ValueError):
    """A checkpoint that this version or this configuration cannot resume."""


class CheckpointWriteFailed(OSError):
    """A checkpoint could not be written (a full disk, a lost mount); the message is one line. The run stops
    (exit code :data:`WRITE_FAILED_EXIT`) and resumes from its newest complete checkpoint."""


WRITE_FAILED_EXIT = 74  # sysexits' EX_IOERR: neither bad input (2) nor a failed run (1)


class CheckpointUnreadable(ValueError):
    """No checkpoint of a run could be read back."""


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    checkpoint_every: int = knob(0, "updates between checkpoints (0: only on a stop signal and at the end)", minimum=0)
    checkpoint_minutes: float = knob(
        0.0, "also checkpoint when this many minutes passed since the last (0: off)", minimum=0
    )
    checkpoint_keep: int = knob(3, "checkpoints kept (the oldest are deleted)", minimum=1)


LOGGING_KNOBS = ("log_interval",)  # change what is logged, not what is learnt


def settings_fingerprint(settings: dict) -> dict:
    """``settings`` as JSON, without logging knobs at any depth: what a resume must match."""

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in LOGGING_KNOBS}
        return value

    return json.loads(json.dumps(strip(settings)))


def _refuse_links(directory: str) -> None:
    """Refuses a checkpoint folder that is a symbolic link: restoring would follow it out of the run directory,
    and the keep-K rotation would delete what it points to. (The ``checkpoints`` folder itself may be a link,
    to keep checkpoints on another disk.)"""
    if not os.path.isdir(directory):
        return
    for name in sorted(os.listdir(directory)):
        if os.path.islink(os.path.join(directory, name)):
            raise ValueError(
                f"{os.path.join(directory, name)} is a symbolic link; podracer reads, writes and deletes "
                "checkpoints only as folders of their own (move what it points to in its place, or remove it)"
            )


def _manager(run_dir: str, keep: int = 3):
    import orbax.checkpoint as ocp

    _refuse_links(os.path.abspath(os.path.join(run_dir, CHECKPOINT_DIR)))
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False)
    return ocp.CheckpointManager(os.path.abspath(os.path.join(run_dir, CHECKPOINT_DIR)), options=options)


class Checkpointer:
    """Saves ``(state, counters)`` under ``run_dir`` when due; ``run_dir=None`` saves nothing."""

    def __init__(
        self,
        run_dir: str | None,
        fingerprint: dict,
        config: CheckpointConfig = CheckpointConfig(),
        start_update: int = 0,
    ):
        check_knobs(config)
        self.config, self.fingerprint = config, fingerprint
        self.manager = _manager(run_dir, config.checkpoint_keep) if run_dir is not None else None
        self.last_update, self.last_time = start_update, time.monotonic()  # a resumed run keeps its schedule

    def updates_until_due(self, update: int) -> int | float:
        """Updates from ``update`` to the next checkpoint by ``--checkpoint-every`` (inf without one)."""
        every = self.config.checkpoint_every
        return max(1, every - (update - self.last_update)) if every > 0 else float("inf")

    def due(self, update: int) -> bool:
        every, minutes = self.config.checkpoint_every, self.config.checkpoint_minutes
        by_updates = every > 0 and update - self.last_update >= every
        by_time = minutes > 0 and any_process(time.monotonic() - self.last_time >= 60 * minutes)  # clocks differ
        return by_updates or by_time

    def save(self, update: int, state: Any, counters: dict) -> None:
        if self.manager is None or update in self.manager.all_steps():
            return
        import orbax.checkpoint as ocp

        meta = {"format_version": FORMAT_VERSION, "fingerprint": self.fingerprint, "counters": counters}
        absl_logger = logging.getLogger("absl")
        level = absl_logger.level
        absl_logger.setLevel(logging.CRITICAL)  # orbax logs a traceback per writer thread; the error below says it
        _drop_closed_loop_reports()
        try:
            self.manager.save(
                update, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
            )
            self.manager.wait_until_finished()
        except Exception as error:  # noqa: BLE001 - tensorstore's and orbax's write errors have no common type
            _silence_the_aftermath()
            directory = str(self.manager.directory)
            free = shutil.disk_usage(directory).free if os.path.isdir(directory) else 0
            raise CheckpointWriteFailed(
                f"could not write the checkpoint at update {update} into {directory} ({_brief(error)[:160]}); "
                f"{free / 2**20:,.1f} MiB free there. Free space, then --resume: the run continues from its newest "
                "complete checkpoint"
            ) from None
        finally:
            absl_logger.setLevel(level)
        self.last_update, self.last_time = update, time.monotonic()

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()


def _silence_the_aftermath() -> None:
    """After a failed save, the run stops with one line that says why; orbax's writer tasks that failed with the
    same error are reported again by asyncio ("Future exception was never retrieved", logged when they are
    collected, as late as the interpreter's exit), each with a traceback. Those reports are silenced for the rest
    of the process."""
    logging.getLogger("asyncio").setLevel(logging.CRITICAL + 1)
    gc.collect()  # the failed tasks are reported now, while silenced, not at an exit that outlives this call


def _is_closed_loop_report(error: BaseException | None) -> bool:
    return isinstance(error, RuntimeError) and str(error) == "Event loop is closed"


def _drop_closed_loop_reports() -> None:
    """Makes ``sys.unraisablehook`` print nothing for asyncio's ``RuntimeError: Event loop is closed`` (any other
    report still reaches it), once per process.

    A tensorstore write that fails after orbax has closed its save's event loop (a
    disk that filled up during the save) calls back into that loop from C++; the
    error that raises cannot be raised anywhere, so it goes to the unraisable hook,
    which prints it as a bare traceback: seen on a full 2 MiB tmpfs, 3 to 16 of
    them beside the run's one line, during the save and after it.
    """
    hook = sys.unraisablehook
    if getattr(hook, "podracer_quiet", False):
        return

    def quiet(report):
        if not _is_closed_loop_report(report.exc_value):
            hook(report)

    quiet.podracer_quiet = True
    sys.unraisablehook = quiet


def latest_update(run_dir: str) -> int | None:
    """The update of the newest checkpoint in ``run_dir``, or None."""
    manager = _manager(run_dir)
    try:
        return manager.latest_step()
    finally:
        manager.close()


def _differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """The settings that differ, as lines. A setting the checkpoint lacks is a knob added since it was written:
    a resumed run takes its default, which keeps the behaviour the run had, so it is no difference."""
    out = []
    for key in sorted(saved):
        a, b = saved[key], current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} in the checkpoint, {b!r} now")
    return out


def _brief(error: BaseException) -> str:
    """One line about ``error`` (orbax's own messages run to many lines)."""
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first[:200]}"


def _remove_partial_saves(directory: str) -> None:
    """Deletes the temporary folders of saves that never finished (a process killed while saving)."""
    if jax.process_index() != 0 or not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if ".orbax-checkpoint-tmp" in name:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _set_aside(run_dir: str, steps: list[int]) -> None:
    """Moves damaged checkpoints out of the way, so the resumed run can save those updates anew."""
    aside = os.path.join(run_dir, DAMAGED_DIR)
    os.makedirs(aside, exist_ok=True)
    for step in steps:
        target = os.path.join(aside, f"{step}-{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.move(os.path.join(run_dir, CHECKPOINT_DIR, str(step)), target)


def _check_compatible(meta: dict, step: int, run_dir: str, fingerprint: dict) -> None:
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise IncompatibleCheckpoint(
            f"the checkpoint at update {step} has format version {version}; this podracer reads version "
            f"{FORMAT_VERSION}: resume it with the podracer version that wrote it"
        )
    differences = _differences(meta["fingerprint"], fingerprint)
    if differences:
        raise IncompatibleCheckpoint(
            f"{run_dir} was run with a different configuration; resume it unchanged or start a new run: "
            + "; ".join(differences)
        )


def restore(
    run_dir: str, like: Any, fingerprint: dict, update: int | None = None, repair: bool = True
) -> tuple[Any, dict] | None:
    """The newest checkpoint that restores: ``(state, counters)``, or None when there is none yet; ``like``
    is a state of the right structure and shardings. ``update`` restores that checkpoint only (a ValueError
    listing the others if there is none); ``repair=False`` leaves the run directory untouched (for reading a
    run, not continuing it).

    A checkpoint that cannot be read (a damaged file, a missing one) is skipped,
    with a warning that names it and why, for the one before it; folders of
    saves that never finished are deleted first. Raises
    :class:`IncompatibleCheckpoint` for another format version or a fingerprint
    that differs (naming the differences) and :class:`CheckpointUnreadable` when
    none of the checkpoints there restores.
    """
    import orbax.checkpoint as ocp

    directory = os.path.abspath(os.path.join(run_dir, CHECKPOINT_DIR))
    if repair:
        _remove_partial_saves(directory)
    manager = _manager(run_dir)
    try:
        steps = sorted(manager.all_steps(), reverse=True)
        if not steps:
            return None
        if update is not None:
            if update not in steps:
                raise ValueError(
                    f"{run_dir} has no checkpoint at update {update}; it has {', '.join(map(str, sorted(steps)))}"
                )
            steps = [update]
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        skipped = []
        for step in steps:
            try:
                meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
                _check_compatible(meta, step, run_dir, fingerprint)
                state = _restore_state(manager, step, abstract, _fields_on_disk(directory, step))
            except IncompatibleCheckpoint:
                raise
            except Exception as error:  # noqa: BLE001 - whatever orbax raises for a damaged checkpoint
                skipped.append(f"update {step} ({_brief(error)})")
                continue
            if skipped and jax.process_index() == 0:
                if repair:
                    _set_aside(run_dir, [s for s in steps if s > step])
                where = f"resuming from update {step} (the damaged ones are in {DAMAGED_DIR}/)"
                print(
                    f"warning: skipped the checkpoint(s) that did not restore: {'; '.join(skipped)}; "
                    + (where if repair else f"reading the one at update {step} instead"),
                    file=sys.stderr,
                )
            return state, meta["counters"]
        raise CheckpointUnreadable(f"no checkpoint in {directory} restores: {'; '.join(skipped)}")
    finally:
        manager.close()


def _fields_on_disk(directory: str, step: int) -> set[str] | None:
    """The top-level fields of the state saved at ``step`` (from orbax's metadata file), or None if unreadable."""
    try:
        with open(os.path.join(directory, str(step), "state", "_METADATA")) as f:
            paths = json.load(f)["tree_metadata"]
        return {ast.literal_eval(path)[0] for path in paths}
    except (OSError, ValueError, KeyError, TypeError, SyntaxError, IndexError):
        return None


def _restore_state(manager, step: int, abstract: Any, on_disk: set[str] | None) -> Any:
    """The state at ``step`` restored into ``abstract``'s structure. A checkpoint written before an empty field
    of the state existed (an Anakin run without a sweep has no settings and no population: ``{}`` and ``()``)
    lacks it, and orbax refuses a structure with a node more: such fields are left out of what is read (orbax
    matches a NamedTuple and a dict of its fields alike) and put back empty."""
    import orbax.checkpoint as ocp

    missing = set(getattr(abstract, "_fields", ())) - (on_disk or set(getattr(abstract, "_fields", ())))
    empty = {name for name in missing if not jax.tree.leaves(getattr(abstract, name))}
    if not missing or missing != empty:  # the same structure, or one that differs in arrays: orbax says how
        return manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))).state
    present = {name: value for name, value in abstract._asdict().items() if name not in missing}
    stored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(present))).state
    return abstract._replace(**{name: stored[name] for name in present})


def restore_for_reading(run_dir: str, like: Any, fingerprint: dict, update: int | None = None) -> tuple[Any, dict]:
    """:func:`restore` without touching the run directory, for reading a run back (evaluation, notebooks):
    ``(state, counters)``; a :class:`podracer.errors.RunDirectoryError` in one line when nothing restores."""
    from podracer.errors import RunDirectoryError

    try:
        restored = restore(run_dir, like, fingerprint, update=update, repair=False)
    except (IncompatibleCheckpoint, CheckpointUnreadable) as error:
        raise RunDirectoryError(str(error)) from None
    except ValueError as error:
        raise RunDirectoryError(str(error)) from None
    if restored is None:
        raise RunDirectoryError(
            f"{run_dir} holds no checkpoint yet (a run saves one at its end, on a stop signal "
            "and with --checkpoint-every)"
        )
    return restored
