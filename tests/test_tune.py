"""podracer tune: its candidate layouts, the preset it picks, the preset file it writes, and a short run of it."""

import json
import sys

import pytest

from podracer.cli import trials
from podracer.cli.main import main
from podracer.cli.presets import ANAKIN_PRESETS, SEBULBA_PRESETS, read_preset_file
from podracer.cli.tune import choose_preset
from podracer.sebulba.config import SebulbaConfig, check_layout, geometry, topology


def test_sebulba_layouts_keep_the_environments_per_actor_device():
    settings = SEBULBA_PRESETS["atari_impala"]["fit"](2, 8)["sebulba"]  # 2 threads x 32 envs on this host shape
    candidates = trials.sebulba_candidates(settings, devices=2, cpu_count=8)
    assert candidates[0] == {}  # the preset's own layout first
    per_device = settings["actor_threads"] * settings["envs_per_thread"]
    for c in candidates[1:]:
        assert c["actor_threads"] * c["envs_per_thread"] == per_device
        assert c["envs_per_thread"] % c["env_batches"] == 0
    assert len({json.dumps(c, sort_keys=True) for c in candidates}) == len(candidates)
    four = trials.sebulba_candidates(settings, devices=4, cpu_count=8)
    assert any(c.get("actor_devices") == "0,1" and c["learner_devices"] == "2,3" for c in four)


@pytest.mark.parametrize("name", sorted(SEBULBA_PRESETS))
@pytest.mark.parametrize("devices", [1, 2, 3, 5, 8])
def test_every_sebulba_layout_tried_is_one_the_trainer_accepts(name, devices):
    settings = SEBULBA_PRESETS[name]["fit"](devices, 2)["sebulba"]
    candidates = trials.sebulba_candidates(settings, devices=devices, cpu_count=2)
    for c in candidates[1:]:
        check_layout(SebulbaConfig(**{**settings, **c}), devices)  # raises for a layout the trainer refuses
    assert len(candidates) > 1  # and there is always an alternative to measure


def test_the_layout_check_of_tune_is_the_trainers():
    """On this 8-device host the trainer refuses 16 envs per thread over the 7 learners of the auto split, and the
    check tune filters its layouts with gives the same refusal, from the same function."""
    config = SebulbaConfig(envs_per_thread=16)
    with pytest.raises(ValueError, match="does not split evenly over 7 learner device") as by_tune:
        check_layout(config, 8)
    with pytest.raises(ValueError) as by_trainer:
        geometry(config, topology(config))
    assert str(by_trainer.value) == str(by_tune.value)


def test_a_tune_that_measured_no_alternative_says_so(capsys, monkeypatch):
    def measure(command, trial_seconds):
        if "--lanes" in command:
            raise RuntimeError("the trial failed")
        return 100.0, 1.0

    monkeypatch.setattr(trials, "measure", measure)
    flags = ["--architecture", "anakin", "--preset", "catch_ppo", "--cpu-devices", "1", "--trial-seconds", "0.01"]
    assert main(["tune", *flags]) == 0
    out = capsys.readouterr().out
    assert "fastest: unknown: no alternative layout was measured (the trial failed)" in out
    assert "is the fastest" not in out and "alternatives=0" in out


@pytest.mark.parametrize("sps, expected", [("0", "no update finished within the trial's 1s"), ("1234.5", None)])
def test_a_trial_that_trained_no_steps_measured_nothing(sps, expected):
    script = f"import sys; print('compiled in 1s', file=sys.stderr); print('RESULT sps={sps} compile_s=2.0')"
    if expected is None:
        assert trials.measure([sys.executable, "-c", script], trial_seconds=1) == (float(sps), 2.0)
        return
    with pytest.raises(RuntimeError, match=expected):
        trials.measure([sys.executable, "-c", script], trial_seconds=1)


def test_anakin_layouts_divide_the_environments_per_device():
    candidates = trials.anakin_candidates({"num_envs": 64}, devices=8)  # 8 per device
    assert candidates[0] == {} and {"lanes": 1, "update_loop": "device"} not in candidates  # that is the preset
    assert {c["lanes"] for c in candidates[1:]} == {1, 2, 4, 8}


@pytest.mark.parametrize(
    "architecture, agent, env, preset",
    [
        ("sebulba", "impala", "Breakout-v5", "atari_impala"),
        ("sebulba", "impala", "Pong-v5", "atari_impala"),
        ("sebulba", "ppo", "CartPole-v1", "cartpole_ppo"),
        ("sebulba", None, None, "cartpole_ppo"),
        ("anakin", "ppo", "catch", "catch_ppo"),
    ],
)
def test_the_preset_follows_the_agent_and_env(architecture, agent, env, preset):
    assert choose_preset(architecture, agent, env) == preset


def test_a_saved_preset_reads_back_as_the_layout_it_measured(tmp_path):
    path = str(tmp_path / "tuned.json")
    preset = SEBULBA_PRESETS["cartpole_ppo"]
    group = preset["fit"](2, 2)
    best = trials.Trial({"env_batches": 2}, sps=1000.0, compile_seconds=1.0)
    trials.save_preset(path, "sebulba", preset, group, best, "tuned here")
    loaded = read_preset_file(path, "sebulba")
    fitted = loaded["fit"](2, 2)
    assert fitted["sebulba"] == {**group["sebulba"], "env_batches": 2}
    assert fitted["agent_config"] == group["agent_config"] and loaded["about"] == "tuned here"
    with pytest.raises(ValueError, match="not an anakin preset"):
        read_preset_file(path, "anakin")


@pytest.mark.slow
def test_tune_measures_the_preset_and_saves_the_fastest_which_then_trains(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # the trials split the CPU themselves (--cpu-devices)
    saved = str(tmp_path / "fastest.json")
    flags = ["--architecture", "anakin", "--preset", "catch_ppo", "--cpu-devices", "1"]
    assert main(["tune", *flags, "--minutes", "0.1", "--trial-seconds", "2", "--save", saved]) == 0
    out = capsys.readouterr().out
    assert "| layout | steps/s | vs the preset |" in out and "| (preset) |" in out
    line = next(line for line in out.splitlines() if line.startswith("TUNE "))
    fastest, preset = (float(line.split(f"{key}=")[1].split()[0]) for key in ("fastest_sps", "preset_sps"))
    assert fastest >= preset > 0  # the preset's own layout is measured in the same run: the pick is no slower
    anakin = json.load(open(saved))["anakin"]
    assert anakin["num_envs"] == ANAKIN_PRESETS["catch_ppo"]["anakin"]["num_envs"]
    run = ["anakin", "--preset", saved, "--total-env-steps", "2048", "--logdir", str(tmp_path / "run"), "--quiet"]
    assert main(run) == 0
    assert "RESULT architecture=anakin agent=ppo env=catch" in capsys.readouterr().out
