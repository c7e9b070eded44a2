"""``podracer plot``: episode return against env steps and against seconds, for one or more runs, or
aggregated over seeds (mean or IQM with bootstrap intervals)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from podracer.aggregate import ESTIMATORS, bootstrap
from podracer.runlog import METRICS_FILE, parse_records, torn_line_warning

FINAL_WINDOWS = 3  # a run's final score: the mean of its last log windows


def read_metrics(run_dir: str) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl``; FileNotFoundError if there is none, ValueError naming the file
    for one that does not hold records (empty lines aside: a file that only holds a torn line, one that is not
    text, a line that is not a JSON object). A torn last line after others is dropped with a warning, as a run
    being written may have one."""
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{run_dir} has no {METRICS_FILE}: is it a podracer run directory?")
    try:
        records, torn = parse_records(path)
    except (OSError, UnicodeDecodeError) as error:  # a directory, a binary file
        raise ValueError(f"{path}: cannot read it as podracer's records ({error})") from None
    if torn is not None and not records:
        raise ValueError(f"{path}: line {torn}, its only one, is not a JSON record")
    if torn is not None:
        print(torn_line_warning(path, torn), file=sys.stderr)
    bad = next((i for i, record in enumerate(records, 1) if not isinstance(record, dict)), None)
    if bad is not None:
        raise ValueError(f"{path}: record {bad} is not a JSON object")
    return records


def _numbers(values: list, run_dir: str, key: str) -> np.ndarray:
    """``values`` (``key`` of ``run_dir``'s records) as floats; ValueError naming them where one is not a number."""
    if any(value is None for value in values):  # numpy would make them NaN
        raise ValueError(f"{run_dir}: its records' {key} are not all numbers (some have none)")
    try:
        return np.asarray(values, np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{run_dir}: its records' {key} are not all numbers ({error})") from None


def _save(fig, out: str) -> None:
    """Writes the figure to ``out``; ValueError naming ``--out`` when it cannot be written there."""
    try:
        fig.savefig(out, dpi=120)
    except (OSError, ValueError) as error:
        raise ValueError(f"--out {out}: cannot write the figure there ({error})") from None


def plot_runs(run_dirs: list[str], out: str, metric: str = "episode_return") -> str:
    """Draws ``metric`` of each run against env steps and against training seconds into ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_steps, by_time) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for run_dir in run_dirs:
        records = [r for r in read_metrics(run_dir) if r.get(metric) is not None]
        if not records:
            raise ValueError(f"{run_dir} logged no {metric!r} yet")
        label = os.path.basename(os.path.normpath(run_dir))
        values = _numbers([r[metric] for r in records], run_dir, metric)
        by_steps.plot(_numbers([r.get("env_steps") for r in records], run_dir, "env_steps"), values, label=label)
        by_time.plot(_numbers([r.get("time") for r in records], run_dir, "time"), values, label=label)
    by_steps.set_xlabel("environment steps (per seed)")
    by_time.set_xlabel("training seconds (compilation excluded)")
    for axis in (by_steps, by_time):
        axis.set_ylabel(metric.replace("_", " "))
        axis.grid(alpha=0.3)
    by_steps.legend(fontsize="small")
    _save(fig, out)
    plt.close(fig)
    return out


def _seed_curves(run_dir: str, metric: str, x_key: str = "env_steps") -> list[tuple[np.ndarray, np.ndarray]]:
    """``(x, values)`` per seed of ``run_dir`` (a run of several seeds logs ``<metric>_per_seed``); ``x`` is
    each record's ``x_key`` (``eval_env_steps`` places evaluations at the steps their parameters had trained)."""
    records = read_metrics(run_dir)
    per_seed = [r for r in records if r.get(f"{metric}_per_seed") is not None]
    if per_seed:
        steps = _numbers([r.get(x_key) for r in per_seed], run_dir, x_key)
        values = _numbers([r[f"{metric}_per_seed"] for r in per_seed], run_dir, f"{metric}_per_seed")
        if values.ndim != 2:
            raise ValueError(f"{run_dir}: its records' {metric}_per_seed are not lists of one number per seed")
        return [(steps, values[:, i]) for i in range(values.shape[1])]
    records = [r for r in records if r.get(metric) is not None]
    if not records:
        raise ValueError(f"{run_dir} logged no {metric!r} yet")
    steps = _numbers([r.get(x_key) for r in records], run_dir, x_key)
    return [(steps, _numbers([r[metric] for r in records], run_dir, metric))]


def _groups(run_dir: str, seeds: int) -> list[str]:
    """The group of each of ``run_dir``'s ``seeds`` curves: runs of one algorithm on one environment form a group
    (``architecture agent env`` from config.json), and so does each member of a ``--sweep`` (its settings added)."""
    try:
        with open(os.path.join(run_dir, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return [os.path.basename(os.path.normpath(run_dir))] * seeds
    name = f"{config.get('architecture', '?')} {config.get('agent', '?')} {config.get('env', '?')}"
    sweep = config.get("sweep")
    if not sweep:
        return [name] * seeds
    members = [" ".join(f"{k}={v:g}" for k, v in member.items()) for member in sweep["members"]]
    return [f"{name} {members[i // sweep['seeds_per_member']]}" for i in range(seeds)]


def aggregate_runs(
    run_dirs: list[str],
    metric: str = "episode_return",
    estimator: str = "iqm",
    reps: int = 2000,
    x_key: str = "env_steps",
) -> dict:
    """Every group's curve and final score over its runs (and seeds): the estimate and its 95% interval.
    A ``--sweep`` run's members are groups of their own.

    Curves are compared on the first run's log steps, up to where the shortest
    run ends (other runs are interpolated there); ``x_key`` is the record field
    they are placed at (see :func:`_seed_curves`). Returns JSON-ready
    ``{group: {"runs", "env_steps", "point", "low", "high", "final": {...}}}``.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown aggregate {estimator!r}: choose one of {sorted(ESTIMATORS)}")
    groups: dict[str, list] = {}
    for run_dir in run_dirs:
        curves = _seed_curves(run_dir, metric, x_key)
        for group, curve in zip(_groups(run_dir, len(curves)), curves):
            groups.setdefault(group, []).append((run_dir, curve))
    result = {}
    for name, curves in groups.items():
        end = min(steps[-1] for _, (steps, _) in curves)
        grid = curves[0][1][0][curves[0][1][0] <= end]
        scores = np.stack([np.interp(grid, steps, values) for _, (steps, values) in curves])  # [runs, points]
        finals = np.stack([values[steps <= end][-FINAL_WINDOWS:].mean() for _, (steps, values) in curves])
        curve, final = bootstrap(scores, estimator, reps), bootstrap(finals[:, None], estimator, reps)
        result[name] = {
            "runs": [run_dir for run_dir, _ in curves],
            "estimator": estimator,
            "metric": metric,
            "env_steps": grid.tolist(),
            "point": curve.point.tolist(),
            "low": curve.low.tolist(),
            "high": curve.high.tolist(),
            "final": {
                "point": float(final.point[0]),
                "low": float(final.low[0]),
                "high": float(final.high[0]),
                "per_run": finals.tolist(),
                "windows": FINAL_WINDOWS,
            },
        }
    return result


def plot_aggregate(run_dirs: list[str], out: str, metric: str = "episode_return", estimator: str = "iqm") -> str:
    """Draws each group's aggregate curve with its 95% band into ``out`` (PNG) and writes the numbers beside it
    (``out`` with ``.json``); returns the two paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = aggregate_runs(run_dirs, metric, estimator)
    fig, (curves, finals) = plt.subplots(
        1, 2, figsize=(11, 4), constrained_layout=True, gridspec_kw={"width_ratios": [3, 1]}
    )
    for i, (name, g) in enumerate(groups.items()):
        label = f"{name} ({len(g['runs'])} runs)"
        curves.plot(g["env_steps"], g["point"], label=label)
        curves.fill_between(g["env_steps"], g["low"], g["high"], alpha=0.25)
        final = g["final"]
        finals.errorbar(
            [i],
            [final["point"]],
            yerr=[[final["point"] - final["low"]], [final["high"] - final["point"]]],
            fmt="o",
            capsize=4,
        )
    what = f"{estimator.upper() if estimator == 'iqm' else estimator} {metric.replace('_', ' ')}"
    curves.set_xlabel("environment steps (per seed)")
    curves.set_ylabel(f"{what} (95% bootstrap interval)")
    curves.legend(fontsize="small")
    finals.set_xticks(range(len(groups)), [str(i) for i in range(len(groups))])
    finals.set_xlabel("group (legend order)")
    finals.set_ylabel(f"final {what} (last {FINAL_WINDOWS} windows)")
    for axis in (curves, finals):
        axis.grid(alpha=0.3)
    _save(fig, out)
    plt.close(fig)
    numbers = os.path.splitext(out)[0] + ".json"
    with open(numbers, "w") as f:
        json.dump(groups, f, indent=1)
    return f"{out}\n{numbers}"
