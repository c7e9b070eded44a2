"""Multi-process Anakin: two local processes x 4 CPU devices (gloo) end where one process with 8 devices does."""

import dataclasses
import os
import socket
import subprocess
import sys

import jax
import numpy as np

from agents import PPOConfig
from anakin import AnakinConfig, train
from anakin.run import fingerprint
from experiments.presets import ANAKIN_PRESETS
from podracer.checkpoint import restore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET = ANAKIN_PRESETS["catch_ppo"]
STEPS = 20_480


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_end_with_the_parameters_of_one_process_with_eight_devices(tmp_path):
    run_dir = str(tmp_path / "two")
    coordinator = f"127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # each process: --cpu-devices 4
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "experiments.cli", "anakin", "--preset", "catch_ppo", "--cpu-devices", "4",
             "--total-env-steps", str(STEPS), "--coordinator", coordinator, "--num-processes", "2",
             "--process-id", str(i), "--coordinator-timeout", "60", "--logdir", run_dir],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert "8 device(s)" in outs[0][1] and "compiled in" in outs[0][1]
    assert outs[1][1].strip() == ""  # only process 0 logs

    config = AnakinConfig(**{**PRESET["anakin"], "total_env_steps": STEPS})
    agent_config = PPOConfig(**PRESET["agent_config"])
    single = train("ppo", agent_config, "catch", config, quiet=True)
    about = {"agent": "ppo", "env": "catch", "agent_config": dataclasses.asdict(agent_config)}
    state, counters = restore(run_dir, single.state, fingerprint(about, config, 8))
    assert counters["update"] == single.records[-1]["update"]
    params = jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), (state.learner.params, single.state.learner.params))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), *params)
