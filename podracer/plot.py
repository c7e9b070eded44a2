"""``podracer plot``: episode return against env steps and against seconds, for one or more runs."""

from __future__ import annotations

import os

from podracer.runlog import METRICS_FILE, read_records


def read_metrics(run_dir: str) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl``."""
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{run_dir} has no {METRICS_FILE}: is it a podracer run directory?")
    return read_records(path)


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
        values = [r[metric] for r in records]
        by_steps.plot([r["env_steps"] for r in records], values, label=label)
        by_time.plot([r["time"] for r in records], values, label=label)
    by_steps.set_xlabel("environment steps (per seed)")
    by_time.set_xlabel("training seconds (compilation excluded)")
    for axis in (by_steps, by_time):
        axis.set_ylabel(metric.replace("_", " "))
        axis.grid(alpha=0.3)
    by_steps.legend(fontsize="small")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
