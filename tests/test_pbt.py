"""Population-based training on the device: the exploit-and-explore step, its schedule, refusals, exact resume."""

import dataclasses
import glob
import json
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podracer import envs
from podracer.agents import PPOConfig
from podracer.anakin import AnakinConfig, geometry, train
from podracer.anakin.pbt import PBT, Population, population_step
from podracer.anakin.run import build_agent
from podracer.checkpoint import CheckpointConfig
from podracer.evaluation import OFF as NO_EVALUATION

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_PPO = dataclasses.replace(PPOConfig(), num_epochs=2, num_minibatches=2, learning_rate=1e-3)


def _population(returns, episodes):
    agents = len(returns)
    return Population(
        jnp.array(returns, jnp.float32),
        jnp.array(episodes, jnp.float32),
        jnp.zeros(agents, jnp.int32),
        jnp.arange(agents, dtype=jnp.int32),
        jnp.zeros(agents, jnp.int32),
    )


def test_the_worst_agents_take_a_leaders_learner_and_a_perturbed_copy_of_its_settings():
    pbt = PBT(interval=1, replace=2, factor=2.0, bounds={"lr": (None, 3.0)}, seed=0, window=1)
    learner = {"w": jnp.arange(8, dtype=jnp.float32)[:, None] * jnp.ones((8, 3))}  # agent i's weights are all i
    hparams = {"lr": jnp.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 1.9, 0.8])}
    # Mean returns 5, 1, 6, 0.5, 7, 4, 9, none ended: the worst are 7 (no episode) and 3; the leaders 6 and 4.
    population = _population([10, 2, 6, 1, 14, 4, 0, 0], [2, 2, 1, 2, 2, 1, 0, 0])
    this_update = (jnp.array([0, 0, 0, 0, 0, 0, 9, 0.0]), jnp.array([0, 0, 0, 0, 0, 0, 1, 0.0]))
    learner, explored, after = population_step(pbt, learner, hparams, population, *this_update)
    parents = np.asarray(after.parent)
    assert set(parents[[3, 7]]) <= {4, 6} and (parents[[0, 1, 2, 4, 5, 6]] == [0, 1, 2, 4, 5, 6]).all()
    np.testing.assert_array_equal(np.asarray(learner["w"])[:, 0], parents)
    for agent in (3, 7):
        leader_lr = float(hparams["lr"][parents[agent]])
        choices = [min(leader_lr * 2, 3.0), leader_lr / 2]  # 1.9 x 2 is clipped to the bound, 3
        assert any(float(explored["lr"][agent]) == pytest.approx(choice) for choice in choices)
    np.testing.assert_array_equal(explored["lr"][:3], hparams["lr"][:3])
    assert not np.asarray(after.return_sum).any() and not np.asarray(after.episodes).any()
    assert (np.asarray(after.updates) == 1).all() and (np.asarray(after.steps) == 1).all()


def test_between_steps_the_population_only_counts():
    pbt = PBT(interval=3, replace=1, factor=2.0, bounds={}, seed=0, window=3)
    learner, hparams = {"w": jnp.arange(4.0)}, {"lr": jnp.ones(4)}
    population = _population([1, 2, 3, 4], [1, 1, 1, 1])
    out_learner, out_hparams, after = population_step(pbt, learner, hparams, population, jnp.ones(4), jnp.ones(4))
    np.testing.assert_array_equal(out_learner["w"], learner["w"])
    np.testing.assert_array_equal(after.return_sum, [2, 3, 4, 5])
    np.testing.assert_array_equal(after.parent, np.arange(4))


def test_pbt_settings_are_checked_and_its_steps_land_on_log_windows():
    config = AnakinConfig(num_envs=8, rollout_len=8, total_env_steps=64 * 40, log_interval=64 * 4, num_seeds=2)
    with pytest.raises(ValueError, match="--pbt-interval trains a population: the agents of a --sweep"):
        geometry(dataclasses.replace(config, pbt_interval=1000), 1)
    swept = dataclasses.replace(config, sweep=("learning_rate=1e-3,3e-3",), pbt_interval=64 * 9)
    with pytest.raises(ValueError, match="at least 2"):
        geometry(dataclasses.replace(swept, num_seeds=1), 1, members=1)
    with pytest.raises(ValueError, match="--pbt-quantile must be above 0"):
        geometry(dataclasses.replace(swept, pbt_quantile=0.0), 1, members=2)
    with pytest.raises(ValueError, match="--pbt-factor must be above 1, got 1.0"):
        geometry(dataclasses.replace(swept, pbt_factor=1.0), 1, members=2)
    with pytest.raises(ValueError, match="--pbt-quantile must be at most 0.5"):
        geometry(dataclasses.replace(swept, pbt_quantile=0.6), 1, members=2)
    with pytest.raises(ValueError, match="no PBT step would happen"):
        geometry(dataclasses.replace(swept, pbt_interval=64 * 40), 1, members=2)
    geo = geometry(swept, 1, members=2)
    assert (geo.updates_per_call, geo.pbt_updates, geo.pbt_replace) == (4, 9, 1)
    relogged = geometry(dataclasses.replace(swept, log_interval=64 * 8), 1, members=2)  # a resume may change it
    assert (relogged.updates_per_call, relogged.pbt_updates) == (8, 9)  # the schedule stays
    one_seed = dataclasses.replace(swept, num_seeds=1)  # 2 members x 1 seed: a population of 2
    _, sweep = build_agent("ppo", SMALL_PPO, envs.make("catch"), one_seed)
    assert geometry(one_seed, 1, members=len(sweep.members)).pbt_updates == 9


@pytest.mark.slow
def test_a_population_resumed_from_a_checkpoint_ends_as_the_uninterrupted_one(tmp_path):
    config = AnakinConfig(
        num_envs=8,
        rollout_len=8,
        total_env_steps=64 * 24,
        log_interval=64 * 4,
        num_seeds=2,
        sweep=("learning_rate=3e-4,3e-3",),
        pbt_interval=64 * 8,
        pbt_quantile=0.5,
        pbt_factor=2.0,
    )
    run_dir = str(tmp_path / "run")
    checkpoints = CheckpointConfig(checkpoint_every=4, checkpoint_keep=10)
    options = dict(quiet=True, evaluation=NO_EVALUATION, checkpoint=checkpoints)
    whole = train("ppo", SMALL_PPO, "catch", config, run_dir, **options)
    steps = [r for r in whole.records if "pbt_parents" in r]
    assert [(r["update"], r["pbt_steps"]) for r in steps] == [(8, 1), (16, 1), (24, 1)]
    assert any(r["pbt_parents"] != list(range(4)) for r in steps)  # someone was replaced
    lrs = whole.records[-1]["hyperparameters"]["learning_rate"]
    assert any(lr not in (pytest.approx(3e-4), pytest.approx(3e-3)) for lr in lrs)  # and explored

    for later in glob.glob(os.path.join(run_dir, "checkpoints", "[0-9]*")):
        if int(os.path.basename(later)) > 4:  # back to update 4: two PBT steps to go
            shutil.rmtree(later)
    resumed = train("ppo", SMALL_PPO, "catch", config, run_dir, resume=True, **options)
    local = lambda state: jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), state)  # noqa: E731
    fields = lambda s: (s.learner.params, s.hparams, s.population)  # noqa: E731
    jax.tree.map(np.testing.assert_array_equal, local(fields(resumed.state)), local(fields(whole.state)))
    assert resumed.records[-1]["pbt_parents"] == whole.records[-1]["pbt_parents"]


PBT_RUN = [  # a small population on catch: 4 agents (2 settings x 2 seeds), a PBT step every 8 updates
    "anakin",
    "--preset",
    "catch_ppo",
    "--num-devices",
    "1",
    "--num-envs",
    "8",
    "--rollout-len",
    "8",
    "--total-env-steps",
    str(64 * 400),
    "--log-interval",
    str(64 * 4),
    "--num-seeds",
    "2",
    "--sweep",
    "learning_rate=3e-4,3e-3",
    "--pbt-interval",
    str(64 * 8),
    "--pbt-quantile",
    "0.5",
    "--pbt-factor",
    "2",
    "--eval-episodes",
    "0",
]
RATES = ("time", "sps", "sps_per_seed")  # what a resumed run may log differently


def _records(run_dir) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if k not in RATES}
        for line in open(os.path.join(run_dir, "metrics.jsonl"))
    ]


@pytest.mark.slow
def test_a_population_stopped_by_sigterm_resumes_to_the_uninterrupted_records(tmp_path, sigterm_after_progress):
    """SIGTERM mid-run, then --resume: every record (returns, losses, each agent's settings, the lineage) but the
    rates equals the uninterrupted run's, the PBT steps after the stop included."""
    from podracer.cli.main import main

    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert main([*PBT_RUN, "--quiet", "--logdir", str(whole)]) == 0
    command = [sys.executable, "-m", "podracer.cli.main", *PBT_RUN, "--logdir", str(stopped)]
    assert sigterm_after_progress(command, lines=10) == 143  # 40 of 400 updates, 5 PBT steps in
    before = _records(stopped)
    assert before and before[-1]["update"] < 400  # it stopped mid-way
    assert main(["anakin", "--resume", str(stopped), "--quiet"]) == 0
    expected = _records(whole)
    assert sum("pbt_parents" in r for r in expected) == 50 and expected[-1]["update"] == 400
    assert _records(stopped) == expected
