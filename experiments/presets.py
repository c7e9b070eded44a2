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


def _atari_impala(num_devices: int, cpu_count: int) -> dict:
    """The paper's Sebulba V-trace setting (actor batch 32-128, unroll 20), fitted to this host."""
    learners = max(1, num_devices - 1)
    threads = 2 if cpu_count >= 4 else 1
    batch = min(128, max(32, 16 * cpu_count))  # the actor batch of one inference call
    envs_per_thread = max(learners, batch // threads // learners * learners)
    return {
        "sebulba": {"actor_threads": threads, "envs_per_thread": envs_per_thread, "rollout_len": 20,
                    "total_env_steps": 2_500_000},
        "agent_config": {"learning_rate": 6e-4, "max_grad_norm": 40.0, "shared_torso": True, "anneal_lr": False},
    }


def _fixed(sebulba: dict, agent_config: dict):
    return lambda num_devices, cpu_count: {"sebulba": sebulba, "agent_config": agent_config}


SEBULBA_PRESETS: dict[str, dict] = {
    "cartpole_ppo": {
        "about": "PPO on envpool's CartPole-v1, 1 actor thread x 16 envs",
        "agent": "ppo",
        "env": "CartPole-v1",
        "fit": _fixed({"actor_threads": 1, "envs_per_thread": 16, "rollout_len": 64, "total_env_steps": 300_000},
                      {"learning_rate": 1e-3, "num_epochs": 4, "num_minibatches": 4}),
    },
    "atari_impala": {
        "about": "IMPALA/V-trace on Atari (default Breakout-v5) in the paper's setting, fitted to the host's cores",
        "agent": "impala",
        "env": "Breakout-v5",
        "fit": _atari_impala,
    },
    "breakout_ppo": {
        "about": "PPO on Breakout-v5 as Cleanba's benchmark runs it: 16 envs x 32 steps, 1 actor thread",
        "agent": "ppo",
        "env": "Breakout-v5",
        "fit": _fixed({"actor_threads": 1, "envs_per_thread": 16, "rollout_len": 32, "total_env_steps": 10_000_000},
                      {"learning_rate": 2.5e-4, "clip_eps": 0.1, "shared_torso": True}),
    },
}
DEFAULT_SEBULBA_PRESET = "cartpole_ppo"
