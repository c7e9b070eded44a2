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


def _two_processes(arguments, envs=None) -> list[subprocess.Popen]:
    """Processes 0 and 1 of ``python ARGUMENTS(i)`` (output piped; without XLA_FLAGS unless ``envs`` give one)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return [
        subprocess.Popen(
            [sys.executable, *arguments(i)],
            cwd=ROOT,
            env=envs[i] if envs else env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]


@pytest.mark.slow
def test_two_processes_end_with_the_parameters_of_one_process_with_eight_devices(tmp_path):
    run_dir = str(tmp_path / "two")
    coordinator = f"127.0.0.1:{_free_port()}"
    command = ["-m", "podracer.cli.main", "anakin", "--preset", "catch_ppo", "--cpu-devices", "4"]
    command += ["--total-env-steps", str(STEPS), "--coordinator", coordinator, "--num-processes", "2"]
    command += ["--coordinator-timeout", "60", "--logdir", run_dir]
    procs = _two_processes(lambda i: [*command, "--process-id", str(i)])
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
    command = ["-m", "podracer.cli.main", "sebulba", "--cpu-devices", "2", "--actor-devices", "0"]
    command += ["--learner-devices", "1", "--envs-per-thread", "8", "--rollout-len", "16", "--total-env-steps", "2048"]
    command += ["--coordinator", coordinator, "--num-processes", "2", "--coordinator-timeout", "60"]
    procs = _two_processes(lambda i: [*command, "--process-id", str(i), "--logdir", run_dir])
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


def _start_catch_pair(run_dir, launcher: str = "by hand", devices_each: int = 2) -> list[subprocess.Popen]:
    """Two processes of one long catch_ppo run (only process 0 logs, to stderr)."""
    port = _free_port()
    flags = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--coordinator-timeout", "60"]
    command = ["-m", "podracer.cli.main", "anakin", "--preset", "catch_ppo"]
    command += ["--cpu-devices", str(devices_each), "--total-env-steps", "100000000", "--logdir", str(run_dir)]
    if launcher == "by hand":
        return _two_processes(lambda i: [*command, *flags, "--process-id", str(i)])
    return _two_processes(lambda i: command, envs=[_slurm_task(i, port) for i in range(2)])


def _wait_for_line(proc: subprocess.Popen, prefix: str) -> None:
    for line in proc.stderr:
        if line.startswith(prefix):
            return
    raise AssertionError(f"the process ended before printing {prefix!r}")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["by hand", "slurm"])
def test_a_lost_process_stops_the_others_at_once_with_a_message(tmp_path, launcher):
    procs = _start_catch_pair(tmp_path / "run", launcher)
    _wait_for_line(procs[0], "compiled in")
    time.sleep(2.0)  # training
    procs[1].kill()  # SIGKILL: no goodbye, no checkpoint of its own
    killed = time.monotonic()
    _, err = procs[0].communicate(timeout=120)
    assert time.monotonic() - killed < 10.0  # JAX alone: ~100 s, then an abort
    assert procs[0].returncode == 1, err[-3000:]
    assert "podracer: process 1 is gone" in err and "Check failure" not in err
    procs[1].communicate(timeout=30)


@pytest.mark.slow
def test_losing_process_0_ends_the_survivor_with_podracers_exit_code_every_time(tmp_path):
    """Process 0 holds JAX's coordination service: when it dies, JAX's client in the survivor prints its
    "Terminating process" line and aborts (exit 134, after a stack trace, ~0.1 s later: measured with a bare
    ``jax.distributed`` pair). podracer's peer watch must end the survivor first, with its own message and exit 1,
    every time: 2 in a row here (measured by hand: 30 of 30, 10 of them beside three busy loops on two cores)."""
    for attempt in range(2):
        procs = _start_catch_pair(tmp_path / f"run{attempt}", devices_each=1)
        _wait_for_line(procs[0], "anakin:")  # printed after the distributed runtime started
        procs[0].kill()
        _, err = procs[1].communicate(timeout=60)
        procs[0].communicate(timeout=30)
        assert procs[1].returncode == 1, (attempt, err[-3000:])
        assert "podracer: process 0 is gone" in err, (attempt, err[-3000:])


AGREE = """
import sys
from podracer import distributed
distributed.initialize(sys.argv[1], 2, int(sys.argv[2]), timeout_s=60)
offers = [(False, 3), (True, 7)]  # process 0 is not asked to stop and offers 3 updates; process 1 the other way
print(distributed.agree_on_step(*offers[int(sys.argv[2])]))
distributed.say_goodbye()
"""


@pytest.mark.slow
def test_processes_agree_on_the_stop_and_on_the_fewest_updates_before_each_step():
    """Each process paces its own steps; one that ran fewer updates than another would leave that one waiting in a
    collective for ever (seen before this agreement: two catch_ppo processes of 1M-2M steps stalled in 4 of 7 runs)."""
    coordinator = f"127.0.0.1:{_free_port()}"
    procs = _two_processes(lambda i: ["-c", AGREE, coordinator, str(i)])
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        assert out.strip().splitlines()[-1] == "(True, 3)", (out, err[-2000:])  # gloo prints a line first
