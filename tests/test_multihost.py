"""Multi-process runs: two local processes (gloo collectives) against one; Sebulba learners averaging across hosts."""

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from podracer.agents import PPOConfig
from podracer.anakin import AnakinConfig, train
from podracer.anakin.run import anakin_fingerprint
from podracer.checkpoint import restore
from podracer.cli.presets import ANAKIN_PRESETS
from podracer.evaluation import OFF as NO_EVALUATION  # training is what these tests look at

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET = ANAKIN_PRESETS["catch_ppo"]
STEPS = 20_480


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_end_with_the_parameters_of_one_process_with_eight_devices(tmp_path):
    run_dir = str(tmp_path / "two")
    coordinator = f"127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # each process: --cpu-devices 4
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "podracer.cli.main",
                "anakin",
                "--preset",
                "catch_ppo",
                "--cpu-devices",
                "4",
                "--total-env-steps",
                str(STEPS),
                "--coordinator",
                coordinator,
                "--num-processes",
                "2",
                "--process-id",
                str(i),
                "--coordinator-timeout",
                "60",
                "--logdir",
                run_dir,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert "8 device(s)" in outs[0][1] and "compiled in" in outs[0][1]
    assert outs[1][1].strip() == ""  # only process 0 logs

    config = AnakinConfig(**{**PRESET["anakin"], "total_env_steps": STEPS})
    agent_config = PPOConfig(**PRESET["agent_config"])
    single = train("ppo", agent_config, "catch", config, quiet=True, evaluation=NO_EVALUATION)
    about = {"agent": "ppo", "env": "catch", "agent_config": dataclasses.asdict(agent_config)}
    state, counters = restore(run_dir, single.state, anakin_fingerprint(about, config, 8))
    assert counters["update"] == single.records[-1]["update"]
    params = jax.tree.map(
        lambda x: np.asarray(x.addressable_data(0)), (state.learner.params, single.state.learner.params)
    )
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), *params)


@pytest.mark.slow
def test_two_sebulba_processes_average_gradients_across_both_learners(tmp_path):
    import orbax.checkpoint as ocp

    from podracer.agents import make_agent
    from podracer.envs.host import HostEnv
    from podracer.parallel import device_mesh, per_device
    from podracer.types import BatchShape

    run_dir = str(tmp_path / "sebulba")
    coordinator = f"127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "podracer.cli.main",
                "sebulba",
                "--cpu-devices",
                "2",
                "--actor-devices",
                "0",
                "--learner-devices",
                "1",
                "--envs-per-thread",
                "8",
                "--rollout-len",
                "16",
                "--total-env-steps",
                "2048",
                "--coordinator",
                coordinator,
                "--num-processes",
                "2",
                "--process-id",
                str(i),
                "--coordinator-timeout",
                "60",
                "--logdir",
                run_dir,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert "learner on 1 device(s) x 2 processes" in outs[0][1] and outs[1][1].strip() == ""
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert records[-1]["update"] == 8 and records[-1]["env_steps"] == 2048  # 2 hosts x 8 envs x 16 steps

    # The final checkpoint holds one learner state per learner device (one per process): the same
    # parameters on both although each learnt from its own host's data, so gradients were averaged.
    spec = HostEnv("CartPole-v1", 1, 0).spec
    agent = make_agent("ppo", PPOConfig(), spec, BatchShape(8, 16, 8))
    like = per_device(agent.init(jax.random.key(0)), device_mesh(jax.devices()[:2]))
    manager = ocp.CheckpointManager(os.path.join(run_dir, "checkpoints"))
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    state = manager.restore(8, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))).state
    params = jax.tree.map(np.asarray, state.params)
    initial = jax.tree.map(
        np.asarray,
        per_device(agent.init(jax.random.fold_in(jax.random.key(0), 0)), device_mesh(jax.devices()[:2])).params,
    )
    jax.tree.map(lambda p: np.testing.assert_allclose(p[0], p[1], rtol=1e-6, atol=1e-7), params)
    moved = jax.tree.map(lambda p, q: float(np.abs(p[0] - q[0]).max()), params, initial)
    assert max(jax.tree.leaves(moved)) > 1e-4


def _slurm_task(i: int, port: int) -> dict:
    """The environment of Slurm task ``i`` of 2 on this host (JAX's Slurm detection reads these)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return {
        **env,
        "SLURM_JOB_ID": "4242",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": str(i),
        "SLURM_LOCALID": str(i),
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_NUM_NODES": "1",
        "JAX_COORDINATOR_PORT": str(port),
    }


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["by hand", "slurm"])
def test_a_lost_process_stops_the_others_at_once_with_a_message(tmp_path, launcher):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    flags = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--coordinator-timeout", "60"]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "podracer.cli.main",
                "anakin",
                "--preset",
                "catch_ppo",
                "--cpu-devices",
                "2",
                "--total-env-steps",
                "100000000",
                "--logdir",
                str(tmp_path / "run"),
                *([*flags, "--process-id", str(i)] if launcher == "by hand" else []),
            ],
            cwd=ROOT,
            env=env if launcher == "by hand" else _slurm_task(i, port),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for line in procs[0].stderr:
        if line.startswith("compiled in"):
            break
    time.sleep(2.0)  # training
    procs[1].kill()  # SIGKILL: no goodbye, no checkpoint of its own
    killed = time.monotonic()
    _, err = procs[0].communicate(timeout=120)
    assert time.monotonic() - killed < 10.0  # JAX alone: ~100 s, then an abort
    assert procs[0].returncode == 1, err[-3000:]
    assert "podracer: process 1 is gone" in err and "Check failure" not in err
    procs[1].communicate(timeout=30)
