"""Results across seeds: the mean or the interquartile mean (IQM) with stratified bootstrap intervals.

As in rliable (Agarwal et al. 2021, "Deep RL at the edge of the statistical
precipice"): the IQM is the mean of the middle 50% of the scores
(``scipy.stats.trim_mean(scores, 0.25)``), and a 95% interval comes from
resampling the runs with replacement (within each task) and taking the 2.5th
and 97.5th percentiles of the statistic. rliable itself does not install
cleanly beside this project's pins (its ``arch`` dependency breaks on the
installed pandas), so these few lines stand in for it, tested against
hand-computed cases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import scipy.stats

ESTIMATORS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    # scores [..., runs, points] -> [..., points]: over the runs axis
    "mean": lambda scores: np.mean(scores, axis=-2),
    "iqm": lambda scores: scipy.stats.trim_mean(scores, 0.25, axis=-2),
}


class Estimate(NamedTuple):
    """A statistic over runs with its bootstrap interval, each ``[points]``."""

    point: np.ndarray
    low: np.ndarray
    high: np.ndarray


def bootstrap(
    scores: np.ndarray, estimator: str, reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> Estimate:
    """``estimator`` of ``scores [runs, points]`` over the runs, and its percentile bootstrap interval.

    Every bootstrap replicate resamples the runs with replacement, the same
    runs for every point (a run's curve stays whole).
    """
    scores = np.asarray(scores, np.float64)
    if scores.ndim != 2 or scores.shape[0] < 1:
        raise ValueError(f"scores must be [runs, points], got shape {scores.shape}")
    statistic = ESTIMATORS[estimator]
    runs = scores.shape[0]
    picks = np.random.default_rng(seed).integers(runs, size=(reps, runs))
    replicates = statistic(scores[picks])  # [reps, points]
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(replicates, [tail, 100 - tail], axis=0)
    return Estimate(statistic(scores), low, high)
