"""Results across seeds: IQM and mean with bootstrap intervals against hand-computed cases, and `podracer plot
--aggregate`."""

import json
import os

import numpy as np
import pytest

from podracer.aggregate import bootstrap
from podracer.cli.main import main
from podracer.plot import aggregate_runs


def test_iqm_and_mean_match_hand_computed_values():
    # 4 runs: the IQM drops the lowest and the highest quarter (one run each): (2 + 3) / 2.
    scores = np.array([[1.0], [2.0], [3.0], [10.0]])
    assert bootstrap(scores, "iqm").point[0] == 2.5 and bootstrap(scores, "mean").point[0] == 4.0
    # 8 runs 0..7: the middle half is 2, 3, 4, 5.
    assert bootstrap(np.arange(8.0)[:, None], "iqm").point[0] == 3.5
    # Runs that agree leave no uncertainty.
    same = bootstrap(np.full((3, 5), 7.0), "iqm")
    np.testing.assert_array_equal(same.low, same.point) and np.testing.assert_array_equal(same.high, same.point)


def test_the_bootstrap_interval_of_a_mean_has_the_normal_width():
    runs = np.random.default_rng(0).normal(size=(400, 1))
    estimate = bootstrap(runs, "mean", reps=4000)
    half_width = (estimate.high - estimate.low)[0] / 2
    expected = 1.96 * runs.std() / np.sqrt(len(runs))  # the normal approximation's 95% half-width
    assert abs(half_width / expected - 1) < 0.1
    assert estimate.low[0] < estimate.point[0] < estimate.high[0]


def _fake_run(path, returns, env="catch", per_seed=None):
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"architecture": "anakin", "agent": "ppo", "env": env}, f)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for i, value in enumerate(returns):
            record = {"update": i + 1, "env_steps": 1000 * (i + 1), "time": float(i), "episode_return": value}
            if per_seed is not None:
                record["episode_return_per_seed"] = [value + offset for offset in per_seed]
            f.write(json.dumps(record) + "\n")
    return str(path)


def test_podracer_plot_aggregates_seeds_and_writes_the_numbers(tmp_path, capsys):
    runs = [_fake_run(tmp_path / f"seed{s}", [s, 2 * s, 3 * s, 4 * s, 5 * s]) for s in range(3)]
    out = str(tmp_path / "iqm.png")
    assert main(["plot", *runs, "--aggregate", "iqm", "--out", out]) == 0
    assert os.path.getsize(out) > 10_000
    (group,) = json.load(open(str(tmp_path / "iqm.json"))).values()
    # 3 runs: the IQM trims nothing; the final score is the mean of the last 3 windows: 4 x seed.
    np.testing.assert_allclose(group["point"], [1, 2, 3, 4, 5])
    assert group["final"]["per_run"] == [0.0, 4.0, 8.0] and group["final"]["point"] == 4.0
    assert group["final"]["low"] < 4.0 < group["final"]["high"] and len(group["runs"]) == 3

    # One run of several seeds counts each seed; a shorter run cuts every curve of its group to its length.
    many = _fake_run(tmp_path / "seeds", [0, 0, 0, 0], env="cartpole", per_seed=[1.0, 2.0, 3.0, 10.0])
    groups = aggregate_runs([*runs, many, _fake_run(tmp_path / "short", [5, 5], env="cartpole")], estimator="iqm")
    cartpole = groups["anakin ppo cartpole"]
    assert len(cartpole["runs"]) == 5 and cartpole["env_steps"] == [1000.0, 2000.0]
    np.testing.assert_allclose(cartpole["point"], [10 / 3] * 2)  # of 1, 2, 3, 5, 10 a quarter of 5 trims 1 a side


def test_plot_refuses_what_it_cannot_draw(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "missing"), "--aggregate", "iqm"]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plot", str(tmp_path), "--aggregate", "median"])
