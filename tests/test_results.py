"""The results suites: run by run, resumable, reused when finished, and the page written from their numbers."""

import dataclasses
import json
import os

import numpy as np
import pytest

from experiments import results
from experiments.peer_purejaxrl import window_means
from experiments.suites import SUITES, Entry, Reference, Suite
from podracer.agents.impala import ImpalaConfig
from podracer.cli.presets import ANAKIN_PRESETS, SEBULBA_PRESETS

pytestmark = pytest.mark.lab  # tests of experiments/, the lab tools


def test_every_suite_entry_names_a_preset_of_its_agent():
    presets = {"anakin": ANAKIN_PRESETS, "sebulba": SEBULBA_PRESETS}
    for name, suite in SUITES.items():
        for entry in suite.entries:
            preset = presets[entry.architecture][entry.preset]
            assert preset["agent"] == entry.agent, (name, entry.name)
    names = [entry.name for suite in SUITES.values() for entry in suite.entries]
    assert len(names) == len(set(names)), "run directories would collide"


def test_an_entrys_own_flags_are_shown_beside_its_preset_and_the_cpu_split_is_not():
    minibatches = next(e for e in SUITES["atari"].entries if e.variant == "4mb")
    summary = {"flags": list(minibatches.flags)}
    assert minibatches.name == "sebulba-impala-pong-v5-4mb"
    assert results._shown_flags(summary, " ") == " --num-minibatches 4 --vtrace-lambda 0.95"
    assert results._shown_flags({"flags": ["--cpu-devices", "2"]}, " ") == ""


def test_purejaxrl_windows_average_the_episodes_that_ended_in_them():
    returns = np.zeros((2, 4, 1, 1))  # [seeds, updates, steps, envs]
    ended = np.zeros((2, 4, 1, 1), bool)
    returns[0, :, 0, 0], ended[0, :, 0, 0] = [1, 3, 5, 7], [True, True, False, True]
    returns[1, 1, 0, 0], ended[1, 1, 0, 0] = 10, True
    updates, means = window_means(returns, ended, 2)
    assert updates.tolist() == [2, 4]
    assert means[:, 0].tolist() == [2.0, 7.0]  # (1 + 3) / 2; only the last update of window 2 ended
    assert means[0, 1] == 10.0 and np.isnan(means[1, 1])  # seed 1 ended no episode in window 2


def test_the_verdict_compares_the_interval_with_the_reference():
    entry = {
        "reference": {"value": 10.0, "source": "x"},
        "eval": None,
        "train": {"final": {"point": 8.0, "low": 7.0, "high": 9.0}},
    }
    assert results._verdict(entry).startswith("below the reference by 2")
    entry["train"]["final"]["high"] = 11.0
    assert results._verdict(entry).startswith("below by 2 in the mean; the interval reaches it")
    entry["train"]["final"]["point"] = 10.0
    assert results._verdict(entry) == "reaches the reference"
    entry["eval"] = {"point": [5.0], "low": [4.0], "high": [6.0]}  # an evaluation, where there is one, decides
    assert results._verdict(entry).startswith("below the reference by 5")
    entry["reference"]["of"] = "training"  # unless the reference is a training curve
    assert results._verdict(entry) == "reaches the reference"
    assert results._reference_cell(entry["reference"]) == "10 (x; against the training return)"
    with pytest.raises(ValueError, match="evaluation' or 'training"):
        Reference(1.0, "x", of="greedy")


def test_bad_flags_are_refused_and_the_page_lists_suites_not_run(tmp_path, capsys):
    with pytest.raises(SystemExit):
        results.main(["--suite", "classic", "--max-minutes", "0"])
    assert "--max-minutes must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        results.main(["--suite", "minatar", "--purejaxrl", str(tmp_path)])
    assert "no purejaxrl/ppo.py there" in capsys.readouterr().err
    assert results.main(["--page-only", "--docs", str(tmp_path)]) == 0
    page = open(tmp_path / "results.md").read()
    assert all(f"Not run yet: `python experiments/results.py --suite {name}`" in page for name in SUITES)


@pytest.mark.slow
def test_a_stopped_suite_continues_and_a_finished_run_is_reused(tmp_path, monkeypatch, capsys):
    tiny = Suite(
        about="a tiny suite",
        entries=(
            Entry(
                "anakin",
                "catch_ppo",
                "ppo",
                "catch",
                60_000,
                seeds=2,
                evaluations=2,
                reference=Reference(1.0, "the maximum"),
            ),
        ),
    )
    monkeypatch.setattr(results, "SUITES", {"tiny": tiny})
    runs, docs = str(tmp_path / "runs"), str(tmp_path / "docs")
    run_dir = os.path.join(runs, "tiny", "anakin-ppo-catch-seed0")

    # Stopped a second in: in the middle of starting (import, compile) -- it must go on from there.
    assert results.run_suite("tiny", runs, docs, max_minutes=1 / 60) == results.STOPPED
    state = json.load(open(os.path.join(run_dir, results.STATE_FILE)))
    assert not state["finished"] and len(state["segments"]) == 1
    assert "Not finished yet" in open(os.path.join(docs, "results.md")).read()

    assert results.run_suite("tiny", runs, docs) == 0
    state = json.load(open(os.path.join(run_dir, results.STATE_FILE)))
    assert state["finished"] and len(state["segments"]) == 2
    data = json.load(open(os.path.join(docs, "results", "tiny.json")))
    (entry,) = data["entries"]
    assert entry["segments"] == 3 and entry["train"]["env_steps"][-1] >= 60_000  # seed 0 in two, seed 1 in one
    assert len(entry["train"]["final"]["per_run"]) == 2  # both seeds
    assert json.load(open(os.path.join(runs, "tiny", "anakin-ppo-catch-seed1", results.STATE_FILE)))["finished"]
    # Both evaluations of each run, averaged over the seeds: Catch returns, wherever 60k steps have got to.
    assert entry["eval"] is not None and entry["eval"]["env_steps"] == [30_720, 60_416]
    assert all(-1.0 <= point <= 1.0 for point in entry["eval"]["point"])
    page = open(os.path.join(docs, "results.md")).read()
    assert "| ppo | anakin | `catch` | `catch_ppo` | 60,000 | 2 |" in page and "in 3 segments" in page
    assert os.path.getsize(os.path.join(docs, "results", "tiny-catch.png")) > 10_000

    capsys.readouterr()
    assert results.run_suite("tiny", runs, docs) == 0  # nothing left to train
    assert "finished earlier: reused" in capsys.readouterr().out
    assert len(json.load(open(os.path.join(run_dir, results.STATE_FILE)))["segments"]) == 2


FAKE_PUREJAXRL = '''
import os

import jax.numpy as jnp


def make_train(config):
    """Stands in for PureJaxRL's make_train: every episode returns 7; each call is counted in $FAKE_CALLS."""
    config["NUM_UPDATES"] = config["TOTAL_TIMESTEPS"] // config["NUM_STEPS"] // config["NUM_ENVS"]
    with open(os.environ["FAKE_CALLS"], "a") as f:
        f.write("call\\n")

    def train(rng):
        shape = (config["NUM_UPDATES"], 2, 3)  # [updates, steps, envs]
        return {"metrics": {"returned_episode_returns": jnp.full(shape, 7.0), "returned_episode": jnp.ones(shape, bool)}}

    return train
'''


def test_purejaxrl_runs_beside_a_finished_suite_and_is_reused(tmp_path, monkeypatch):
    checkout = tmp_path / "purejaxrl"
    (checkout / "purejaxrl").mkdir(parents=True)
    (checkout / "purejaxrl" / "ppo.py").write_text(FAKE_PUREJAXRL)
    calls = tmp_path / "calls"
    monkeypatch.setenv("FAKE_CALLS", str(calls))
    steps = 64 * 128 * 100  # 100 updates of PureJaxRL's MinAtar batch
    tiny = Suite(
        about="a tiny suite",
        entries=(Entry("anakin", "minatar_ppo", "ppo", "gymnax:Breakout-MinAtar", steps, seeds=3, purejaxrl=True),),
    )
    monkeypatch.setattr(results, "SUITES", {"tiny": tiny})
    monkeypatch.setattr(results, "run_to_end", lambda *args: True)  # podracer's own runs are not what this checks
    docs = str(tmp_path / "docs")
    assert results.run_suite("tiny", str(tmp_path / "runs"), docs, purejaxrl=str(checkout)) == 0
    peer = json.load(open(os.path.join(docs, "results", "tiny.json")))["peers"]["gymnax:Breakout-MinAtar"]
    assert peer["seeds"] == 3 and peer["steps"] == steps and peer["env_steps"][-1] == steps
    assert peer["final"]["per_run"] == [7.0, 7.0, 7.0]
    assert "| PureJaxRL PPO |" in open(os.path.join(docs, "results.md")).read()
    assert calls.read_text().count("call") == 1  # one compiled program for the three seeds

    assert results.run_suite("tiny", str(tmp_path / "runs"), docs, purejaxrl=str(checkout)) == 0
    assert calls.read_text().count("call") == 1  # the peer run at this budget was reused


SIGTERMED_SUITE = """
import sys

from experiments import results
from experiments.suites import Entry, Suite

results.SUITES = {"long": Suite(about="one run far longer than the test", entries=(
    Entry("anakin", "catch_ppo", "ppo", "catch", 10**9, seeds=1),))}
sys.exit(results.main(["--suite", "long", "--runs-dir", sys.argv[1], "--docs", sys.argv[2]]))
"""


@pytest.mark.slow
def test_a_sigterm_to_the_suite_alone_stops_its_run_with_a_checkpoint(tmp_path):
    """`kill`, `timeout` and schedulers signal the suite's process only: the run it started must stop too."""
    import signal
    import subprocess
    import sys

    runs, docs = tmp_path / "runs", tmp_path / "docs"
    suite = subprocess.Popen(
        [sys.executable, "-c", SIGTERMED_SUITE, str(runs), str(docs)],
        cwd=results.ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in suite.stdout:  # the run is training once it has compiled
        if line.startswith("compiled in"):
            break
    suite.send_signal(signal.SIGTERM)
    output = suite.communicate(timeout=120)[0]
    assert suite.returncode == 143, output
    assert "stopped by SIGTERM; run the same command to continue" in output
    run_dir = runs / "long" / "anakin-ppo-catch-seed0"
    state = json.load(open(run_dir / results.STATE_FILE))
    assert state["segments"][-1]["exit_code"] == 143 and not state["finished"]  # the run itself stopped cleanly
    assert (run_dir / "checkpoints").is_dir()


def _fake_summary(entry: Entry, final: float) -> dict:
    """What ``summarise`` records for ``entry``, with a flat training curve at ``final``."""
    curve = {
        "env_steps": [0, entry.steps],
        "point": [final, final],
        "low": [final, final],
        "high": [final, final],
        "seconds": [0.0, 1.0],
        "final": {"point": final, "low": final, "high": final, "per_run": [final]},
    }
    return {
        "name": entry.name,
        "architecture": entry.architecture,
        "agent": entry.agent,
        "env": entry.env,
        "preset": entry.preset,
        "preset_settings": results.preset_settings(entry),
        "flags": list(entry.flags),
        "seeds": entry.seeds,
        "steps": entry.steps,
        "frame_skip": entry.frame_skip,
        "reference": None,
        "train": curve,
        "eval": None,
        "wall_seconds": 1.0,
        "compile_seconds": 1.0,
        "train_seconds": 1.0,
        "sps": 1,
        "runs": entry.seeds,
        "segments": entry.seeds,
        "measured": "today",
    }


def test_only_trains_the_named_entry_and_recorded_numbers_outlive_missing_runs(tmp_path, monkeypatch):
    """A fresh checkout has no run directories: the page must keep what was measured, unless its definition changed."""
    kept = Entry("anakin", "catch_ppo", "ppo", "catch", 1000, seeds=1, reference=Reference(1.0, "corrected"))
    trained = Entry("anakin", "catch_impala", "impala", "catch", 1000, seeds=1)
    changed = Entry("anakin", "cartpole_ppo", "ppo", "cartpole", 1000, seeds=1)
    monkeypatch.setattr(results, "SUITES", {"tiny": Suite(about="a tiny suite", entries=(kept, trained, changed))})
    docs = tmp_path / "docs"
    (docs / "results").mkdir(parents=True)
    recorded = [_fake_summary(kept, 0.5), _fake_summary(trained, 0.1), _fake_summary(changed, 0.3)]
    for summary in recorded:
        summary["measured"] = "long ago"
    recorded[2]["preset_settings"]["agent_config"]["learning_rate"] = 1.0  # its preset has changed since
    recorded[0]["preset_settings"]["host_env"] = {}  # a part that sets nothing: the same preset
    recorded[0]["reference"] = {"value": 4.0, "source": "misread"}  # a reference corrected since
    (docs / "results" / "tiny.json").write_text(
        json.dumps(
            {"measured": "long ago", "names": [kept.name, trained.name, changed.name], "entries": recorded, "peers": {}}
        )
    )
    trained_runs = []

    def fake_run(entry, seed, run_dir, deadline):
        trained_runs.append(entry.name)
        os.makedirs(run_dir)
        results._save_run_state(run_dir, {"segments": [{"wall_seconds": 1.0, "exit_code": 0}], "finished": True})
        return True

    monkeypatch.setattr(results, "run_to_end", fake_run)
    monkeypatch.setattr(results, "summarise", lambda entry, run_dirs: _fake_summary(entry, 0.9))
    with pytest.raises(SystemExit):
        results.main(["--suite", "tiny", "--only", "anakin-ppo-nope", "--docs", str(docs)])
    assert (
        results.main(
            ["--suite", "tiny", "--only", trained.name, "--docs", str(docs), "--runs-dir", str(tmp_path / "runs")]
        )
        == 0
    )
    assert trained_runs == [trained.name]
    entries = json.loads((docs / "results" / "tiny.json").read_text())["entries"]
    assert entries[0]["train"]["final"]["point"] == 0.5 and entries[0]["measured"] == "long ago"
    assert entries[0]["reference"] == {"value": 1.0, "source": "corrected", "of": "evaluation"}
    assert entries[1]["train"]["final"]["point"] == 0.9
    assert entries[2] is None
    page = (docs / "results.md").read_text()
    assert "Recorded by an earlier call and kept" in page and f"{kept.name} (measured long ago)" in page
    assert f"Not finished yet (run the command again to continue): {changed.name}" in page


def test_a_setting_that_moved_between_the_preset_and_the_flags_keeps_the_recorded_numbers():
    """A preset that takes a new value while the entry's flag keeps the old one defines the same runs."""
    entry = Entry("sebulba", "atari_impala", "impala", "Pong-v5", 1000, seeds=1, flags=("--vtrace-lambda", "0.5"))
    summary = _fake_summary(dataclasses.replace(entry, flags=("--cpu-devices", "2")), 0.7)
    summary["preset_settings"]["agent_config"]["vtrace_lambda"] = 0.5  # the preset set it when it ran
    old = {"names": [entry.name], "entries": [summary]}
    kept = results._recorded(entry, old)
    assert kept["train"]["final"]["point"] == 0.7 and kept["flags"] == list(entry.flags)  # labelled as today's
    summary["preset_settings"]["agent_config"]["vtrace_lambda"] = 0.25  # it ran with another value
    assert results._recorded(entry, old) is None
    summary["preset_settings"]["agent_config"]["vtrace_lambda"] = 0.5
    summary["flags"] = ["--envs-per-thread", "64"]  # a setting of the Sebulba group that the preset leaves as 32
    assert results._recorded(entry, old) is None


def test_recorded_settings_outlive_a_change_of_the_defaults():
    """A summary keeps the settings its runs trained with: a default changed since does not rewrite its past."""
    entry = Entry("sebulba", "atari_impala", "impala", "Pong-v5", 1000, seeds=1, flags=("--clip-rho", "0.5"))
    summary = _fake_summary(dataclasses.replace(entry, flags=()), 0.7)  # its flags and preset say nothing of it
    then = results.run_settings(entry.architecture, entry.agent, summary["preset_settings"], entry.flags)
    old = {"names": [entry.name], "entries": [{**summary, "settings": then}]}  # but 0.5 was the default then
    kept = results._recorded(entry, old)
    assert kept["train"]["final"]["point"] == 0.7 and kept["settings"]["agent_config"]["clip_rho"] == 0.5
    assert results._recorded(dataclasses.replace(entry, flags=()), old) is None  # today's default is not 0.5
    backfilled = results._recorded(dataclasses.replace(entry, flags=()), {"names": [entry.name], "entries": [summary]})
    assert backfilled["settings"]["agent_config"]["clip_rho"] == ImpalaConfig().clip_rho  # recorded from now on


def test_rewriting_the_page_keeps_the_sections_other_scripts_wrote(tmp_path):
    (tmp_path / "results").mkdir()
    extra = "# Population-based training on cartpole\n\nPBT's population mean beats the best fixed member.\n"
    (tmp_path / "results.md").write_text("# Results\n\nold suites\n\n" + extra)
    page = results.write_page(str(tmp_path))
    text = open(page).read()
    assert text.endswith(extra) and "old suites" not in text
    assert text.count("# Population-based training on cartpole") == 1


def test_page_only_applies_the_suites_definitions_of_today_to_recorded_numbers(tmp_path, monkeypatch):
    kept = Entry("anakin", "catch_ppo", "ppo", "catch", 1000, seeds=1, reference=Reference(2.0, "now", of="training"))
    dropped = Entry("anakin", "catch_impala", "impala", "catch", 1000, seeds=1)
    (tmp_path / "results").mkdir()
    old = {"measured": "then", "names": [dropped.name, kept.name], "peers": {}}
    old["entries"] = [_fake_summary(dropped, 0.1), _fake_summary(kept, 0.5)]
    (tmp_path / "results" / "tiny.json").write_text(json.dumps(old))
    monkeypatch.setattr(results, "SUITES", {"tiny": Suite(about="a tiny suite", entries=(kept,))})
    assert results.main(["--page-only", "--docs", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "results" / "tiny.json").read_text())
    assert data["names"] == [kept.name] and data["measured"] == "then"
    assert data["entries"][0]["reference"] == {"value": 2.0, "source": "now", "of": "training"}
    assert data["entries"][0]["train"]["final"]["point"] == 0.5
    page = (tmp_path / "results.md").read_text()
    assert "catch_impala" not in page and "below the reference by 1.5" in page


def test_short_runs_beside_long_ones_get_a_panel_of_their_own(tmp_path):
    long, short = (Entry("anakin", "catch_ppo", "ppo", "catch", steps, seeds=1) for steps in (3_000_000, 300_000))
    assert results._zoom_limit([_fake_summary(long, 0.5), _fake_summary(short, 0.5)]) == 300_000 * 1.05
    near = Entry("anakin", "catch_ppo", "ppo", "catch", 1_500_000, seeds=1)  # over a third of the longest
    assert results._zoom_limit([_fake_summary(long, 0.5), _fake_summary(near, 0.5)]) is None
    out = tmp_path / "zoomed.png"
    results.plot_env("tiny", "catch", [_fake_summary(long, 0.5), _fake_summary(short, 0.7)], {}, str(out))
    assert out.stat().st_size > 10_000
