"""Evaluations are bounded by --eval-max-steps: episodes still running then are cut short, left out of the score,
counted, and said to be (an untrained greedy Atari agent that never fires used to hold a run for minutes)."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from podracer import envs
from podracer.anakin.evaluate import episode_returns
from podracer.cli.main import main
from podracer.evaluation import EvalConfig, describe, summary
from podracer.types import Agent

CATCH_EPISODE = 9  # steps: the ball falls through 10 rows


def test_episodes_cut_short_are_left_out_of_the_score_and_counted():
    returns, finished = np.array([[1.0, -1.0], [5.0, 7.0]]), np.array([[True, False], [True, True]])
    fields = summary(returns, env_steps=100, finished=finished)
    assert fields["eval_episodes"] == 3 and fields["eval_cut_short"] == 1 and fields["eval_return"] == 13 / 3
    assert "eval_return_per_seed" not in fields  # the seeds no longer count as many episodes each
    assert describe(fields, 50).endswith("; 1 cut short at --eval-max-steps 50 and left out")
    none = summary(returns, env_steps=100, finished=np.zeros((2, 2), bool))
    assert none == {"eval_episodes": 0, "eval_cut_short": 4, "eval_env_steps": 100}
    assert describe(none, 50) == "no episode ended: all 4 cut short at --eval-max-steps 50, so no return"
    assert summary(returns, env_steps=100)["eval_cut_short"] == 0


def _stay_put() -> Agent:
    """An agent that never moves: a Catch episode lasts its 9 steps whatever it does."""

    def act_greedy(params, obs, key, core):
        return jnp.ones(obs.shape[0], jnp.int32), core

    return Agent(init=None, actor_params=lambda state: state, act=None, learn=None, act_greedy=act_greedy)


@pytest.mark.parametrize("max_steps, ended", [(CATCH_EPISODE - 1, False), (CATCH_EPISODE, True)])
def test_anakin_evaluation_stops_at_its_step_bound(max_steps, ended):
    config = EvalConfig(eval_episodes=4, eval_max_steps=max_steps)
    run = episode_returns(_stay_put(), envs.make("catch"), config)
    _, finished = jax.device_get(run(jnp.zeros(1), {}, jax.random.key(0)))
    assert finished.shape == (1, 4) and (finished == ended).all()


def test_a_sebulba_evaluation_stops_at_its_step_bound():
    """CartPole games last at least 8 steps: a bound of 3 cuts every one short."""
    from podracer.agents import PPOConfig, make_ppo
    from podracer.envs.host import HostEnv, HostEnvConfig
    from podracer.sebulba.evaluate import SebulbaEvaluator

    config = EvalConfig(eval_episodes=2, eval_max_steps=3)
    env = HostEnv("CartPole-v1", config.eval_episodes, 0, HostEnvConfig())
    agent = make_ppo(PPOConfig(), env.spec)
    args = (HostEnvConfig(), config, jax.devices()[0], 0, 16, env.to_agent_layout, threading.Event())
    evaluator = SebulbaEvaluator(agent, "CartPole-v1", *args)
    sent, send = [], env.send
    env.send = lambda action: sent.append(action) or send(action)
    try:
        scores, finished = evaluator.play(env, agent.actor_params(agent.init(jax.random.key(0))), jax.random.key(1))
    finally:
        env.close()
    assert not finished.any() and len(sent) == 3


def test_a_sebulba_run_says_its_final_evaluation_was_cut_short(tmp_path, capsys):
    """CartPole games last at least 8 steps: a bound of 3 cuts every one short, and the run says so."""
    layout = ["--envs-per-thread", "4", "--rollout-len", "8", "--learner-devices", "0", "--actor-devices", "0"]
    run = ["sebulba", *layout, "--total-env-steps", "64"]
    evaluation = ["--eval-episodes", "2", "--eval-max-steps", "3", "--checkpoint-every", "0"]
    assert main([*run, *evaluation, "--logdir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr()
    assert "evaluation: no episode ended: all 2 cut short at --eval-max-steps 3, so no return" in out.err
    assert "eval_return=None" in out.out.splitlines()[-1]
