"""Sebulba: device split checks, learning, Atari, reproducibility, learner sharding, failures and signals."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from podracer.agents import ImpalaConfig, PPOConfig
from podracer.envs.host import HostEnv
from podracer.evaluation import OFF as NO_EVALUATION  # training is what most of these tests look at
from podracer.evaluation import EvalConfig
from podracer.parallel import first_local_replica
from podracer.sebulba.config import SebulbaConfig, geometry, topology
from podracer.sebulba.lifecycle import WorkerFailed
from podracer.sebulba.run import train

CARTPOLE_PPO = PPOConfig(learning_rate=1e-3)


def _params(result):
    return jax.device_get(first_local_replica(result.state).params)


def test_device_and_batch_errors_come_before_anything_starts():
    with pytest.raises(ValueError, match=r"--envs-per-thread 10 does not split evenly over 4 learner device\(s\)"):
        geometry(
            SebulbaConfig(learner_devices="1,2,3,4", envs_per_thread=10),
            topology(SebulbaConfig(learner_devices="1,2,3,4")),
        )
    with pytest.raises(ValueError, match="--learner-devices 7,9: this host has 8 device"):
        topology(SebulbaConfig(learner_devices="7,9"))
    with pytest.raises(ValueError, match="comma-separated device indices"):
        topology(SebulbaConfig(actor_devices="gpu0"))
    with pytest.raises(ValueError, match="--sync must be one of"):
        geometry(SebulbaConfig(sync="fast"), topology(SebulbaConfig()))


def test_env_batches_default_to_two_on_atari_and_one_on_cheap_envs():
    from podracer.sebulba.config import resolve_env_batches

    one_learner = SebulbaConfig(learner_devices="1")
    topo = topology(one_learner)
    assert resolve_env_batches(one_learner, "Breakout-v5", topo).env_batches == 2
    assert resolve_env_batches(one_learner, "CartPole-v1", topo).env_batches == 1
    odd = dataclasses.replace(one_learner, envs_per_thread=15)  # two batches would not split it evenly
    assert resolve_env_batches(odd, "Breakout-v5", topo).env_batches == 1
    chosen = dataclasses.replace(one_learner, env_batches=4)
    assert resolve_env_batches(chosen, "CartPole-v1", topo).env_batches == 4
    assert geometry(SebulbaConfig(envs_per_thread=21, learner_devices="1"), topo).env_batches == 1  # until resolved


def test_synchronous_cpu_dispatch_is_asked_for_not_set_by_an_import_and_says_why_it_cannot():
    code = "import jax; from podracer import sebulba; {}print(jax.config.read('jax_cpu_enable_async_dispatch'))"
    imported = subprocess.run([sys.executable, "-c", code.format("")], capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0 and imported.stdout.split() == ["True"], imported.stderr[-2000:]
    asked = subprocess.run(
        [sys.executable, "-c", code.format("sebulba.prefer_synchronous_cpu_dispatch(); ")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert asked.returncode == 0 and asked.stdout.split() == ["False"], asked.stderr[-2000:]
    late = subprocess.run(  # a notebook that ran JAX first
        [sys.executable, "-c", code.format("jax.numpy.zeros(1); sebulba.prefer_synchronous_cpu_dispatch(); ")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert late.returncode == 0 and late.stdout.split() == ["True"], late.stderr[-2000:]
    assert "JAX started before prefer_synchronous_cpu_dispatch() was called" in late.stderr


def test_default_split_puts_actors_on_device_0_and_learners_on_the_rest():
    topo = topology(SebulbaConfig())
    assert topo.actor_devices == (jax.local_devices()[0],)
    assert topo.learner_devices == tuple(jax.local_devices()[1:])


@pytest.mark.slow
def test_evaluation_runs_beside_training_and_at_the_end():
    """An evaluation thread on the actor device: a request returns at once, its result reaches a later record."""
    config = SebulbaConfig(
        actor_devices="0", learner_devices="1", envs_per_thread=16, rollout_len=64, total_env_steps=100_000, seed=0
    )
    result = train(
        "ppo",
        CARTPOLE_PPO,
        "CartPole-v1",
        config,
        quiet=True,
        evaluation=EvalConfig(eval_every=30_000, eval_episodes=4),
    )
    evaluated = [r for r in result.records if "eval_return" in r]
    assert len(evaluated) >= 3 and all(r["eval_env_steps"] <= r["env_steps"] for r in evaluated)
    assert [r["eval_env_steps"] for r in evaluated] == sorted({r["eval_env_steps"] for r in evaluated})
    assert result.evaluation == {k: v for k, v in result.records[-1].items() if k.startswith("eval_")}
    assert result.evaluation["eval_env_steps"] == result.env_steps and result.evaluation["eval_episodes"] == 4
    assert 9 <= result.evaluation["eval_return_min"] <= result.evaluation["eval_return"] <= 500


@pytest.mark.slow
def test_ppo_runs_halfcheetah_with_a_gaussian_policy():
    """halfcheetah_ppo (envpool MuJoCo, reproducible sync) for 600k of its 1M steps, on 1 actor and 1 learner device.
    Measured, mean return of the last 3 of 21 log windows: seeds 0/1/2 end at 2102/3576/2209 and first pass 1500
    at 344k/229k/287k steps (CleanRL's PPO reaches about 1500-1900 at 1M). The whole 1M steps took 88 s of a CI
    run; there seeds 0/1/2 ended at 3974/3743/3134, first past 1500 at 301k/301k/401k (before the packed-sort
    shuffle: 4439/4061/5932; with threefry actor keys, before the actors' rbg keys: 3910/5497/4289). With the
    initial log-std at 0, seeds 0/1/2 ended at 1494/1531/3026 at 1M: -0.5 is what gives the margin."""
    from podracer.cli.presets import SEBULBA_PRESETS

    fitted = SEBULBA_PRESETS["halfcheetah_ppo"]["fit"](2, os.cpu_count())
    sebulba = {**fitted["sebulba"], "total_env_steps": 600_000}
    config = SebulbaConfig(actor_devices="0", learner_devices="1", seed=0, **sebulba)
    result = train(
        "ppo", PPOConfig(**fitted["agent_config"]), "HalfCheetah-v4", config, quiet=True, evaluation=NO_EVALUATION
    )
    returns = [r["episode_return"] for r in result.records]
    assert returns[0] < 0 and np.mean(returns[-3:]) >= 1500, returns
    moments = first_local_replica(result.state).obs_moments
    assert moments.count == result.env_steps and moments.mean.shape == (17,)


@pytest.mark.slow
def test_ppo_learns_envpool_cartpole_with_one_actor_and_one_learner_device():
    """300k steps in throughput mode (so not bit-reproducible). Measured, mean return of the last 5 of 20 log
    windows, with the 16 envs in one envpool batch (the default for CartPole): seeds 0/1/2 reach 500/492/494
    and first pass 350 at 123k/108k/77k steps (in two batches, before the packed-sort shuffle, they reached
    500/436/490: a window holds only ~30 episodes); the bar of 350 leaves room."""
    config = SebulbaConfig(
        actor_devices="0", learner_devices="1", envs_per_thread=16, rollout_len=64, total_env_steps=300_000, seed=0
    )
    result = train("ppo", CARTPOLE_PPO, "CartPole-v1", config, quiet=True, evaluation=NO_EVALUATION)
    returns = [r["episode_return"] for r in result.records]
    assert returns[0] < 100 and np.mean(returns[-5:]) >= 350, returns
    assert result.env_steps >= 300_000 and result.frames == result.env_steps
    # Bounded queues and parameter versions: memory is flat once running (290 updates here).
    memory = [r["rss_mb"] for r in result.records]
    assert max(memory[5:]) - memory[5] < 100, memory


def test_an_agent_built_by_hand_trains_with_sebulba_through_the_public_api(tmp_path):
    """What a notebook does: build the agent itself, then hand it to Sebulba."""
    from podracer.agents import make_ppo
    from podracer.sebulba import batch_shape, env_spec, train_agent

    config = SebulbaConfig(
        actor_devices="0",
        learner_devices="1,2",
        envs_per_thread=8,
        rollout_len=16,
        total_env_steps=8 * 16 * 6,
        log_interval=8 * 16 * 2,
    )
    spec = env_spec("CartPole-v1")
    assert spec.num_actions == 2 and spec.observation.shape == (4,)
    agent = make_ppo(CARTPOLE_PPO, spec, batch_shape(config))
    result = train_agent(
        agent,
        "CartPole-v1",
        config,
        run_dir=str(tmp_path),
        quiet=True,
        about={"agent": "my-ppo"},
        evaluation=NO_EVALUATION,
    )
    assert result.env_steps == 768 and [r["update"] for r in result.records] == [2, 4, 6]
    saved = json.load(open(tmp_path / "config.json"))
    assert (saved["agent"], saved["env"], saved["architecture"]) == ("my-ppo", "CartPole-v1", "sebulba")
    initial = agent.init(jax.random.fold_in(jax.random.key(config.seed), 0)).params
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), _params(result), initial)
    assert max(jax.tree.leaves(moved)) > 0.0


@pytest.mark.slow
def test_impala_on_atari_gives_finite_losses_and_real_game_scores(tmp_path):
    config = SebulbaConfig(
        actor_devices="0",
        learner_devices="1",
        envs_per_thread=8,
        rollout_len=20,
        total_env_steps=8 * 20 * 24,
        log_interval=8 * 20 * 6,
        seed=1,
    )
    agent_config = ImpalaConfig(shared_torso=True, max_grad_norm=40.0)
    # Evaluated as a game (all lives, unclipped score) by sampling: a greedy untrained agent may never press FIRE.
    evaluation = EvalConfig(eval_episodes=2, eval_policy="sample")
    result = train(
        "impala", agent_config, "Breakout-v5", config, run_dir=str(tmp_path), quiet=True, evaluation=evaluation
    )
    assert result.evaluation["eval_episodes"] == 2 and result.evaluation["eval_return"] >= 0
    assert len(result.records) == 4
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["value_loss"]) for r in result.records)
    ended = [r for r in result.records if r["episodes"]]
    assert ended and all(r["episode_return"] >= 0 for r in ended)
    # Whole games of 5 lives (a random game lasts ~160-210 agent steps here), not one life each (~35),
    # although episodic life ends the training episode at every lost life.
    assert all(r["episode_length"] > 100 for r in ended), [r["episode_length"] for r in ended]
    assert result.frames == 4 * result.env_steps
    first = json.loads(open(tmp_path / "metrics.jsonl").readline())
    for key in ("fps", "sps", "policy_lag", "time_env_step", "time_inference", "time_learner_update"):
        assert key in first


def _reproducible(learner_devices="1", **overrides):
    config = SebulbaConfig(
        actor_devices="0",
        learner_devices=learner_devices,
        envs_per_thread=8,
        rollout_len=16,
        total_env_steps=8 * 16 * 6,
        sync="reproducible",
        seed=4,
        **overrides,
    )
    return train(
        "ppo",
        dataclasses.replace(CARTPOLE_PPO, num_minibatches=1),
        "CartPole-v1",
        config,
        quiet=True,
        evaluation=NO_EVALUATION,
    )


def test_reproducible_mode_gives_identical_parameters():
    first, second = _reproducible(), _reproducible()
    jax.tree.map(np.testing.assert_array_equal, _params(first), _params(second))
    assert all(r["policy_lag"] <= 1.0 for r in first.records)


def test_reproducible_mode_with_two_actor_threads_is_reproducible_too():
    first, second = _reproducible(actor_threads=2), _reproducible(actor_threads=2)
    jax.tree.map(np.testing.assert_array_equal, _params(first), _params(second))


@pytest.mark.slow
def test_a_learner_split_over_two_devices_gives_the_same_training_as_one():
    one, two = _reproducible("1"), _reproducible("1,2")
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), _params(one), _params(two))


def test_a_failing_actor_thread_stops_the_run_with_its_traceback(monkeypatch):
    calls = {"n": 0}
    real_recv = HostEnv.recv

    def flaky_recv(self):
        calls["n"] += 1
        if calls["n"] == 150:
            raise OSError("simulated emulator crash")
        return real_recv(self)

    monkeypatch.setattr(HostEnv, "recv", flaky_recv)
    config = SebulbaConfig(
        actor_devices="0", learner_devices="1", envs_per_thread=8, rollout_len=16, total_env_steps=10_000_000
    )
    start = time.perf_counter()
    with pytest.raises(WorkerFailed, match="actor thread 0.*simulated emulator crash") as failure:
        train("ppo", CARTPOLE_PPO, "CartPole-v1", config, quiet=True, evaluation=NO_EVALUATION)
    assert time.perf_counter() - start < 60
    assert isinstance(failure.value.__cause__, OSError)
    assert "flaky_recv" in "".join(__import__("traceback").format_tb(failure.value.__cause__.__traceback__))


@pytest.mark.slow
def test_sigterm_stops_a_run_cleanly(tmp_path):
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "podracer.cli.main",
        "sebulba",
        "--cpu-devices",
        "2",
        "--total-env-steps",
        "100000000",
        "--log-interval",
        "2048",
        "--logdir",
        str(run_dir),
    ]
    env = {**os.environ, "XLA_FLAGS": ""}
    process = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    try:
        for line in process.stderr:
            if "steps/s" in line:  # training is under way
                break
        process.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        process.send_signal(signal.SIGINT)  # an impatient second signal while shutting down changes nothing
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143, err[-2000:]
    assert "stopped by SIGTERM" in err and "stopped_by=SIGTERM" in out and "Traceback" not in err
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert records and records[-1]["env_steps"] < 100_000_000
