"""A run's record: ``config.json``, ``metrics.jsonl``, TensorBoard events and console progress.

Every architecture logs through :class:`RunLog`, one record per log step. A
record is a flat dict of JSON-able values; ``env_steps`` is the x-axis (per
seed), ``sps`` the steady-state throughput, ``time`` seconds of training
excluding compilation. Non-finite numbers are written as ``null``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import defaultdict
from typing import Any, TextIO

import numpy as np

from podracer.checkpoint import CHECKPOINT_DIR

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def run_started(run_dir: str) -> bool:
    """Whether ``run_dir`` holds a run that got somewhere: a record in its metrics or a checkpoint.

    A directory that a start left with only ``config.json`` (stopped, killed or
    refused before its first record) is not started: the same command may reuse it.
    """
    metrics_path = os.path.join(run_dir, METRICS_FILE)
    if os.path.exists(metrics_path) and any(line.strip() for line in open(metrics_path)):
        return True
    checkpoints = os.path.join(run_dir, CHECKPOINT_DIR)
    return os.path.isdir(checkpoints) and any(name.isdigit() for name in os.listdir(checkpoints))


def read_records(path: str) -> list[dict]:
    """The records of a ``metrics.jsonl``.

    A torn last line (what a crash, a kill or a full disk leaves) is dropped with a
    warning on stderr; a bad line before the last is an error naming the file and line.
    """
    records, torn = parse_records(path)
    if torn is not None:
        print(torn_line_warning(path, torn), file=sys.stderr)
    return records


def parse_records(path: str) -> tuple[list, int | None]:
    """The JSON values of a ``metrics.jsonl``'s lines and the number of its torn last line (None if it is whole);
    ValueError naming the file and line for a bad line before the last."""
    with open(path) as f:
        lines = [(number, line) for number, line in enumerate(f.read().split("\n"), 1) if line.strip()]
    records, torn = [], None
    for number, line in lines:
        try:
            records.append(json.loads(line))
        except (json.JSONDecodeError, RecursionError) as error:
            if number != lines[-1][0]:
                raise ValueError(f"{path}: line {number} is not a JSON record ({error})") from None
            torn = number
    return records, torn


def torn_line_warning(path: str, number: int) -> str:
    return f"warning: {path}: dropped its torn last line {number} (the run stopped while writing it)"


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class RunLog:
    """Writes one run directory (or nothing, with ``run_dir=None``) and prints progress lines.

    Args:
      run_dir: where the files go; created if missing. ``None`` writes no files.
      config: written to ``config.json``.
      total_env_steps: the run's length in env steps (per seed), for the ETA.
      quiet: print nothing.
      stream: where progress goes (default stderr, so stdout stays machine-readable).
      resume_update: continue the run in ``run_dir`` from a checkpoint at this
        update: records after it (logged before the run stopped) are dropped
        from ``metrics.jsonl`` and TensorBoard, so the metrics have no gaps or
        duplicates. ``config.json`` is rewritten: a resume checks that what
        decides the numbers is unchanged (see :mod:`podracer.checkpoint`), and
        the file then says what the latest segment ran with (devices, versions,
        logging knobs).
    """

    def __init__(
        self,
        run_dir: str | None,
        config: dict,
        total_env_steps: int,
        quiet: bool = False,
        stream: TextIO | None = None,
        resume_update: int | None = None,
    ):
        self.run_dir = run_dir
        self.total_env_steps = total_env_steps
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.records: list[dict] = []
        self._metrics_file = None
        self._writer = None
        if run_dir is None:
            return
        os.makedirs(run_dir, exist_ok=True)
        metrics_path = os.path.join(run_dir, METRICS_FILE)
        purge_step = None
        if resume_update is None and run_started(run_dir):
            raise FileExistsError(
                f"{run_dir} already holds a run; continue it with --resume {run_dir}, or choose another --logdir"
            )
        with open(os.path.join(run_dir, CONFIG_FILE), "w") as f:  # what this segment runs with
            json.dump(_jsonable(config), f, indent=2, sort_keys=True)
        if resume_update is None:
            open(metrics_path, "w").close()  # a start that was stopped before its first record is started anew
        else:
            if os.path.exists(metrics_path):
                self.records = [r for r in read_records(metrics_path) if r["update"] <= resume_update]
            with open(metrics_path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in self.records)
            purge_step = self.records[-1]["env_steps"] + 1 if self.records else 0
        self._metrics_file = open(metrics_path, "a")
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(run_dir, purge_step=purge_step)

    def message(self, text: str) -> None:
        if not self.quiet:
            print(text, file=self.stream, flush=True)

    def write(self, record: dict) -> None:
        """Appends one record to ``metrics.jsonl`` and TensorBoard, and prints a progress line."""
        record = {key: _jsonable(value) for key, value in record.items()}
        self.records.append(record)
        if self._metrics_file is not None:
            self._metrics_file.write(json.dumps(record) + "\n")
            self._metrics_file.flush()
            step = record["env_steps"]
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "env_steps":
                    self._writer.add_scalar(key, value, step)
                elif isinstance(value, list):
                    for i, item in enumerate(value):
                        if isinstance(item, (int, float)):
                            self._writer.add_scalar(f"{key}/{i}", item, step)
            self._writer.flush()
        self.message(self._progress_line(record))

    def _progress_line(self, record: dict) -> str:
        steps = record["env_steps"]
        fraction = steps / self.total_env_steps if self.total_env_steps else 1.0
        sps = record.get("sps")
        remaining = max(self.total_env_steps - steps, 0)
        rate = record.get("sps_per_seed") or sps  # env steps per second along the x-axis
        eta = _duration(remaining / rate) if rate else "-"
        parts = [
            f"env steps {steps:,}/{self.total_env_steps:,} ({100 * min(fraction, 1.0):.0f}%)",
            f"{sps:,.0f} steps/s" if sps else "- steps/s",
            f"return {_fmt(record.get('episode_return'))}",
            *([f"eval {_fmt(record['eval_return'])}"] if "eval_return" in record else []),
            f"loss {_fmt(record.get('loss'))}",
            f"ETA {eta}",
        ]
        return " | ".join(parts)

    def close(self) -> None:
        if self._metrics_file is not None:
            self._metrics_file.close()
            self._writer.close()
            self._metrics_file = None


def resident_memory_mb() -> float:
    """This process's resident memory in MiB (Linux; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Timer:
    """Seconds spent per component, added up by ``with timer.time(component):`` (or into ``timer.seconds``)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.latest: dict[str, float] = {}  # the last timing of each component

    def time(self, component: str) -> _Timing:
        return _Timing(self, component)

    def last(self, component: str) -> float:
        return self.latest[component]


class _Timing:
    def __init__(self, timer: Timer, component: str):
        self.timer, self.component = timer, component

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        seconds = time.perf_counter() - self.start
        self.timer.seconds[self.component] += seconds
        self.timer.latest[self.component] = seconds
        return False
