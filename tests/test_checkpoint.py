"""Checkpoints: SIGTERM mid-run then --resume ends with exactly the uninterrupted parameters; clear refusals."""

import asyncio
import collections
import gc
import glob
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import types
from typing import NamedTuple

import jax
import numpy as np
import pytest

from podracer.agents import PPOConfig
from podracer.anakin import AnakinConfig, train
from podracer.cli.main import main
from podracer.cli.presets import ANAKIN_PRESETS
from podracer.distributed import CoordinatorUnreachable, initialize
from podracer.evaluation import OFF as NO_EVALUATION  # training is what these tests look at

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET = ANAKIN_PRESETS["catch_ppo"]
FLAGS = [
    "--preset",
    "catch_ppo",
    "--num-devices",
    "2",
    "--total-env-steps",
    "150000",
    "--log-interval",
    "4096",
    "--checkpoint-every",
    "8",
    "--eval-episodes",
    "0",
]
CONFIG = AnakinConfig(**{**PRESET["anakin"], "total_env_steps": 150_000, "log_interval": 4096}, num_devices=2)


def _params(state):
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), state.learner.params)


def _cli(*args):
    return [sys.executable, "-m", "podracer.cli.main", "anakin", *args]


@pytest.mark.slow
def test_sigterm_then_resume_gives_the_uninterrupted_parameters_and_gapless_metrics(tmp_path, sigterm_after_progress):
    run_dir = str(tmp_path / "stopped")
    assert sigterm_after_progress(_cli(*FLAGS, "--logdir", run_dir), lines=3) == 143
    stopped = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert stopped and stopped[-1]["update"] < 147  # it really stopped mid-way
    assert glob.glob(os.path.join(run_dir, "checkpoints", str(stopped[-1]["update"])))

    resumed = train(
        "ppo",
        PPOConfig(**PRESET["agent_config"]),
        "catch",
        CONFIG,
        run_dir,
        quiet=True,
        resume=True,
        evaluation=NO_EVALUATION,
    )
    reference = train("ppo", PPOConfig(**PRESET["agent_config"]), "catch", CONFIG, quiet=True, evaluation=NO_EVALUATION)
    jax.tree.map(np.testing.assert_array_equal, _params(resumed.state), _params(reference.state))

    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    updates = [r["update"] for r in records]
    assert updates == sorted(set(updates)) and updates[-1] == reference.records[-1]["update"]
    assert records[: len(stopped)] == stopped  # the metrics before the stop are kept as written
    steps_per_update = records[0]["env_steps"] // records[0]["update"]
    assert all(r["env_steps"] == r["update"] * steps_per_update for r in records)
    assert records[-1]["time"] > stopped[-1]["time"]  # training time continues
    kept = sorted(int(os.path.basename(p)) for p in glob.glob(os.path.join(run_dir, "checkpoints", "[0-9]*")))
    assert len(kept) == 3 and kept[-1] == updates[-1]  # --checkpoint-keep 3 (the default), the last at the end


@pytest.mark.slow
def test_observation_statistics_resume_bit_exactly(tmp_path, sigterm_after_progress):
    """Pendulum with a Gaussian policy and --normalize-observations, stopped mid-run on 2 devices and resumed."""
    preset = ANAKIN_PRESETS["pendulum_ppo"]
    config = AnakinConfig(**{**preset["anakin"], "total_env_steps": 50_000, "log_interval": 8192}, num_devices=2)
    run_dir = str(tmp_path / "stopped")
    flags = [
        "--preset",
        "pendulum_ppo",
        "--num-devices",
        "2",
        "--total-env-steps",
        "50000",
        "--log-interval",
        "8192",
        "--checkpoint-every",
        "4",
        "--eval-episodes",
        "0",
        "--logdir",
        run_dir,
    ]
    assert sigterm_after_progress(_cli(*flags), lines=2) == 143
    stopped = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert stopped and stopped[-1]["env_steps"] < 45_000

    agent_config = PPOConfig(**preset["agent_config"])
    resumed = train(
        "ppo", agent_config, preset["env"], config, run_dir, quiet=True, resume=True, evaluation=NO_EVALUATION
    )
    reference = train("ppo", agent_config, preset["env"], config, quiet=True, evaluation=NO_EVALUATION)

    def learner(result):
        return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), result.state.learner)

    moments = learner(reference).obs_moments
    assert moments.count == reference.records[-1]["env_steps"]  # every observation learnt from, on both devices
    jax.tree.map(np.testing.assert_array_equal, learner(resumed), learner(reference))


@pytest.mark.slow
def test_sigterm_stops_a_long_run_within_seconds_with_a_checkpoint(tmp_path):
    """A 100M-step run logs every 5M steps (~1 minute here); a stop must not wait for the log window."""
    run_dir = str(tmp_path / "long")
    proc = subprocess.Popen(
        _cli("--total-env-steps", "100000000", "--num-devices", "1", "--logdir", run_dir),
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    for line in proc.stderr:
        if line.startswith("compiled in"):
            break
    time.sleep(3.0)  # a few calls into the first log window
    proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    proc.stderr.read()
    assert proc.wait(timeout=60) == 143
    assert time.monotonic() - signalled < 5.0  # checkpoint written
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    (checkpoint,) = glob.glob(os.path.join(run_dir, "checkpoints", "[0-9]*"))
    assert records and records[-1]["update"] == int(os.path.basename(checkpoint)) < 195_313  # mid-run
    assert records[-1]["env_steps"] < 5_000_000  # inside the first 5M-step log window


@pytest.mark.slow
def test_checkpoint_every_n_updates_means_every_n_updates(tmp_path):
    run_dir = str(tmp_path / "every")
    code = main(
        [
            "anakin",
            "--preset",
            "catch_ppo",
            "--num-devices",
            "1",
            "--total-env-steps",
            "20480",
            "--log-interval",
            "20480",
            "--checkpoint-every",
            "3",
            "--checkpoint-keep",
            "100",
            "--quiet",
            "--logdir",
            run_dir,
        ]
    )
    assert code == 0
    kept = sorted(int(os.path.basename(p)) for p in glob.glob(os.path.join(run_dir, "checkpoints", "[0-9]*")))
    assert kept == [3, 6, 9, 12, 15, 18, 20]  # 20 updates in one log window; the last at the end


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncate a state file", "delete the state metadata"])
def test_resume_falls_back_to_the_newest_checkpoint_that_restores(tmp_path, capsys, damage):
    run_dir = str(tmp_path / "run")
    flags = [
        "anakin",
        "--preset",
        "catch_ppo",
        "--num-devices",
        "1",
        "--total-env-steps",
        "12288",
        "--log-interval",
        "2048",
        "--checkpoint-every",
        "6",
        "--quiet",
    ]
    assert main([*flags, "--logdir", run_dir]) == 0  # 12 updates: checkpoints at 6 and 12
    newest = os.path.join(run_dir, "checkpoints", "12", "state")
    if damage == "truncate a state file":
        for path in glob.glob(os.path.join(newest, "**", "d", "*"), recursive=True):
            open(path, "wb").close()
    else:
        os.remove(os.path.join(newest, "_METADATA"))
    os.makedirs(os.path.join(run_dir, "checkpoints", "12.orbax-checkpoint-tmp-99"))  # a save a kill cut short
    if damage == "truncate a state file":  # reading the run falls back too, and says so
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        command = [sys.executable, "-m", "podracer.cli.main", "eval", run_dir, "--episodes", "1"]
        out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "skipped the checkpoint(s) that did not restore: update 12 (" in out.stderr
        assert "reading the one at update 6 instead" in out.stderr and "update=6" in out.stdout
    capsys.readouterr()
    assert main(["anakin", "--resume", run_dir, "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "skipped the checkpoint(s) that did not restore: update 12 (" in err and "resuming from update 6" in err
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["update"] for r in records] == [2, 4, 6, 8, 10, 12]  # redone from 6: no gaps, no duplicates
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["12", "6"]  # 12 saved anew
    assert len(os.listdir(os.path.join(run_dir, "damaged_checkpoints"))) == 1


@pytest.mark.slow
def test_a_stop_while_compiling_leaves_a_run_that_resumes(tmp_path):
    run_dir = str(tmp_path / "early")
    proc = subprocess.Popen(
        _cli("--preset", "catch_ppo", "--num-devices", "1", "--total-env-steps", "8192", "--logdir", run_dir),
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    for line in proc.stderr:
        if line.startswith("anakin:"):  # the banner: compilation starts now
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "stopped_by=SIGTERM" in out and "Traceback" not in err
    assert os.path.isdir(os.path.join(run_dir, "checkpoints", "0"))  # the initial state
    resumed = subprocess.run(
        _cli("--resume", run_dir, "--quiet"), cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [json.loads(line)["update"] for line in open(os.path.join(run_dir, "metrics.jsonl"))][-1] == 8


@pytest.mark.slow
def test_a_start_that_never_got_going_is_reused_and_resume_or_start_retries(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    bad = [
        "anakin",
        "--preset",
        "catch_ppo",
        "--num-devices",
        "1",
        "--num-envs",
        "4",
        "--rollout-len",
        "10",
        "--num-minibatches",
        "3",
        "--total-env-steps",
        "2000",
        "--quiet",
        "--logdir",
        run_dir,
    ]
    assert main(bad) == 2  # found while compiling, after the run directory was made
    assert "--num-minibatches 3" in capsys.readouterr().err
    good = [*bad[:10], "2", *bad[11:]]
    assert main(good) == 0  # the same directory, reused: it held no record or checkpoint
    assert main(good) == 2 and "already holds a run; continue it with --resume" in capsys.readouterr().err
    retry = [*good, "--resume-or-start"]
    assert main(retry) == 0  # the run exists: continued (here: already at its end)
    fresh = [*good[:-1], str(tmp_path / "fresh"), "--resume-or-start"]
    assert main(fresh) == 0  # no run there: started
    assert [json.loads(line)["update"] for line in open(tmp_path / "fresh" / "metrics.jsonl")][-1] == 50
    assert main(["anakin", "--resume-or-start", "--quiet"]) == 2
    assert "--resume-or-start goes with --logdir DIR" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_refuses_another_configuration_and_another_format(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    small = ["--preset", "catch_ppo", "--num-devices", "1", "--total-env-steps", "4096", "--quiet"]
    assert main(["anakin", *small, "--logdir", run_dir]) == 0
    assert main(["anakin", "--resume", run_dir, "--learning-rate", "0.5", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "different configuration" in err and "learning_rate: 0.001 in the checkpoint, 0.5 now" in err
    assert len(err.strip().splitlines()) == 1, err  # one line, however many settings differ
    assert main(["anakin", "--resume", run_dir, "--core", "gru", "--quiet"]) == 2  # a recurrent core is no exception
    assert "agent_config.core: 'none' in the checkpoint, 'gru' now" in capsys.readouterr().err

    (meta,) = glob.glob(os.path.join(run_dir, "checkpoints", "*", "meta", "metadata"))
    saved = json.load(open(meta))
    json.dump({**saved, "format_version": 99}, open(meta, "w"))
    assert main(["anakin", "--resume", run_dir, "--quiet"]) == 2
    assert "format version 99" in capsys.readouterr().err

    assert main(["anakin", "--resume", str(tmp_path / "nothing"), "--quiet"]) == 2
    assert "no config.json there" in capsys.readouterr().err


def test_an_unreachable_coordinator_times_out_with_a_message():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    start = time.monotonic()
    with pytest.raises(CoordinatorUnreachable, match=f"no coordinator answered at 127.0.0.1:{port} within 2s"):
        initialize(f"127.0.0.1:{port}", 2, 1, timeout_s=2)
    assert time.monotonic() - start < 10
    with pytest.raises(ValueError, match="go together"):
        initialize("127.0.0.1:1234", None, 1)
    with pytest.raises(ValueError, match="--process-id must be in 0..1"):
        initialize("127.0.0.1:1234", 2, 2)


def test_process_0_alone_and_malformed_addresses_end_with_a_message():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(CoordinatorUnreachable, match=r"process\(es\) \[1\] did not arrive at 127.0.0.1:.* within 2s"):
        initialize(f"127.0.0.1:{port}", 2, 0, timeout_s=2)  # JAX itself would abort here (exit 134)
    assert time.monotonic() - start < 10
    for address in ("localhost", "localhost:", "localhost:99999", ":1234"):
        with pytest.raises(ValueError, match="--coordinator must be HOST:PORT"):
            initialize(address, 2, 0, timeout_s=2)
    with pytest.raises(ValueError, match="--coordinator nohost.invalid:1234: cannot resolve 'nohost.invalid'"):
        initialize("nohost.invalid:1234", 2, 0, timeout_s=2)  # JAX itself would segfault here


@pytest.mark.slow
def test_sebulba_resumed_from_a_checkpoint_continues_its_counters_and_metrics(tmp_path, sigterm_after_progress):
    run_dir = str(tmp_path / "sebulba")
    flags = [
        "--envs-per-thread",
        "16",
        "--rollout-len",
        "32",
        "--total-env-steps",
        "120000",
        "--log-interval",
        "2048",
        "--actor-devices",
        "0",
        "--learner-devices",
        "1",
        "--checkpoint-every",
        "4",
        "--learning-rate",
        "1e-3",
    ]
    command = [sys.executable, "-m", "podracer.cli.main", "sebulba", *flags, "--logdir", run_dir]
    assert sigterm_after_progress(command, lines=4) == 143
    stopped = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    last = stopped[-1]["update"]
    assert 4 <= last < 234 and glob.glob(os.path.join(run_dir, "checkpoints", str(last)))

    out = subprocess.run(
        [sys.executable, "-m", "podracer.cli.main", "sebulba", "--resume", run_dir],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resumed from the checkpoint at update {last}" in out.stderr
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert records[: len(stopped)] == stopped
    updates = [r["update"] for r in records]
    assert updates == sorted(set(updates)) and updates[-1] == 235  # ceil(120000 / 512)
    assert all(r["env_steps"] == 512 * r["update"] for r in records)
    assert records[len(stopped)]["time"] > stopped[-1]["time"]
    returns = [r["episode_return"] for r in records if r["episode_return"] is not None]
    assert np.mean(returns[-3:]) > stopped[-1]["episode_return"]  # it kept learning from the checkpoint


def test_checkpoints_fall_due_by_updates_and_by_minutes():
    from podracer.checkpoint import CheckpointConfig, Checkpointer

    by_updates = Checkpointer(None, {}, CheckpointConfig(checkpoint_every=4))
    assert [u for u in range(1, 10) if by_updates.due(u)] == [4, 5, 6, 7, 8, 9]  # nothing saved yet: due from 4
    by_updates.last_update = 4
    assert not by_updates.due(7) and by_updates.due(8)
    by_time = Checkpointer(None, {}, CheckpointConfig(checkpoint_minutes=0.002))  # 0.12 s
    assert not by_time.due(1)
    time.sleep(0.2)
    assert by_time.due(1)
    assert not Checkpointer(None, {}, CheckpointConfig()).due(10**6)  # only on signals and at the end
    with pytest.raises(ValueError, match="--checkpoint-keep"):
        Checkpointer(None, {}, CheckpointConfig(checkpoint_keep=0))


ROUTING_PROBE = """
import os, signal, sys, threading, time
from podracer.signals import route_signals_to_main_thread
handled = []
signal.signal(signal.SIGTERM, lambda signum, frame: handled.append(threading.current_thread() is threading.main_thread()))
before = set(os.listdir("/proc/self/task"))
route_signals_to_main_thread()
import jax
jax.block_until_ready(jax.jit(lambda x: x + 1)(jax.numpy.ones(1000)))  # XLA starts its thread pools here
def blocks(tid):
    mask = int(next(l for l in open(f"/proc/self/task/{tid}/status") if l.startswith("SigBlk")).split()[1], 16)
    return all(mask >> (s - 1) & 1 for s in (signal.SIGINT, signal.SIGTERM))
watcher = {str(t.native_id) for t in threading.enumerate() if t.name == "podracer-signals"}
new = set(os.listdir("/proc/self/task")) - before - watcher  # the watcher takes them (sigwait unblocks them)
os.kill(os.getpid(), signal.SIGTERM)
deadline = time.time() + 5
while not handled and time.time() < deadline:
    time.sleep(0.01)
print(len(watcher), len(new), sum(map(blocks, new)), handled)
"""


def test_routed_signals_are_named_in_the_order_they_came(monkeypatch):
    """CI once stopped a run "by SIGINT" that had been sent SIGTERM, then SIGINT 50 ms later: with both pending in
    the main thread, Python runs SIGINT's handler first. The watcher's record of arrivals names them."""
    from podracer import signals

    monkeypatch.setattr(signals, "_routed", collections.deque([signal.SIGTERM, signal.SIGINT]))  # as they came
    assert [signals.arrived(signal.SIGINT), signals.arrived(signal.SIGTERM)] == ["SIGTERM", "SIGINT"]
    assert signals.arrived(signal.SIGINT) == "SIGINT"  # nothing routed (a notebook): the handler's own signal


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_signals_never_land_on_xla_threads_and_reach_the_main_thread():
    # A SIGTERM that the kernel handed to an XLA worker thread hung `podracer anakin` at startup (7 of 25 tries).
    out = subprocess.run([sys.executable, "-c", ROUTING_PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    watchers, new, blocking, handled = out.stdout.split(maxsplit=3)
    assert watchers == "1" and int(new) >= 2 and blocking == new  # every other thread started since blocks both
    assert handled.strip() == "[True]"  # and the handler ran once, in the main thread


def test_a_run_saved_before_a_knob_existed_resumes_with_its_default(tmp_path, capsys):
    """Upgrading podracer must not strand a preempted run: a knob its checkpoint lacks takes its default."""
    run_dir = str(tmp_path / "run")
    small = ["--preset", "catch_impala", "--num-devices", "1", "--total-env-steps", "4096", "--quiet"]
    assert main(["anakin", *small, "--logdir", run_dir, "--checkpoint-every", "1"]) == 0
    config_path = os.path.join(run_dir, "config.json")
    config = json.load(open(config_path))
    del config["agent_config"]["num_minibatches"]  # as a run from before IMPALA had minibatches
    json.dump(config, open(config_path, "w"))
    for meta in glob.glob(os.path.join(run_dir, "checkpoints", "*", "meta", "metadata")):
        saved = json.load(open(meta))
        del saved["fingerprint"]["agent_config"]["num_minibatches"]
        json.dump(saved, open(meta, "w"))
    steps = sorted(int(step) for step in os.listdir(os.path.join(run_dir, "checkpoints")) if step.isdigit())
    shutil.rmtree(os.path.join(run_dir, "checkpoints", str(steps[-1])))  # as if stopped before the last update
    capsys.readouterr()
    code, out = main(["anakin", "--resume", run_dir]), capsys.readouterr()
    assert code == 0, out.err
    assert "resumed from the checkpoint at update 3" in out.err


def _catch_run(run_dir: str, *flags: str) -> None:
    small = ["--preset", "catch_ppo", "--num-devices", "1", "--total-env-steps", "8192", "--log-interval", "2048"]
    assert main(["anakin", *small, "--logdir", run_dir, "--quiet", *flags]) == 0


@pytest.mark.slow
def test_resume_keeps_the_checkpoint_schedule_and_evaluation_settings(tmp_path, capsys):
    """Issue 35's repro, shortened: a resume (and a resume of that resume) used to fall back to the default
    schedule (only at the end) and to 8 evaluation episodes."""
    run_dir = str(tmp_path / "run")
    _catch_run(run_dir, "--checkpoint-every", "3", "--checkpoint-keep", "5", "--eval-episodes", "0")
    for step in ("6", "8"):  # as if preempted after the checkpoint at update 3
        shutil.rmtree(os.path.join(run_dir, "checkpoints", step))
    capsys.readouterr()
    for _ in range(2):  # a resume, then a resume of the resumed run
        assert main(["anakin", "--resume", run_dir]) == 0
        out = capsys.readouterr()
        assert "eval_return" not in out.out  # --eval-episodes 0 kept: no final evaluation
        saved = json.load(open(os.path.join(run_dir, "config.json")))
        assert saved["checkpoint"] == {"checkpoint_every": 3, "checkpoint_minutes": 0.0, "checkpoint_keep": 5}
        assert saved["evaluation"]["eval_episodes"] == 0
    assert sorted(map(int, os.listdir(os.path.join(run_dir, "checkpoints")))) == [3, 6, 8]  # every 3, and the end

    # A schedule or evaluation flag given again overrides the saved one (they change no learnt number)
    shutil.rmtree(os.path.join(run_dir, "checkpoints", "8"))
    assert main(["anakin", "--resume", run_dir, "--eval-episodes", "2", "--quiet"]) == 0
    assert "eval_return=" in capsys.readouterr().out
    assert json.load(open(os.path.join(run_dir, "config.json")))["evaluation"]["eval_episodes"] == 2


@pytest.mark.slow
def test_a_second_writer_of_a_run_directory_is_refused_naming_the_holder(tmp_path, capsys):
    from podracer.lock import LOCK_FILE, hold_run_directory

    run_dir = str(tmp_path / "run")
    small = ["--preset", "catch_ppo", "--num-devices", "1", "--total-env-steps", "4096", "--quiet"]
    with hold_run_directory(run_dir):  # as a run of another process would
        assert main(["anakin", *small, "--logdir", run_dir]) == 2
        err = capsys.readouterr().err
        assert f"{run_dir} is being written by pid {os.getpid()} on {socket.gethostname()}" in err
        assert not os.path.exists(os.path.join(run_dir, "config.json"))
    with open(os.path.join(run_dir, LOCK_FILE), "w") as f:
        f.write("pid 999999 on a-host-that-died\n")  # a stale lock: its holder is gone, so nothing holds it
    assert main(["anakin", *small, "--logdir", run_dir]) == 0


def test_a_file_system_without_locks_is_warned_about_not_refused(tmp_path, capsys, monkeypatch):
    import fcntl

    from podracer.lock import hold_run_directory

    def no_locks(fd, operation):
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with hold_run_directory(str(tmp_path / "run")):
        pass
    assert "warning: cannot lock" in capsys.readouterr().err


@pytest.mark.slow
def test_a_checkpoint_that_is_a_symbolic_link_is_refused_and_nothing_outside_is_touched(tmp_path, capsys):
    run_dir, outside = str(tmp_path / "run"), str(tmp_path / "elsewhere")
    _catch_run(run_dir, "--checkpoint-every", "2", "--checkpoint-keep", "2", "--eval-episodes", "0")
    newest = os.path.join(run_dir, "checkpoints", "8")
    shutil.move(newest, outside)
    os.symlink(outside, newest)
    before = sorted(os.listdir(outside))
    capsys.readouterr()
    assert main(["anakin", "--resume", run_dir, "--quiet"]) == 2
    assert f"{newest} is a symbolic link" in capsys.readouterr().err
    assert sorted(os.listdir(outside)) == before and os.path.islink(newest)


BASE_CONFIG = {"architecture": "anakin", "agent": "ppo", "env": "catch", "agent_config": {}, "anakin": {}}


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda c: c.pop("anakin"), "has no 'anakin' settings, which every anakin run saves"),
        (lambda c: c.update(agent="dqn"), "agent must be one of ['impala', 'muzero', 'ppo'], got 'dqn'"),
        (lambda c: c["anakin"].update(num_envz=4), "anakin.num_envz is not a setting of AnakinConfig"),
        (lambda c: c.update(processes="2"), "processes must be a positive integer, got '2'"),
        (lambda c: c["agent_config"].update(learning_rate="fast"), "agent_config.learning_rate must be float"),
        (lambda c: c["anakin"].update(num_envs=0), "anakin: --num-envs must be at least 1, got 0"),
        (lambda c: c.update(checkpoint=[]), "checkpoint must be an object of settings, got list"),
    ],
)
def test_a_damaged_config_json_is_refused_naming_the_file_and_the_key(tmp_path, capsys, damage, message):
    from podracer.cli.eval import run_eval

    config = json.loads(json.dumps(BASE_CONFIG))
    damage(config)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["anakin", "--resume", str(tmp_path)]) == 2
    assert f"{path}" in (err := capsys.readouterr().err) and message in err
    assert run_eval([str(tmp_path)]) == 2
    assert f"{path}" in (err := capsys.readouterr().err) and message in err


@pytest.mark.slow
def test_a_checkpoint_that_cannot_be_written_stops_the_run_in_one_line_and_it_resumes(
    tmp_path, capsys, monkeypatch, caplog
):
    """Issue 35's full disk (seen on a 2 MiB tmpfs: tensorstore's RESOURCE_EXHAUSTED, raised as a ValueError, and a
    traceback per orbax writer thread), simulated here so that no mount is needed; issue 49's traces it left
    beside the one line (asyncio's "Event loop is closed" and "Future exception was never retrieved") too."""
    import orbax.checkpoint as ocp

    run_dir = str(tmp_path / "run")
    real_save = ocp.CheckpointManager.save
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)  # what Python would print as a bare traceback

    def full_disk(self, step, *args, **kwargs):
        if step >= 4:
            _what_a_full_disk_leaves_behind()
            raise ValueError('RESOURCE_EXHAUSTED: Error writing "act_key/0.0.0.0": No space left on device')
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", full_disk)
    flags = ["--preset", "catch_ppo", "--num-devices", "1", "--total-env-steps", "8192", "--checkpoint-every", "2"]
    asyncio_level = logging.getLogger("asyncio").level
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            assert main(["anakin", *flags, "--eval-episodes", "0", "--logdir", run_dir, "--quiet"]) == 74
            gc.collect()  # the interpreter's exit would collect the failed writer tasks
    finally:
        logging.getLogger("asyncio").setLevel(asyncio_level)
    err = capsys.readouterr().err
    assert "stopped: could not write the checkpoint at update 4 into" in err and "No space left" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not unraisable and not caplog.records  # neither the closed loop's report nor the unretrieved tasks'
    other = types.SimpleNamespace(exc_value=ValueError("another error"))
    sys.unraisablehook(other)
    assert unraisable == [other]  # any other unraisable error is still reported
    monkeypatch.setattr(ocp.CheckpointManager, "save", real_save)  # space freed
    assert main(["anakin", "--resume", run_dir, "--quiet"]) == 0
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    updates = [r["update"] for r in records]
    assert updates == sorted(set(updates)) and records[-1]["env_steps"] == 8192  # continued from update 2, no gap


def _what_a_full_disk_leaves_behind() -> None:
    """What orbax's failed save leaves, as seen on a full 2 MiB tmpfs: tensorstore's callback into the save's
    closed event loop, reported through ``sys.unraisablehook``, and writer tasks whose error nobody retrieved,
    which asyncio logs when they are collected."""
    sys.unraisablehook(
        types.SimpleNamespace(
            exc_type=RuntimeError,
            exc_value=RuntimeError("Event loop is closed"),
            exc_traceback=None,
            err_msg=None,
            object=None,
        )
    )
    loop = asyncio.new_event_loop()
    task = loop.create_future()
    task.set_exception(ValueError("RESOURCE_EXHAUSTED: No space left on device"))
    cycle = [task]
    cycle.append(cycle)  # freed by the collector, as orbax's are, not at once
    loop.close()


class _SavedBefore(NamedTuple):
    params: jax.Array
    core: tuple


class _StateNow(NamedTuple):  # two fields more, empty in a run that does not use them (Anakin's sweep settings, PBT)
    params: jax.Array
    core: tuple
    hparams: dict
    population: tuple


def test_a_checkpoint_written_before_an_empty_field_existed_still_restores(tmp_path):
    from podracer.checkpoint import Checkpointer, restore

    run_dir = str(tmp_path / "run")
    params = jax.numpy.arange(6.0).reshape(2, 3)
    Checkpointer(run_dir, {"a": 1}).save(4, _SavedBefore(params, ()), {"update": 4})
    state, counters = restore(run_dir, _StateNow(jax.numpy.zeros((2, 3)), (), {}, ()), {"a": 1})
    assert isinstance(state, _StateNow) and counters == {"update": 4}
    np.testing.assert_array_equal(state.params, params)
    assert state.hparams == {} and state.population == ()
    with pytest.raises(Exception, match="do not match"):  # a field with arrays the checkpoint lacks is not made up
        restore(run_dir, _StateNow(params, (), {"lr": jax.numpy.zeros(2)}, ()), {"a": 1}, repair=False)
