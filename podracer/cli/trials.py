"""``podracer tune``: the fastest Sebulba layout (or Anakin lanes and update loop) for a preset on this host, measured.

Each candidate is a short training run of its own (a fresh ``podracer`` process,
so each compiles and starts as a user's run would): once it reports that it
compiled, it trains for ``--trial-seconds`` and is stopped with SIGINT; its
``RESULT`` line gives steps/s over its training seconds, compilation excluded.
The preset's own layout runs first, as the baseline, and the others while
``--minutes`` last. Candidates change only how the work is laid out, never how
much data an update learns from, so the fastest one learns as the preset does:

* Sebulba: the actor/learner device split, actor threads (the preset's environments per actor device divided
  among them: ``--envs-per-thread`` x ``--actor-threads`` stays the same) and envpool batches per thread;
* Anakin: update lanes per device and the update loop (on the device or one update per call).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

TRIAL_STEPS = 10**9  # a trial's --total-env-steps: it is stopped long before (and its counters fit int32)


class Trial(NamedTuple):
    """A candidate layout (flags over the preset's) and what it measured."""

    overrides: dict  # {knob: value}, e.g. {"actor_threads": 2, "envs_per_thread": 16}
    sps: float | None = None  # steps/s after compiling; None: not run (out of time) or failed
    compile_seconds: float | None = None
    error: str | None = None

    @property
    def flags(self) -> list[str]:
        return [text for name, value in self.overrides.items() for text in (f"--{name.replace('_', '-')}", str(value))]


def sebulba_candidates(settings: dict, devices: int, cpu_count: int) -> list[dict]:
    """Layouts of the preset's Sebulba ``settings`` over ``devices`` local devices and ``cpu_count`` cores: the
    preset's own first (``{}``), then actor threads x envpool batches x device splits, each one the trainer accepts
    (:func:`podracer.sebulba.config.check_layout`)."""
    from podracer.sebulba.config import SebulbaConfig, check_layout

    per_device = settings.get("actor_threads", 1) * settings.get("envs_per_thread", 16)
    threads = [t for t in (1, 2, 4) if t <= cpu_count and per_device % t == 0] or [1]
    candidates = []
    for n, batches in itertools.product(threads, (1, 2)):
        layout = {"actor_threads": n, "envs_per_thread": per_device // n, "env_batches": batches}
        candidates += [{**split, **layout} for split in _device_splits(devices, per_device // n)]
    candidates = [c for c in candidates if _accepted(check_layout, SebulbaConfig(**{**settings, **c}), devices)]
    return [{}] + [c for c in candidates if not _same_as_preset(c, settings)]


def _device_splits(devices: int, envs_per_thread: int) -> list[dict]:
    """Device splits for ``envs_per_thread`` environments per actor thread: device 0 acts, and where there are 4
    devices or more also devices 0 and 1; each with as many of the other devices learning as the environments
    split evenly over (``{}``: device 0 acts and every other one learns, the trainer's default)."""
    splits = []
    for acting in [(0,), (0, 1)] if devices >= 4 else [(0,)]:
        free = range(len(acting), devices)
        learners = max((k for k in range(1, len(free) + 1) if envs_per_thread % k == 0), default=0)
        if acting == (0,) and learners == len(free):
            splits.append({})
        elif learners:
            chosen = ",".join(map(str, free[:learners]))
            splits.append({"actor_devices": ",".join(map(str, acting)), "learner_devices": chosen})
    return splits


def anakin_candidates(settings: dict, devices: int) -> list[dict]:
    """Lanes per device (dividing the environments per device) x update loop, the preset's own first; each one the
    trainer accepts (:func:`podracer.anakin.config.geometry`)."""
    from podracer.anakin.config import AnakinConfig, geometry

    per_device = settings.get("num_envs", 64) // max(1, devices)
    lanes = [n for n in (1, 2, 4, 8) if per_device % n == 0]
    candidates = [{"lanes": n, "update_loop": loop} for n in lanes for loop in ("device", "host")]
    candidates = [c for c in candidates if _accepted(geometry, AnakinConfig(**{**settings, **c}), devices)]
    return [{}] + [c for c in candidates if not _same_as_preset(c, {"lanes": 1, "update_loop": "device", **settings})]


def _accepted(check, *args) -> bool:
    """Whether the trainer's ``check(*args)`` (which raises ValueError for a layout it refuses) passes."""
    try:
        check(*args)
    except ValueError:
        return False
    return True


def _same_as_preset(candidate: dict, settings: dict) -> bool:
    defaults = {"env_batches": 0, "actor_threads": 1, "lanes": 1, "update_loop": "auto"}
    return all(settings.get(k, defaults.get(k)) == v for k, v in candidate.items())


def measure(command: list[str], trial_seconds: float, timeout: float = 900) -> tuple[float, float]:
    """Runs the ``podracer`` ``command`` until it compiled (within ``timeout`` seconds), lets it train
    ``trial_seconds``, stops it with SIGINT; returns ``(steps/s, compile seconds)`` from its RESULT line. Raises
    RuntimeError if it failed, or trained no steps in its time."""
    with tempfile.TemporaryFile("w+") as err, tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        try:
            start, trained_from = time.monotonic(), None
            while proc.poll() is None and time.monotonic() - start < timeout:
                time.sleep(0.25)
                if trained_from is None:
                    err.seek(0)
                    if "compiled in" in err.read():
                        trained_from = time.monotonic()
                        start = trained_from  # from here the trial's own seconds bound it
                        timeout = trial_seconds + 120
                elif time.monotonic() - trained_from >= trial_seconds:
                    break
        finally:  # whatever ends the wait (the trial's time, a timeout, tune itself being stopped): stop the trial
            _stop(proc)
        out.seek(0)
        err.seek(0)
        found = re.search(r"\bsps=([0-9.]+) .*\bcompile_s=([0-9.]+)", out.read())
        if not found:
            lines = err.read().strip().splitlines()
            raise RuntimeError(lines[-1] if lines else f"exit code {proc.returncode}")
        if not float(found.group(1)):  # stopped before its first update ended: nothing to compare
            raise RuntimeError(f"no update finished within the trial's {trial_seconds:g}s (raise --trial-seconds)")
        return float(found.group(1)), float(found.group(2))


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT (the run checkpoints and prints its RESULT line), then SIGKILL if it has not ended in 2 minutes."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tune(base: list[str], candidates: list[dict], minutes: float, trial_seconds: float, report=print) -> list[Trial]:
    """Measures ``candidates`` (overrides of ``base``, a ``podracer <architecture> ...`` argument list) while
    ``minutes`` last; the first (the preset's own) always runs. Returns a :class:`Trial` per candidate."""
    deadline = time.monotonic() + 60 * minutes
    trials = []
    with tempfile.TemporaryDirectory() as scratch:
        for i, overrides in enumerate(candidates):
            trial = Trial(overrides)
            if i and time.monotonic() + trial_seconds > deadline:
                trials.append(trial._replace(error="not run: out of time"))
                continue
            command = [sys.executable, "-m", "podracer", *base, *trial.flags]  # not --quiet: it says when it compiled
            command += ["--total-env-steps", str(TRIAL_STEPS), "--eval-episodes", "0", "--checkpoint-every", "0"]
            command += ["--logdir", os.path.join(scratch, f"trial{i}")]
            try:
                sps, compile_s = measure(command, trial_seconds)
                trial = trial._replace(sps=sps, compile_seconds=compile_s)
            except RuntimeError as error:
                trial = trial._replace(error=str(error))
            trials.append(trial)
            report(_line(trial))
    return trials


def _line(trial: Trial) -> str:
    layout = " ".join(trial.flags) or "(the preset's own)"
    if trial.sps is None:
        return f"{layout}: {trial.error}"
    return f"{layout}: {trial.sps:,.0f} steps/s (compiled in {trial.compile_seconds:.1f}s)"


def table(trials: list[Trial]) -> str:
    """The trials as a markdown table, fastest first, each against the preset's own layout."""
    baseline = trials[0].sps
    rows = ["| layout | steps/s | vs the preset | compile s |", "|---|---|---|---|"]
    ran = sorted((t for t in trials if t.sps is not None), key=lambda t: -t.sps)
    for t in ran:
        ratio = f"{t.sps / baseline:.2f}x" if baseline else "-"
        rows.append(f"| {' '.join(t.flags) or '(preset)'} | {t.sps:,.0f} | {ratio} | {t.compile_seconds:.1f} |")
    rows += [f"| {' '.join(t.flags) or '(preset)'} | {t.error} | | |" for t in trials if t.sps is None]
    return "\n".join(rows)


def fastest(trials: list[Trial]) -> Trial | None:
    ran = [t for t in trials if t.sps is not None]
    return max(ran, key=lambda t: t.sps) if ran else None


def save_preset(path: str, architecture: str, preset: dict, group: dict, best: Trial, about: str) -> None:
    """Writes the preset's settings with ``best``'s layout as a preset file (``--preset PATH.json``), whole or not
    at all (OSError)."""
    key = "sebulba" if architecture == "sebulba" else "anakin"
    saved = {
        "architecture": architecture,
        "about": about,
        "agent": preset["agent"],
        "env": preset["env"],
        key: {**group[key], **best.overrides},
        "agent_config": group.get("agent_config", {}),
    }
    if group.get("host_env"):
        saved["host_env"] = group["host_env"]
    text = json.dumps(saved, indent=1, default=_jsonable)
    folder = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile("w", dir=folder, prefix=".podracer-tune-", delete=False) as f:
        try:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        except OSError:
            os.unlink(f.name)
            raise
    os.replace(f.name, path)  # whole or not at all: a full disk leaves no half-written preset


def _jsonable(value):
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot save {value!r} in a preset")
