"""Ready-made settings: the Podracer paper's Anakin examples scaled to one machine.

A preset fills in flag defaults; flags given on the command line still win.
``podracer anakin --preset NAME``; ``podracer presets`` lists them.
"""

from __future__ import annotations

ANAKIN_PRESETS: dict[str, dict] = {
    "cartpole_ppo": {
        "about": "PPO on CartPole-v1 with PureJaxRL's settings (4 envs x 128 steps, 4 epochs x 4 minibatches), 500k "
        "steps (docs/results.md)",
        "agent": "ppo",
        "env": "cartpole",
        "anakin": {"num_envs": 4, "rollout_len": 128, "total_env_steps": 500_000},
        "agent_config": {},
    },
    "cartpole_ppo_wide": {
        "about": "PPO on CartPole-v1 with 64 envs, the batch that fills a device better, 5M steps (PureJaxRL's "
        "64-env comparison in docs/benchmarks.md)",
        "agent": "ppo",
        "env": "cartpole",
        "anakin": {"num_envs": 64, "rollout_len": 128, "total_env_steps": 5_000_000},
        "agent_config": {},
    },
    "catch_ppo": {
        "about": "PPO on the paper's Catch (10x5), as in DeepMind's Anakin colab, 200k steps (docs/results.md)",
        "agent": "ppo",
        "env": "catch",
        "anakin": {"num_envs": 64, "rollout_len": 16, "total_env_steps": 200_000},
        "agent_config": {"learning_rate": 1e-3, "num_epochs": 2, "num_minibatches": 2},
    },
    "catch_impala": {
        "about": "IMPALA/V-trace on Catch, 64 envs x 16 steps, 300k steps (docs/results.md)",
        "agent": "impala",
        "env": "catch",
        "anakin": {"num_envs": 64, "rollout_len": 16, "total_env_steps": 300_000},
        "agent_config": {"learning_rate": 3e-3},
    },
    "catch_muzero": {
        "about": "MuZero (Gumbel search, 8 simulations) on Catch, replay on the device, 200k steps (docs/results.md)",
        "agent": "muzero",
        "env": "catch",
        "anakin": {"num_envs": 16, "rollout_len": 16, "total_env_steps": 200_000},
        "agent_config": {
            "num_simulations": 8,
            "td_steps": 9,
            "unroll_steps": 5,
            "replay_capacity": 400,
            "batch_size": 64,
            "replay_ratio": 4.0,
            "learning_rate": 4e-3,
            "support_max": 3.0,
            "support_bins": 21,
            "max_considered_actions": 3,
        },
    },
    "cartpole_muzero": {
        "about": "MuZero (Gumbel search, 16 simulations) on CartPole-v1, replay on the device, 200k steps",
        "agent": "muzero",
        "env": "cartpole",
        "anakin": {"num_envs": 16, "rollout_len": 16, "total_env_steps": 200_000},
        "agent_config": {
            "num_simulations": 16,
            "td_steps": 5,
            "replay_capacity": 1000,
            "batch_size": 64,
            "replay_ratio": 2.0,
            "learning_rate": 3e-3,
        },
    },
    "pendulum_ppo": {
        "about": "PPO with a Gaussian policy on gymnax's Pendulum-v1 (CleanRL's continuous settings: 10 epochs x 32 "
        "minibatches, no entropy bonus; observations normalised, rewards x 0.1), 1M steps (docs/results.md)",
        "agent": "ppo",
        "env": "gymnax:Pendulum-v1",
        "anakin": {"num_envs": 16, "rollout_len": 128, "total_env_steps": 1_000_000},
        "agent_config": {
            "learning_rate": 3e-4,
            "entropy_coef": 0.0,
            "num_epochs": 10,
            "num_minibatches": 32,
            "normalize_observations": True,
            "reward_scale": 0.1,
        },
    },
    "inverted_pendulum_ppo": {
        "about": "PPO with a Gaussian policy on Brax's inverted_pendulum (needs the brax extra); the settings of "
        "benchmark_brax.py: 64 envs x 16 steps, 4 epochs x 4 minibatches, observations normalised; 600k "
        "steps (its learning test: tests/test_learning.py)",
        "agent": "ppo",
        "env": "brax:inverted_pendulum",
        "anakin": {"num_envs": 64, "rollout_len": 16, "total_env_steps": 600_000},
        "agent_config": {
            "learning_rate": 3e-4,
            "gamma": 0.97,
            "entropy_coef": 1e-3,
            "max_grad_norm": 1.0,
            "num_epochs": 4,
            "num_minibatches": 4,
            "normalize_observations": True,
        },
    },
    "acrobot_ppo": {
        "about": "PPO on gymnax's Acrobot-v1 with PureJaxRL's CartPole settings (4 envs x 128 steps), 500k steps "
        "(docs/results.md)",
        "agent": "ppo",
        "env": "gymnax:Acrobot-v1",
        "anakin": {"num_envs": 4, "rollout_len": 128, "total_env_steps": 500_000},
        "agent_config": {},
    },
    "minatar_ppo": {
        "about": "PPO on gymnax's MinAtar games (default Breakout) with PureJaxRL's MinAtar settings: 64 envs x 128 "
        "steps, 4 epochs x 8 minibatches, learning rate 5e-3, a 64-64 ReLU MLP; 5M steps (docs/results.md)",
        "agent": "ppo",
        "env": "gymnax:Breakout-MinAtar",
        "anakin": {"num_envs": 64, "rollout_len": 128, "total_env_steps": 5_000_000},
        "agent_config": {
            "learning_rate": 5e-3,
            "num_epochs": 4,
            "num_minibatches": 8,
            "torso": "mlp",
            "activation": "relu",
        },
    },
    "minatar_muzero": {
        "about": "MuZero (Gumbel search, 16 simulations) on gymnax's MinAtar games (default Breakout), an MLP model "
        "of 128 units, 16 sampled windows per new step, value weight 1; 500k steps, beside PPO and IMPALA at equal "
        "env steps (docs/results.md, and its ablations)",
        "agent": "muzero",
        "env": "gymnax:Breakout-MinAtar",
        "anakin": {"num_envs": 16, "rollout_len": 16, "total_env_steps": 500_000},
        "agent_config": {
            "torso": "mlp",
            "hidden_sizes": (128, 128),
            "embedding_size": 128,
            "num_simulations": 16,
            "replay_ratio": 16.0,
            "value_coef": 1.0,
        },
    },
    "memory_ppo": {
        "about": "PPO with an LSTM core (64 units) on Memory, a cue to recall after 8 blank steps (a feed-forward "
        "policy scores 0.25 at best), 64 envs x 16 steps, 200k steps (its learning test: tests/test_recurrent.py)",
        "agent": "ppo",
        "env": "memory",
        "anakin": {"num_envs": 64, "rollout_len": 16, "total_env_steps": 200_000},
        "agent_config": {"learning_rate": 5e-4, "core": "lstm", "core_size": 64},
    },
    "minatar_impala": {
        "about": "IMPALA/V-trace on gymnax's MinAtar games (default Breakout) with the MinAtar paper's network (one "
        "3x3 conv of 16 channels, 128 units), 16 envs x 32 steps, 4 gradient steps per batch, entropy bonus 0.03; "
        "5M steps (docs/results.md, beside the MinAtar paper's actor-critic)",
        "agent": "impala",
        "env": "gymnax:Breakout-MinAtar",
        "anakin": {"num_envs": 16, "rollout_len": 32, "total_env_steps": 5_000_000},
        "agent_config": {
            "learning_rate": 1e-3,
            "max_grad_norm": 40.0,
            "entropy_coef": 0.03,
            "torso": "conv",
        },
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
        "sebulba": {
            "actor_threads": threads,
            "envs_per_thread": envs_per_thread,
            "rollout_len": 20,
            "total_env_steps": 2_500_000,
        },
        # RMSProp on the summed loss, as the paper and Cleanba's IMPALA: with Adam on the mean loss the policy
        # stayed uniform on Pong for 10M frames (training return -20, with 1 or 4 minibatches). V-trace lambda 1,
        # as the paper, rlax and Cleanba take it: with IMPALA's default of 0.95 it learnt Pong far slower
        # (docs/results.md, the atari suite).
        "agent_config": {
            "learning_rate": 6e-4,
            "optimizer": "rmsprop",
            "summed_loss": True,
            "max_grad_norm": 40.0,
            "shared_torso": True,
            "anneal_lr": False,
            "vtrace_lambda": 1.0,
        },
    }


def _atari_muzero(num_devices: int, cpu_count: int) -> dict:
    """Sebulba MuZero on Atari as the paper ran it (search on the actor cores), scaled to this host.

    Small hosts (under 8 cores, e.g. a CPU-only machine) get a smaller learner
    batch, search and replay (500 steps x 32 envs of 84x84x4 frames is ~0.45 GB
    per learner device; 2000 is ~1.8 GB).
    """
    fitted = _atari_impala(num_devices, cpu_count)
    learners = max(1, num_devices - 1)
    small = cpu_count < 8
    fitted["sebulba"].update(rollout_len=20, total_env_steps=50_000_000)
    fitted["agent_config"] = {
        "gamma": 0.997,
        "support_max": 30.0,
        "support_bins": 121,
        "learning_rate": 3e-4,
        "prioritized": True,
        "num_simulations": 16 if small else 32,
        "batch_size": (32 if small else 256) * learners,
        "replay_capacity": 500 if small else 2000,
        "replay_ratio": 0.25,
    }
    return fitted


def _fixed(sebulba: dict, agent_config: dict, host_env: dict | None = None):
    return lambda num_devices, cpu_count: {"sebulba": sebulba, "agent_config": agent_config, "host_env": host_env or {}}


SEBULBA_PRESETS: dict[str, dict] = {
    "cartpole_ppo": {
        "about": "PPO on envpool's CartPole-v1, 1 actor thread x 16 envs, 300k steps (docs/results.md)",
        "agent": "ppo",
        "env": "CartPole-v1",
        "fit": _fixed(
            {"actor_threads": 1, "envs_per_thread": 16, "rollout_len": 64, "total_env_steps": 300_000},
            {"learning_rate": 1e-3, "num_epochs": 4, "num_minibatches": 4},
        ),
    },
    "cartpole_impala": {
        "about": "IMPALA/V-trace on envpool's CartPole-v1, 1 actor thread x 16 envs, 4 gradient steps per batch; "
        "1M steps (docs/results.md)",
        "agent": "impala",
        "env": "CartPole-v1",
        "fit": _fixed(
            {"actor_threads": 1, "envs_per_thread": 16, "rollout_len": 32, "total_env_steps": 1_000_000},
            {"learning_rate": 1e-3, "max_grad_norm": 40.0, "entropy_coef": 1e-3},
        ),
    },
    "atari_impala": {
        "about": "IMPALA/V-trace on Atari (default Breakout-v5) in the paper's setting, fitted to the host's cores; "
        "RMSProp on the summed loss, V-trace lambda 1 (Pong-v5 in docs/results.md)",
        "agent": "impala",
        "env": "Breakout-v5",
        "fit": _atari_impala,
    },
    "cartpole_muzero": {
        "about": "MuZero on envpool's CartPole-v1, search on the actor device, replay sharded over the learners, 16 "
        "sampled windows per new step; 100k steps (docs/results.md)",
        "agent": "muzero",
        "env": "CartPole-v1",
        "fit": _fixed(
            {"actor_threads": 1, "envs_per_thread": 16, "rollout_len": 16, "total_env_steps": 100_000},
            {
                "num_simulations": 16,
                "td_steps": 5,
                "replay_capacity": 1000,
                "batch_size": 64,
                "replay_ratio": 16.0,
                "learning_rate": 1e-3,
            },
        ),
    },
    "atari_muzero": {
        "about": "MuZero on Atari (default Breakout-v5) in the paper's Sebulba style, fitted to the host; its 50M "
        "steps are for an accelerator: no result measured yet",
        "agent": "muzero",
        "env": "Breakout-v5",
        "fit": _atari_muzero,
    },
    "masked_cartpole_ppo": {
        "about": "PPO with an LSTM core (64 units) on envpool's CartPole-v1 without its velocities "
        "(--mask-observations 1 3), the cartpole_ppo batch, 1M steps (docs/results.md; its learning test: "
        "tests/test_recurrent.py)",
        "agent": "ppo",
        "env": "CartPole-v1",
        "fit": _fixed(
            {"actor_threads": 1, "envs_per_thread": 16, "rollout_len": 64, "total_env_steps": 1_000_000},
            {"learning_rate": 1e-3, "num_epochs": 4, "num_minibatches": 4, "core": "lstm", "core_size": 64},
            {"mask_observations": (1, 3)},
        ),
    },
    "halfcheetah_ppo": {
        "about": "PPO with a Gaussian policy on envpool's MuJoCo HalfCheetah-v4 (CleanRL's continuous settings with "
        "16 envs x 64 steps, 10 epochs x 16 minibatches, no entropy bonus, initial log-std -0.5; "
        "observations normalised, rewards x 0.1; reproducible sync), 1M steps (its learning test: "
        "tests/test_sebulba.py)",
        "agent": "ppo",
        "env": "HalfCheetah-v4",
        "fit": _fixed(
            {
                "actor_threads": 1,
                "envs_per_thread": 16,
                "env_batches": 1,
                "rollout_len": 64,
                "total_env_steps": 1_000_000,
                "sync": "reproducible",
            },
            {
                "learning_rate": 3e-4,
                "entropy_coef": 0.0,
                "num_epochs": 10,
                "num_minibatches": 16,
                "log_std_init": -0.5,
                "normalize_observations": True,
                "reward_scale": 0.1,
            },
        ),
    },
    "breakout_ppo": {
        "about": "PPO on Breakout-v5 as Cleanba's benchmark runs it: 16 envs x 32 steps, 1 actor thread, 10M steps "
        "(Pong-v5 in docs/results.md)",
        "agent": "ppo",
        "env": "Breakout-v5",
        "fit": _fixed(
            {"actor_threads": 1, "envs_per_thread": 16, "rollout_len": 32, "total_env_steps": 10_000_000},
            {"learning_rate": 2.5e-4, "clip_eps": 0.1, "shared_torso": True},
        ),
    },
}
DEFAULT_SEBULBA_PRESET = "cartpole_ppo"


MAX_PRESET_FILE_BYTES = 1 << 20  # a saved preset is a few hundred bytes


def read_preset_file(path: str, architecture: str) -> dict:
    """A preset saved as JSON (``podracer tune --save``), in the form of this module's presets; ValueError naming
    the file for one that is unreadable, over a MiB, of another architecture, or whose settings the command line
    would refuse (checked as a run's ``config.json`` is: every key and value; nothing in it is ever executed)."""
    from podracer.rundir import check_run_config

    saved = _load_preset_json(path)
    if not isinstance(saved, dict) or saved.get("architecture") != architecture:
        found = saved.get("architecture") if isinstance(saved, dict) else None
        article = "an" if architecture[0] in "aeiou" else "a"
        raise ValueError(f"--preset {path}: not {article} {architecture} preset (it says {found!r})")
    if architecture == "sebulba":
        saved = {**saved, "host_env": saved.get("host_env") or {}}  # tune writes it only when it sets something
    check_run_config(saved, f"--preset {path}")
    preset = {"about": str(saved.get("about", path)), "agent": saved["agent"], "env": saved["env"]}
    if architecture == "anakin":
        return {**preset, "anakin": saved["anakin"], "agent_config": saved["agent_config"]}
    return {**preset, "fit": _fixed(saved["sebulba"], saved["agent_config"], saved["host_env"])}


def _load_preset_json(path: str):
    """The JSON in the preset file at ``path`` (ValueError naming it when it cannot be read as such)."""
    import json

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PRESET_FILE_BYTES + 1)
    except OSError as error:
        raise ValueError(f"--preset {path}: cannot read it ({error.strerror or error})") from None
    if len(data) > MAX_PRESET_FILE_BYTES:
        raise ValueError(f"--preset {path}: over {MAX_PRESET_FILE_BYTES // 2**20} MiB, so not a preset file")
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"--preset {path}: not a preset file (its JSON is nested too deeply)") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"--preset {path}: not a preset file ({error})") from None
