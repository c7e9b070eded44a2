"""`podracer eval`: the README's first run evaluated from its checkpoint, a video that decodes, clear refusals."""

import json
import os
import shutil
import subprocess
import sys

import imageio.v2 as imageio
import pytest

from podracer.cli.main import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _podracer(*args):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the run's own device count, not the tests'
    return subprocess.run(
        [sys.executable, "-m", "podracer.cli.main", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("eval") / "cartpole")
    out = _podracer(
        "anakin", "--total-env-steps", "30000", "--logdir", run_dir, "--quiet"
    )  # the README's first command, shorter
    assert out.returncode == 0, out.stderr[-2000:]
    return run_dir


@pytest.mark.slow
def test_eval_prints_the_score_and_writes_a_video_that_decodes(trained_run):
    video = os.path.join(trained_run, "play.gif")
    out = _podracer("eval", trained_run, "--episodes", "4", "--video", video)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "over 4 episodes" in out.stdout and "EVAL return=" in out.stdout
    score = float(out.stdout.split("EVAL return=")[1].split()[0])
    frames = imageio.mimread(video, memtest=False)
    assert len(frames) >= 10 and frames[0].shape == (240, 480, 3) and frames[0].std() > 0
    written = int(out.stdout.split("frames)")[0].rsplit("(", 1)[1])
    assert 9 <= score <= 500 and 10 <= len(frames) <= written  # a GIF writer may merge repeated frames


@pytest.mark.slow
def test_eval_refuses_bad_input_in_one_line(trained_run, tmp_path, capsys):
    unfinished = str(tmp_path / "unfinished")
    os.makedirs(unfinished)
    shutil.copy(os.path.join(trained_run, "config.json"), unfinished)
    cases = [
        ((str(tmp_path / "missing"),), "no config.json there"),
        ((unfinished,), "holds no checkpoint yet"),
        ((trained_run, "--checkpoint", "7"), "has no checkpoint at update 7; it has"),
        ((trained_run, "--video", str(tmp_path / "no" / "such" / "dir" / "v.gif")), "cannot write into"),
        ((trained_run, "--video", str(tmp_path / "v.avi")), "name a .gif or an .mp4"),
        ((trained_run, "--episodes", "0"), "--episodes must be at least 1"),
        ((trained_run, "--max-steps", "-1"), "--max-steps must be at least 0"),
        ((trained_run, "--episodes", "2", "--max-steps", "5"), "no episode of 2 ended within --max-steps 5 steps"),
    ]
    for i, (args, message) in enumerate(cases):
        if i in (0, 4, 5, 6):  # refused before the run is rebuilt: in this process (each start costs seconds)
            code, err = main(["eval", *args]), capsys.readouterr().err
        else:
            out = _podracer("eval", *args)
            code, err = out.returncode, out.stderr
        assert code == 2 and message in err, (args, err[-2000:])
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert json.load(open(os.path.join(trained_run, "config.json")))["env"] == "cartpole"


@pytest.mark.slow
def test_eval_of_a_run_being_written_reads_its_newest_complete_checkpoint_and_touches_nothing(trained_run, tmp_path):
    """A run writing a checkpoint has an unfinished save folder beside its complete ones: eval reads the newest
    complete one and leaves the run's folders as they are (the run, not eval, tidies up)."""
    run_dir = str(tmp_path / "being-written")
    shutil.copytree(trained_run, run_dir)
    checkpoints = os.path.join(run_dir, "checkpoints")
    newest = max(int(name) for name in os.listdir(checkpoints) if name.isdigit())
    saving = os.path.join(checkpoints, f"{newest + 1}.orbax-checkpoint-tmp")  # as seen beside a run that saves
    shutil.copytree(os.path.join(checkpoints, str(newest)), saving)
    before = sorted(os.listdir(checkpoints))
    out = _podracer("eval", run_dir, "--episodes", "2")
    assert out.returncode == 0 and f"update={newest}" in out.stdout, out.stderr[-2000:]
    assert sorted(os.listdir(checkpoints)) == before


def test_pictures_for_videos_of_anakin_environments():
    import jax

    from podracer import envs
    from podracer.envs.render import draw

    for name, shape in (("catch", (240, 120, 3)), ("cartpole", (240, 480, 3)), ("gymnax:Breakout-MinAtar", None)):
        env = envs.make(name)
        state, _ = env.reset(jax.random.key(0))
        states = [state.env_state]
        for _ in range(3):
            state, _ = env.step(state, jax.numpy.int32(1))
            states.append(state.env_state)
        frames = draw(env.env, jax.device_get(states))
        assert len(frames) == 4 and frames[0].dtype == "uint8" and frames[0].ndim == 3
        assert shape is None or frames[0].shape == shape
        assert any((a != b).any() for a, b in zip(frames, frames[1:]))  # the pictures follow the states
    with pytest.raises(ValueError, match="no pictures are drawn for BraxEnv"):
        draw(envs.make("brax:inverted_pendulum").env, [None])
