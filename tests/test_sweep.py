"""--sweep: a grid of settings in one Anakin program, each member learning as a run of its own settings would."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podracer import envs
from podracer.agents import AGENTS, ImpalaConfig, MuZeroConfig, PPOConfig, make_agent
from podracer.anakin import AnakinConfig, anakin_mesh, geometry, make_anakin, train
from podracer.anakin.evaluate import episode_returns
from podracer.anakin.sweep import Sweep, make_sweep, sweepable
from podracer.cli.main import main
from podracer.evaluation import OFF as NO_EVALUATION
from podracer.evaluation import EvalConfig
from podracer.plot import aggregate_runs
from podracer.types import Agent, BatchShape

SMALL_PPO = dataclasses.replace(PPOConfig(), num_epochs=2, num_minibatches=2, learning_rate=1e-3)


def _sweep(words, config=SMALL_PPO, agent="ppo"):
    spec = envs.make("catch").spec
    return make_sweep(lambda c, s, b: make_agent(agent, c, s, b), config, spec, BatchShape(10, 8, 8), words)


@pytest.mark.parametrize(
    "words, message",
    [
        (["learning_rate"], r"write NAME=VALUE,VALUE"),
        (["learning_rate=1e-3,fast"], r"numbers separated by commas"),
        (["learning_rate=1e-3,1e-3"], r"a value appears twice"),
        (["learning_rate=1e-3,inf"], r"must be finite"),
        (["learning_rate=1e-3", "learning-rate=3e-3"], r"named twice"),
        (["speed=1,2"], r"no setting 'speed'; it can sweep .*learning_rate"),
        (["num_epochs=1,2"], r"--num-epochs decides the program's shapes or structure.*one by one"),
        (["clip_value=0,1"], r"--clip-value decides the program's shapes or structure"),
        (
            ["learning_rate=1e-3,-1", "gamma=0.9"],
            r"member learning_rate=-1 gamma=0.9: --learning-rate must be positive",
        ),
    ],
)
def test_sweep_words_are_checked_before_anything_compiles(words, message):
    with pytest.raises(ValueError, match=message):
        _sweep(words)


def test_the_grid_is_every_combination_member_major():
    sweep = _sweep(["learning_rate=1e-4,1e-3", "entropy_coef=0,0.01,0.1"])
    assert len(sweep.members) == 6 and sweep.members[1] == {"learning_rate": 1e-4, "entropy_coef": 0.01}
    values = sweep.values(seeds=2)
    np.testing.assert_allclose(values["entropy_coef"][:6], [0, 0, 0.01, 0.01, 0.1, 0.1], rtol=1e-6)
    assert sweep.describe(3, seeds=2, first_seed=7) == "learning_rate=0.0001 entropy_coef=0.01 seed 8"
    assert not {"replay_ratio", "support_max", "priority_alpha"} & set(sweepable(MuZeroConfig))


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_every_sweepable_setting_of_every_agent_traces(agent):
    """Every float the sweep accepts can be a traced value in the agent: nothing branches on it in Python."""
    config = {"ppo": SMALL_PPO, "impala": ImpalaConfig(), "muzero": MuZeroConfig(num_simulations=2, prioritized=True)}[
        agent
    ]
    env = envs.make("catch")
    geo = geometry(AnakinConfig(num_envs=8, rollout_len=8, total_env_steps=8 * 8 * 4), 1)
    make = lambda c, s, b: make_agent(agent, c, s, b)  # noqa: E731
    shape = BatchShape(geo.num_updates, geo.rollout_len, geo.envs_per_lane)
    words = [f"{name}={getattr(config, name)}" for name in sweepable(type(config))]
    sweep = make_sweep(make, config, env.spec, shape, words)
    geo = geo._replace(members=1)
    program = make_anakin(make(config, env.spec, shape), env, geo, anakin_mesh(jax.devices()[:1], 1), sweep=sweep)
    state = jax.eval_shape(program.init, 0)
    assert set(state.hparams) == set(sweepable(type(config)))
    jax.eval_shape(program.run, state, 1)


def _agent_params(result, agent):
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0))[0, agent, 0], result.state.learner.params)


def test_each_member_learns_as_a_run_of_its_settings_alone():
    config = AnakinConfig(num_envs=8, rollout_len=8, total_env_steps=8 * 8 * 6, num_devices=2, num_seeds=2, seed=5)
    swept = dataclasses.replace(config, sweep=("learning_rate=3e-4,3e-3", "entropy_coef=0.01,0.5"))
    together = train("ppo", SMALL_PPO, "catch", swept, quiet=True, evaluation=NO_EVALUATION)
    alone = train(
        "ppo",
        dataclasses.replace(SMALL_PPO, learning_rate=3e-3, entropy_coef=0.5),
        "catch",
        dataclasses.replace(config, num_seeds=1, seed=6),
        quiet=True,
        evaluation=NO_EVALUATION,
    )
    member_3 = _agent_params(together, 7)  # (3e-3, 0.5), seed 6: agents are member-major, 2 seeds each
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5), member_3, _agent_params(alone, 0))
    distance = lambda a, b: sum(float(np.abs(x - y).sum()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))  # noqa: E731
    float_error = distance(member_3, _agent_params(alone, 0))
    for other in (5, 3):  # (3e-3, 0.01) and (3e-4, 0.5), seed 6: each differs from member 3 in one setting
        assert distance(_agent_params(together, other), _agent_params(alone, 0)) > 10 * float_error
    record = together.records[-1]
    assert len(record["episode_return_per_seed"]) == 8 and together.agents == 8
    assert record["hyperparameters"]["entropy_coef"] == [0.01, 0.01, 0.5, 0.5] * 2


@pytest.mark.slow
def test_a_sweep_from_the_command_line_resumes_with_it_and_plots_per_member(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    flags = ["--preset", "catch_ppo", "--num-devices", "1", "--num-envs", "16", "--total-env-steps", "8192"]
    sweep = ["--sweep", "learning_rate=1e-3,3e-3", "--num-seeds", "2", "--logdir", run_dir, "--quiet"]
    assert main(["anakin", *flags, *sweep]) == 0
    assert "sps=" in capsys.readouterr().out
    assert main(["anakin", "--resume", run_dir, "--quiet"]) == 0  # the saved sweep, or the checkpoint would not fit
    assert main(["anakin", "--resume", run_dir, "--sweep", "learning_rate=1e-3,5e-3", "--quiet"]) == 2
    err = capsys.readouterr().err  # another grid is another run: refused in one line
    assert "anakin.sweep: ['learning_rate=1e-3,3e-3'] in the checkpoint" in err and len(err.splitlines()) == 1
    config = json.load(open(os.path.join(run_dir, "config.json")))
    assert config["anakin"]["sweep"] == ["learning_rate=1e-3,3e-3"] and config["sweep"]["seeds_per_member"] == 2
    groups = aggregate_runs([run_dir], reps=10)
    assert sorted(groups) == ["anakin ppo catch learning_rate=0.001", "anakin ppo catch learning_rate=0.003"]
    assert all(len(g["runs"]) == 2 for g in groups.values())
    assert main(["anakin", *flags, "--sweep", "num_epochs=1,2", "--logdir", str(tmp_path / "bad")]) == 2
    assert "--num-epochs decides the program's shapes" in capsys.readouterr().err


def test_each_agent_of_a_sweep_is_evaluated_with_its_own_settings():
    """A member's settings (or those PBT gave it) can change how it acts: its evaluation must act with them."""

    def agent_with(hparams):  # skill 1 moves the paddle under the ball, skill 0 holds it left
        def act_greedy(params, obs, key, core):  # obs [B, rows, columns]: the ball above, the paddle in the last row
            ball, paddle = jnp.argmax(obs[:, :-1].sum(1), -1), jnp.argmax(obs[:, -1], -1)
            return jnp.where(hparams["skill"] > 0.5, jnp.sign(ball - paddle) + 1, 0).astype(jnp.int32), core

        return Agent(init=None, actor_params=lambda state: state, act=None, learn=None, act_greedy=act_greedy)

    sweep = Sweep(("skill",), ({"skill": 0.0}, {"skill": 1.0}), agent_with, {"skill": (None, None)})
    config = EvalConfig(eval_episodes=16)
    run = episode_returns(agent_with({"skill": 0.0}), envs.make("catch"), config, sweep)
    returns, finished = run(jnp.zeros(2), {"skill": jnp.array([1.0, 0.0])}, jax.random.key(0))
    assert finished.all()
    assert (returns[0] == 1).all() and returns[1].mean() < 0  # each seed acted as its own member


@pytest.mark.slow
def test_a_sweep_of_a_thousand_members_trains_in_one_program(tmp_path):
    """1,000 learning rates on catch, one device: the grid compiles once and every member learns and is logged."""
    rates = [f"{1e-4 * (1 + i / 100):.6g}" for i in range(1000)]
    run_dir = tmp_path / "run"
    flags = ["anakin", "--preset", "catch_ppo", "--num-devices", "1", "--num-envs", "2", "--rollout-len", "4"]
    flags += [
        "--total-env-steps",
        "64",
        "--log-interval",
        "64",
        "--eval-episodes",
        "0",
        "--quiet",
        "--logdir",
        str(run_dir),
    ]
    assert main([*flags, "--sweep", "learning_rate=" + ",".join(rates)]) == 0
    record = [json.loads(line) for line in open(run_dir / "metrics.jsonl")][-1]
    assert record["update"] == 8 and len(record["hyperparameters"]["learning_rate"]) == 1000
    np.testing.assert_allclose(record["hyperparameters"]["learning_rate"], np.asarray(rates, float), rtol=1e-6)
    returns = np.asarray(record["episode_return_per_seed"], float)  # each agent ran 32 steps: 3 catch episodes
    assert returns.shape == (1000,) and np.isfinite(returns).all() and np.isfinite(record["loss"])
