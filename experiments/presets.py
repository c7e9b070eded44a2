"""Ready-made settings: the Podracer paper's Anakin examples scaled to one machine.

A preset fills in flag defaults; flags given on the command line still win.
``podracer anakin --preset NAME``; ``podracer presets`` lists them.
"""

from __future__ import annotations

ANAKIN_PRESETS: dict[str, dict] = {
    "cartpole_ppo": {
        "about": "PPO on CartPole-v1 with PureJaxRL's settings (4 envs x 128 steps, 4 epochs x 4 minibatches)",
        "agent": "ppo",
        "env": "cartpole",
        "anakin": {"num_envs": 4, "rollout_len": 128, "total_env_steps": 500_000},
        "agent_config": {},
    },
    "cartpole_ppo_wide": {
        "about": "PPO on CartPole-v1 with 64 envs, the batch that fills a device better",
        "agent": "ppo",
        "env": "cartpole",
        "anakin": {"num_envs": 64, "rollout_len": 128, "total_env_steps": 5_000_000},
        "agent_config": {},
    },
    "catch_ppo": {
        "about": "PPO on the paper's Catch (10x5), as in DeepMind's Anakin colab",
        "agent": "ppo",
        "env": "catch",
        "anakin": {"num_envs": 64, "rollout_len": 16, "total_env_steps": 200_000},
        "agent_config": {"learning_rate": 1e-3, "num_epochs": 2, "num_minibatches": 2},
    },
    "catch_impala": {
        "about": "IMPALA/V-trace on Catch",
        "agent": "impala",
        "env": "catch",
        "anakin": {"num_envs": 64, "rollout_len": 16, "total_env_steps": 300_000},
        "agent_config": {"learning_rate": 3e-3},
    },
    "breakout_minatar_ppo": {
        "about": "PPO on gymnax's MinAtar Breakout (small conv torso)",
        "agent": "ppo",
        "env": "gymnax:Breakout-MinAtar",
        "anakin": {"num_envs": 64, "rollout_len": 128, "total_env_steps": 5_000_000},
        "agent_config": {"learning_rate": 5e-4},
    },
}
DEFAULT_ANAKIN_PRESET = "cartpole_ppo"
