"""Issue 49's hostile round: bad --sweep and PBT settings, damaged or hostile preset files, unwritable --save paths.

Each case is refused in one line on stderr with exit code 2, before anything compiles, and leaves no run
directory behind (docs/guarantees.md lists them all, with what each gets).
"""

import json
import os

import pytest

from podracer.cli import trials
from podracer.cli.main import main

SMALL = ["--preset", "catch_ppo", "--num-devices", "1", "--total-env-steps", "4096", "--quiet"]
SWEEP = ["--sweep", "learning_rate=1e-3,3e-3"]
GOOD_PRESET = {
    "architecture": "anakin",
    "about": "a preset file",
    "agent": "ppo",
    "env": "catch",
    "anakin": {"num_envs": 8, "rollout_len": 8, "total_env_steps": 1024},
    "agent_config": {},
}
CODE = "__import__('os').system('touch PWNED')"


def _refused(argv: list[str], capsys) -> str:
    """Runs the command; asserts exit code 2 and a single line on stderr; returns that line."""
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's refusals
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--sweep"], "argument --sweep: expected at least one argument"),
        (["--sweep", ""], "write NAME=VALUE,VALUE,..."),
        (["--sweep", "learning_rate=1e-3,1e-3"], "a value appears twice"),
        (["--sweep", "learning_rate=1e-3", "learning_rate=3e-3"], "a setting is named twice"),
        (["--sweep", "no_such=1,2"], "the agent has no setting 'no_such'"),
        (["--sweep", "learning_rate=abc"], "the values must be numbers"),
        (["--sweep", "learning_rate=nan"], "the values must be finite"),
        (["--sweep", "learning_rate=-1,1e-3"], "--learning-rate must be positive"),
        (["--sweep", "num_epochs=1,2"], "--num-epochs decides the program's shapes"),
        ([*SWEEP, "--pbt-interval", "-5"], "--pbt-interval must be at least 0"),
        ([*SWEEP, "--pbt-interval", "nan"], "argument --pbt-interval: invalid int value: 'nan'"),
        ([*SWEEP, "--pbt-interval", "1024", "--pbt-quantile", "0"], "--pbt-quantile must be above 0"),
        ([*SWEEP, "--pbt-interval", "1024", "--pbt-quantile", "1"], "--pbt-quantile must be at most 0.5"),
        ([*SWEEP, "--pbt-interval", "1024", "--pbt-quantile", "nan"], "--pbt-quantile must be a finite number"),
        ([*SWEEP, "--pbt-interval", "1024", "--pbt-factor", "1"], "--pbt-factor must be above 1"),
        ([*SWEEP, "--pbt-interval", "1024", "--pbt-factor", "0.5"], "--pbt-factor must be at least 1.0"),
        ([*SWEEP, "--pbt-interval", "1024", "--pbt-factor", "inf"], "--pbt-factor must be a finite number"),
        (["--pbt-interval", "1024"], "--pbt-interval trains a population: the agents of a --sweep"),
        ([*SWEEP, "--pbt-interval", "100000"], "no PBT step would happen"),
    ],
)
def test_bad_sweeps_and_populations_are_refused_in_one_line(flags, message, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert message in _refused(["anakin", *SMALL, *flags, "--logdir", str(run_dir)], capsys)
    assert not run_dir.exists()


def _write(path, content) -> str:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


PRESET_FILES = {
    "truncated": (json.dumps(GOOD_PRESET)[:40], "not a preset file (Unterminated string"),
    "empty": ("", "not a preset file (Expecting value"),
    "binary": (bytes(range(256)), "not a preset file"),
    "nested lists": ("[" * 100_000 + "]" * 100_000, "its JSON is nested too deeply"),
    "nested objects": ('{"a":' * 100_000 + "1" + "}" * 100_000, "its JSON is nested too deeply"),
    "50 MB": ('{"about": "' + "x" * 50_000_000 + '"}', "over 1 MiB, so not a preset file"),
    "a list": ("[1, 2]", "not an anakin preset (it says None)"),
    "another architecture": (json.dumps({**GOOD_PRESET, "architecture": "sebulba"}), "not an anakin preset"),
    "code as the agent": (json.dumps({**GOOD_PRESET, "agent": CODE}), "agent must be one of"),
    "an object as the agent": (json.dumps({**GOOD_PRESET, "agent": {}}), "agent must be one of"),
    "code as the env": (json.dumps({**GOOD_PRESET, "env": CODE}), "unknown environment"),
    "code as a value": (json.dumps({**GOOD_PRESET, "anakin": {"num_envs": CODE}}), "anakin.num_envs must be int"),
    "code as a key": (json.dumps({**GOOD_PRESET, "anakin": {"__class__": 1}}), "is not a setting of AnakinConfig"),
    "code as a list": (json.dumps({**GOOD_PRESET, "agent_config": {"hidden_sizes": CODE}}), "must be a list of"),
    "a word as a group": (json.dumps({**GOOD_PRESET, "anakin": "oops"}), "anakin must be an object of settings"),
    "a huge number": (json.dumps({**GOOD_PRESET, "anakin": {"num_envs": 1e300}}), "anakin.num_envs must be int"),
    "NaN": (json.dumps({**GOOD_PRESET, "anakin": {"num_envs": float("nan")}}), "anakin.num_envs must be int"),
    "no agent settings": (json.dumps({k: v for k, v in GOOD_PRESET.items() if k != "agent_config"}), "no 'agent_"),
}


@pytest.mark.parametrize("case", sorted(PRESET_FILES))
def test_damaged_and_hostile_preset_files_are_refused_in_one_line_and_never_run(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where the code in the file would leave PWNED
    content, message = PRESET_FILES[case]
    path = _write(tmp_path / "preset.json", content)
    run_dir = tmp_path / "run"
    assert message in _refused(["anakin", "--preset", path, "--num-devices", "1", "--logdir", str(run_dir)], capsys)
    assert not run_dir.exists() and not (tmp_path / "PWNED").exists()


def test_a_missing_preset_file_is_refused_in_one_line(tmp_path, capsys):
    assert "cannot read it (No such file or directory)" in _refused(
        ["sebulba", "--preset", str(tmp_path / "none.json")], capsys
    )


TUNE = ["tune", "--architecture", "anakin", "--preset", "catch_ppo", "--cpu-devices", "1"]


@pytest.mark.parametrize(
    "where, message",
    [
        ("missing/x.json", "cannot write into"),
        ("folder.json", "that is a directory"),
        ("x.txt", "--save takes a path ending in .json"),
    ],
)
def test_tune_refuses_a_save_path_it_cannot_write_before_any_trial(where, message, tmp_path, capsys, monkeypatch):
    (tmp_path / "folder.json").mkdir()
    monkeypatch.setattr(trials, "measure", lambda *args: pytest.fail("a trial ran"))
    assert message in _refused([*TUNE, "--save", str(tmp_path / where)], capsys)


def test_tune_refuses_a_read_only_folder_before_any_trial(tmp_path, capsys, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr("tempfile.NamedTemporaryFile", read_only)
    monkeypatch.setattr(trials, "measure", lambda *args: pytest.fail("a trial ran"))
    assert "(Read-only file system)" in _refused([*TUNE, "--save", str(tmp_path / "x.json")], capsys)


def test_a_tune_whose_disk_filled_says_so_in_one_line_and_leaves_no_half_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(trials, "measure", lambda command, seconds: (100.0 + len(command), 1.0))
    real_fsync = os.fsync

    def full_disk(fd):
        real_fsync(fd)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    saved = tmp_path / "tuned.json"
    assert main([*TUNE, "--trial-seconds", "0.01", "--save", str(saved)]) == 74
    err = capsys.readouterr().err
    assert err == f"podracer tune: error: could not write --save {saved} (No space left on device)\n"
    assert os.listdir(tmp_path) == []  # neither the preset nor its temporary file


def _lock_as(kind: str, path) -> None:
    """Puts a ``kind`` where a run directory's lock file goes."""
    if kind == "a symbolic link":
        os.symlink(path.parent.parent / "victim.txt", path)
    elif kind == "a directory":
        path.mkdir()
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("kind", ["a symbolic link", "a directory", "a FIFO"])
def test_a_lock_replaced_by_something_else_is_refused_and_nothing_it_points_to_is_written(kind, tmp_path):
    from podracer.errors import RunDirectoryError
    from podracer.lock import LOCK_FILE, hold_run_directory

    victim = tmp_path / "victim.txt"
    victim.write_text("not podracer's")
    (tmp_path / "run").mkdir()
    _lock_as(kind, tmp_path / "run" / LOCK_FILE)
    expected = "is not a regular file" if kind == "a FIFO" else f"is {kind}"
    with pytest.raises(RunDirectoryError, match=expected), hold_run_directory(str(tmp_path / "run")):
        pytest.fail("the lock was taken")
    assert victim.read_text() == "not podracer's"  # a link was not followed (the run writes its pid into the lock)


def test_a_run_refused_for_a_held_lock_does_not_delete_the_directory_of_the_run_that_holds_it(tmp_path):
    """Two starts 10 ms apart: each saw no run directory, so each counts it as made by itself; the one refused
    must not remove it while the other, still compiling, holds it with nothing else written there yet."""
    from podracer.cli.main import _discard_if_unused
    from podracer.lock import hold_run_directory

    run_dir = str(tmp_path / "run")
    with hold_run_directory(run_dir):
        _discard_if_unused(run_dir, made_here=True)
        assert os.path.isdir(run_dir)
    _discard_if_unused(run_dir, made_here=True)  # once nobody holds it, the refused run's leftovers go
    assert not os.path.exists(run_dir)


RECORD = {"env_steps": 64, "episode_return": 1.0, "time": 0.5}
METRICS = {
    "empty": (b"", "logged no 'episode_return' yet"),
    "garbage": (b"garbage{{\n", "line 1, its only one, is not a JSON record"),
    "binary": (bytes(range(128, 256)) * 8, "cannot read it as podracer's records ('utf-8' codec"),
    "a directory": (None, "cannot read it as podracer's records ([Errno 21] Is a directory"),
    "not objects": (b"[1, 2]\n", "record 1 is not a JSON object"),
    "words for numbers": (b'{"env_steps": "a", "episode_return": "b", "time": "c"}\n', "are not all numbers"),
    "no steps": (b'{"episode_return": 1.0}\n', "its records' env_steps are not all numbers"),
    "garbage between records": (f"{json.dumps(RECORD)}\nnot json\n{json.dumps(RECORD)}\n".encode(), "line 2 is not"),
}


@pytest.mark.parametrize("aggregate", ["none", "iqm"])
@pytest.mark.parametrize("case", sorted(METRICS))
def test_plot_refuses_empty_and_garbage_metrics_in_one_line(case, aggregate, tmp_path, capsys):
    content, message = METRICS[case]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if content is None:
        (run_dir / "metrics.jsonl").mkdir()
    else:
        (run_dir / "metrics.jsonl").write_bytes(content)
    out = tmp_path / "plot.png"
    assert message in _refused(["plot", str(run_dir), "--aggregate", aggregate, "--out", str(out)], capsys)
    assert not out.exists()


@pytest.mark.parametrize("out, message", [("missing/plot.png", "No such file"), ("plot.txt", "Format 'txt'")])
def test_plot_refuses_an_out_it_cannot_write_in_one_line(out, message, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps(RECORD) + "\n")
    err = _refused(["plot", str(run_dir), "--out", str(tmp_path / out)], capsys)
    assert f"--out {tmp_path / out}: cannot write the figure there" in err and message in err


def test_plot_of_a_run_being_written_drops_its_torn_last_line_with_a_warning(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps(RECORD) + '\n{"env_st')
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "plot.png")]) == 0
    assert "dropped its torn last line 2" in capsys.readouterr().err and (tmp_path / "plot.png").exists()
