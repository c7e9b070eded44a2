"""Learning bars with fixed seeds: a solved CartPole and a solved Catch, for both agents."""

import dataclasses

import numpy as np

from agents import ImpalaConfig, PPOConfig
from anakin import AnakinConfig, train
from experiments.presets import ANAKIN_PRESETS


def _run_preset(name, **overrides):
    preset = ANAKIN_PRESETS[name]
    agent_config = {"ppo": PPOConfig, "impala": ImpalaConfig}[preset["agent"]](**preset["agent_config"])
    config = dataclasses.replace(AnakinConfig(**preset["anakin"]), **overrides)
    return train(preset["agent"], agent_config, overrides.pop("env", preset["env"]), config, run_dir=None, quiet=True)


def _final_return(result, last=3):
    """Mean episode return over the last log windows (about the last 15% of the run)."""
    return float(np.mean([r["episode_return"] for r in result.records[-last:]]))


def test_ppo_solves_cartpole_within_500k_steps():
    result = _run_preset("cartpole_ppo", num_devices=1, seed=0)
    assert result.env_steps <= 500_224  # 500k rounded up to whole updates of 512 steps
    assert _final_return(result) >= 475


def test_ppo_solves_catch_across_eight_devices():
    result = _run_preset("catch_ppo", num_devices=8, seed=0)
    assert _final_return(result) >= 0.9


def test_impala_solves_catch():
    result = _run_preset("catch_impala", num_devices=1, seed=0)
    assert _final_return(result) >= 0.9


def test_the_gymnax_adapter_trains_on_a_gymnax_environment():
    preset = ANAKIN_PRESETS["catch_ppo"]
    config = AnakinConfig(**preset["anakin"], num_devices=1)
    result = train("ppo", PPOConfig(**preset["agent_config"]), "gymnax:Catch-bsuite", config, run_dir=None, quiet=True)
    assert result.records[0]["episode_return"] < 0.0  # a random policy loses most catches
    assert _final_return(result) >= 0.9
