"""The host loop both architectures share: restore, windows, records, checkpoints, signals, the result.

An architecture is what differs: it hands :func:`drive` a :class:`Program`
(how to build its state, compile, run in the background while training, and
advance by some updates) and the driver does the rest, the same way for both:

* ``--resume``: the newest checkpoint replaces the fresh state and the run log
  drops what was logged after it;
* log windows of equal numbers of updates, ending at the same updates whether
  or not the run was resumed, one record per window (``metrics.jsonl``,
  TensorBoard, a progress line), the architecture adding its own fields;
* checkpoints when due (:class:`podracer.checkpoint.Checkpointer`), on a stop
  and at the end;
* evaluations every ``--eval-every`` env steps and at the end
  (:mod:`podracer.evaluation`), added to the next record;
* SIGINT/SIGTERM: every process agrees, before each step, whether any process
  was signalled, so all stop after the same update;
* one message for a non-finite loss, naming the update and the seed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

import jax
import numpy as np

from podracer.checkpoint import CheckpointConfig, Checkpointer, restore
from podracer.distributed import agree_on_step
from podracer.errors import NonFiniteLossError
from podracer.evaluation import EvalConfig, Evaluator, describe
from podracer.lock import hold_run_directory
from podracer.runlog import RunLog, Timer
from podracer.signals import StopRequested, stop_on_signals

TRAINING = "training"  # the driver's one timed component: the steps, compilation apart


class StepStats(NamedTuple):
    """What some updates produced, per seed (``[S]`` leaves); windows add these up."""

    metrics: dict  # sum over the updates of each learner metric (replica-averaged)
    return_sum: np.ndarray  # summed returns of the episodes that ended
    length_sum: np.ndarray  # their summed lengths
    episodes: np.ndarray  # how many ended
    first_nonfinite: np.ndarray  # int: first update (counted from 0 in the step) with a non-finite loss, else -1
    extras: dict  # the architecture's own sums, read by its ``describe``


class Program(NamedTuple):
    """What an architecture supplies to :func:`drive`.

    Attributes:
      banner: the run's first message (what runs where).
      config: what goes into ``config.json``.
      fingerprint: what a resume must match (see :func:`podracer.checkpoint.settings_fingerprint`).
      num_updates, updates_per_window, updates_per_step: the run's length, the
        updates per log record, and the most updates one step may take.
      steps_per_update: env steps per update (per seed); ``frame_skip`` turns them into frames.
      seed, num_seeds: for messages and records.
      init: ``() -> state``, a fresh state (the structure a checkpoint restores into).
      compile: ``(state) -> step``, compiles what training calls (timed apart);
        ``step(state, update, n) -> (state, StepStats)`` runs updates
        ``update + 1 .. update + n`` and may raise
        :class:`podracer.signals.StopRequested` when interrupted while waiting.
      running: ``(state, first_update) -> context manager`` that keeps the
        architecture's background work (Sebulba's actor threads) going while
        the driver steps, and stops and joins it on exit.
      describe: ``(window StepStats, record) -> dict``, the architecture's own
        fields for a record that already holds the shared ones.
      report: ``(this segment's train seconds) -> (seconds per component, a last message or None)``.
      interrupt: an event the architecture's blocking waits watch; set when the run stops.
      make_evaluator: ``(EvalConfig) -> Evaluator`` (see :mod:`podracer.evaluation`); None: no evaluation.
    """

    banner: str
    config: dict
    fingerprint: dict
    num_updates: int
    updates_per_window: int
    updates_per_step: int
    steps_per_update: int
    frame_skip: int
    seed: int
    num_seeds: int
    init: Callable[[], Any]
    compile: Callable[[Any], Callable[[Any, int, int], tuple[Any, StepStats]]]
    running: Callable[[Any, int], AbstractContextManager]
    describe: Callable[[StepStats, dict], dict]
    report: Callable[[float], tuple[dict, str | None]]
    interrupt: threading.Event
    make_evaluator: Callable[[EvalConfig], Evaluator] | None = None
    name_agent: Callable[[int], str] | None = None  # agent i in messages; None: "seed <seed + i>"


class RunResult(NamedTuple):
    state: Any  # the final state (the architecture's layout)
    records: list[dict]  # what was logged, one dict per window
    compile_seconds: float
    train_seconds: float  # wall time of the steps alone (a resumed run includes its earlier segments)
    env_steps: int  # per seed, reached by the run (all of them, unless stopped)
    frames: int  # env_steps x frame-skip
    timings: dict  # seconds per component where the architecture measures them (Sebulba)
    stopped_by: str | None = None  # the signal that stopped the run early (a checkpoint was written)
    evaluation: dict | None = None  # the final evaluation's record fields (None: none ran)
    agents: int = 1  # trained side by side (Anakin: seeds x sweep members), each for env_steps


class RunOptions(NamedTuple):
    """How a run is kept: where, how loudly, its checkpoints, and whether it continues an earlier one."""

    run_dir: str | None = None
    quiet: bool = False
    checkpoint: CheckpointConfig = CheckpointConfig()
    resume: bool = False
    evaluation: EvalConfig = EvalConfig()


def saved_options(options: RunOptions) -> dict:
    """The run's checkpoint schedule and evaluation settings, for ``config.json``: a resume keeps them."""
    return {"checkpoint": dataclasses.asdict(options.checkpoint), "evaluation": dataclasses.asdict(options.evaluation)}


def episode_means(stats: StepStats) -> dict[str, Any]:
    """Mean episode return and length over the seeds; per seed, min and max with several seeds."""
    episodes = stats.episodes
    with np.errstate(invalid="ignore", divide="ignore"):
        returns = np.where(episodes > 0, stats.return_sum / episodes, np.nan)
        lengths = np.where(episodes > 0, stats.length_sum / episodes, np.nan)
    ended = np.isfinite(returns).any()
    record = {
        "episode_return": float(np.nanmean(returns)) if ended else None,
        "episode_length": float(np.nanmean(lengths)) if ended else None,
        "episodes": int(episodes.sum()),
    }
    if len(episodes) > 1:
        record["episode_return_per_seed"] = returns
        record["episode_return_min"] = float(np.nanmin(returns)) if ended else None
        record["episode_return_max"] = float(np.nanmax(returns)) if ended else None
    return record


def _check_finite(stats: StepStats, done: int, program: Program) -> None:
    bad = np.flatnonzero(stats.first_nonfinite >= 0)
    if bad.size:
        s = int(bad[0])
        agent = program.name_agent(s) if program.name_agent else f"seed {program.seed + s}"
        raise NonFiniteLossError(
            f"the loss became non-finite at update {done + int(stats.first_nonfinite[s]) + 1} ({agent}); "
            "try a lower --learning-rate or --max-grad-norm"
        )


STEP_SECONDS = 1.0  # what one step (one compiled Anakin call) should take: a stop waits for at most one


class Pace:
    """How many updates the next step takes: as many as fit in :data:`STEP_SECONDS`, at most ``most``.

    A stop (a signal, a preemption notice) is honoured between steps, so bounding
    a step's wall time bounds how long a stop waits, whatever the log interval.
    The first step takes one update; later ones follow the measured time per update.
    """

    def __init__(self, most: int, seconds: float = STEP_SECONDS):
        self.most, self.seconds, self.per_update = most, seconds, None

    def updates(self) -> int:
        if self.per_update is None:
            return 1
        return max(1, min(self.most, int(self.seconds / max(self.per_update, 1e-9))))

    def took(self, updates: int, seconds: float) -> None:
        self.per_update = seconds / updates


def _add(window: StepStats | None, stats: StepStats) -> StepStats:
    return stats if window is None else jax.tree.map(np.add, window, stats)


class _Run:
    """One run's moving parts while :func:`drive` steps it."""

    def __init__(self, program: Program, options: RunOptions, log: RunLog, first_update: int, clock: Timer):
        self.program, self.log, self.clock, self.done = program, log, clock, first_update
        self.resumed_seconds = self.seconds
        self.checkpointer = Checkpointer(options.run_dir, program.fingerprint, options.checkpoint, first_update)
        self.pace = Pace(program.updates_per_step)
        evaluation = options.evaluation
        self.evaluator = (
            program.make_evaluator(evaluation) if program.make_evaluator and evaluation.eval_episodes else None
        )
        # Evaluations fall on whole updates: every ceil(eval_every / steps per update) of them.
        self.eval_updates = -(-evaluation.eval_every // program.steps_per_update) if evaluation.eval_every else 0
        self.final_evaluation = None
        self.eval_max_steps = evaluation.eval_max_steps

    @property
    def seconds(self) -> float:
        """Training seconds so far (every segment of a resumed run; compilation excluded)."""
        return self.clock.seconds[TRAINING]

    def save(self, state) -> None:
        self.checkpointer.save(self.done, state, {"update": self.done, "time": self.seconds})

    def updates_until_evaluation(self) -> int | float:
        return self.eval_updates - self.done % self.eval_updates if self.evaluator and self.eval_updates else np.inf

    def evaluate_if_due(self, state) -> None:
        if self.evaluator is None:
            return
        if self.done == self.program.num_updates or (self.eval_updates and self.done % self.eval_updates == 0):
            self.evaluator.request(state, self.done)

    def write(self, window: StepStats, updates: int, seconds: float) -> None:
        program, steps = self.program, updates * self.program.steps_per_update
        record = {
            "update": self.done,
            "env_steps": self.done * program.steps_per_update,
            "time": self.seconds,
            "sps": steps * program.num_seeds / seconds,
            "sps_per_seed": steps / seconds,
            **episode_means(window),
            **{key: float(np.mean(value)) / updates for key, value in window.metrics.items()},
        }
        if self.evaluator is not None:
            final = self.done == program.num_updates
            evaluated = self.evaluator.collect(wait=final, report=self.log.message if final else None)
            record.update(evaluated)
            if evaluated and final:
                self.final_evaluation = evaluated
        self.log.write({**record, **program.describe(window, record)})

    def loop(self, state, step, requested: threading.Event):
        """Steps until the end or an agreed stop; returns ``(state, stopping)``."""
        program = self.program
        window, window_updates, window_start = None, 0, self.seconds
        stopping = False
        while self.done < program.num_updates:
            # A signal may reach only some processes, and each paces itself: they agree on both.
            stopping, paced = agree_on_step(requested.is_set(), self.pace.updates())
            if stopping:
                program.interrupt.set()
                break
            to_window_end = program.updates_per_window - self.done % program.updates_per_window
            n = min(
                paced,
                program.num_updates - self.done,
                to_window_end,
                self.checkpointer.updates_until_due(self.done),
                self.updates_until_evaluation(),
            )
            try:
                with self.clock.time(TRAINING):
                    state, stats = step(state, self.done, n)
            except StopRequested:  # interrupted while waiting: nothing was learnt
                stopping = True
                break
            self.pace.took(n, self.clock.last(TRAINING))
            _check_finite(stats, self.done, program)
            self.done += n
            window, window_updates = _add(window, stats), window_updates + n
            self.evaluate_if_due(state)
            if self.done % program.updates_per_window == 0 or self.done == program.num_updates:
                self.write(window, window_updates, self.seconds - window_start)
                window, window_updates, window_start = None, 0, self.seconds
            if self.checkpointer.due(self.done):
                self.save(state)
        if window is not None:  # stopped mid-window: log it, so the metrics reach the checkpoint without a gap
            self.write(window, window_updates, self.seconds - window_start)
        return state, stopping


def drive(program: Program, options: RunOptions = RunOptions()) -> RunResult:
    """Runs ``program`` from a fresh state, or from its newest checkpoint with ``options.resume``.

    SIGINT and SIGTERM are caught from the first moment: a signal while restoring
    or compiling stops the run before its first update, with a checkpoint, as
    one during training does. Resuming a run that holds no checkpoint yet (it
    was stopped before its first) starts it from scratch with its settings.
    """
    if options.resume and options.run_dir is None:
        raise ValueError("resuming needs the run directory that holds the checkpoints")
    requested, caught = threading.Event(), []
    if jax.process_count() == 1:
        requested = program.interrupt  # alone, a signal interrupts waits at once; else the processes agree first
    writer = options.run_dir is not None and jax.process_index() == 0
    owning = hold_run_directory(options.run_dir) if writer else contextlib.nullcontext()
    with owning, stop_on_signals(requested, caught):
        state, first_update, clock = program.init(), 0, Timer()
        restored = restore(options.run_dir, state, program.fingerprint) if options.resume else None
        if restored is not None:
            state, counters = restored
            first_update, clock.seconds[TRAINING] = counters["update"], counters["time"]
        logging_process = jax.process_index() == 0
        log = RunLog(
            options.run_dir if logging_process else None,
            {**program.config, **saved_options(options)},
            program.num_updates * program.steps_per_update,
            options.quiet or not logging_process,
            resume_update=first_update if options.resume else None,
        )
        run = _Run(program, options, log, first_update, clock)
        try:
            log.message(program.banner)
            if restored is not None:
                log.message(
                    f"resumed from the checkpoint at update {first_update} "
                    f"({first_update * program.steps_per_update:,} env steps)"
                )
            elif options.resume:
                log.message(f"{options.run_dir} holds no checkpoint yet: starting it from scratch with its settings")
            start = time.perf_counter()
            step = program.compile(state)
            compile_seconds = time.perf_counter() - start
            log.message(f"compiled in {compile_seconds:.1f}s")
            with program.running(state, first_update):
                state, stopping = run.loop(state, step, requested)
            run.save(state)
            return _finish(run, state, compile_seconds, caught if stopping else None)
        finally:
            program.interrupt.set()
            run.checkpointer.close()
            log.close()


def _finish(run: _Run, state, compile_seconds: float, caught: list[str] | None) -> RunResult:
    program, steps, seconds = run.program, run.done * run.program.steps_per_update, run.seconds
    frames = steps * program.frame_skip
    stopped_by = (caught[0] if caught else "SIGTERM") if caught is not None else None  # or another process's signal
    if stopped_by:
        where = f"; resume with --resume {run.log.run_dir}" if run.log.run_dir else ""
        run.log.message(f"stopped by {stopped_by} at update {run.done}{where}")
    timings, report = program.report(seconds - run.resumed_seconds)
    if report:
        run.log.message(report)
    rate = f"{steps * program.num_seeds / max(seconds, 1e-9):,.0f} steps/s"
    if program.frame_skip != 1:
        rate += f", {frames / max(seconds, 1e-9):,.0f} frames/s"
    run.log.message(
        f"done: {steps:,} env steps{' per seed' if program.num_seeds > 1 else ''} in {seconds:.1f}s "
        f"({rate} after a {compile_seconds:.1f}s compile)"
    )
    final = run.final_evaluation
    if final:
        run.log.message(f"evaluation: {describe(final, run.eval_max_steps)}")
    return RunResult(
        state, run.log.records, compile_seconds, seconds, steps, frames, timings, stopped_by, final, program.num_seeds
    )


@contextlib.contextmanager
def nothing_in_the_background(state, first_update: int):
    """:attr:`Program.running` for an architecture with no background work."""
    yield


def no_report(seconds: float) -> tuple[dict, None]:
    """:attr:`Program.report` for an architecture that times no components."""
    return {}, None
