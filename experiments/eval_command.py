"""``podracer eval RUN_DIR``: a run's checkpoint, evaluated with the run's own settings, and a video of it playing.

The run directory's ``config.json`` says what was trained and how; the agent and
the architecture's state are rebuilt from it on as many devices as the run had
(simulated CPU devices where it ran on CPUs), the checkpoint restored into them
(read-only: nothing in the run directory changes), and the parameters play
``--episodes`` episodes on evaluation environments (as during training:
:mod:`podracer.evaluation`). ``--video`` writes the first episode as a GIF, or an
MP4 where imageio-ffmpeg is installed: drawn frames for catch and cartpole and
gymnax's visualiser (Anakin), envpool's pictures (Sebulba).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading

from podracer.evaluation import POLICIES, EvalConfig

VIDEO_FPS = 15


class EvalError(ValueError):
    """Bad input to ``podracer eval``: reported in one line, exit code 2."""


def _saved_config(run_dir: str) -> dict:
    from podracer.runlog import CONFIG_FILE, read_run_config

    try:
        saved = read_run_config(run_dir)
    except FileNotFoundError:
        raise EvalError(f"{run_dir}: no {CONFIG_FILE} there, so no podracer run to evaluate") from None
    if saved.get("processes", 1) > 1:
        raise EvalError(f"{run_dir} ran as {saved['processes']} processes; podracer eval reads single-process runs")
    return saved


def _check_video_path(video: str | None) -> None:
    if video is None:
        return
    if os.path.splitext(video)[1].lower() not in (".gif", ".mp4"):
        raise EvalError(f"--video {video}: name a .gif or an .mp4 file")
    folder = os.path.dirname(os.path.abspath(video))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise EvalError(f"--video {video}: cannot write into {folder}")


def _use_the_run_devices(saved: dict) -> None:
    """Simulates as many CPU devices as a CPU run had (before JAX starts); accelerators are as they are."""
    import jax

    devices = saved.get("devices") or saved.get("actor_devices", []) + saved.get("learner_devices", [])
    if devices and all(str(d).startswith("cpu") for d in devices):
        jax.config.update("jax_num_cpu_devices", len(set(devices)))


def _agent_config(saved: dict):
    from agents import AGENTS

    config_class = AGENTS[saved["agent"]][0]
    fields = {f.name for f in dataclasses.fields(config_class)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in saved["agent_config"].items() if k in fields}
    return config_class(**values)


def _anakin(saved: dict, run_dir: str, update: int | None, eval_config: EvalConfig, video: str | None):
    import jax

    import envs
    from agents import make_agent
    from anakin.config import AnakinConfig, geometry
    from anakin.evaluate import AnakinEvaluator, seed_learners
    from anakin.run import anakin_program
    from podracer.checkpoint import restore
    from podracer.types import BatchShape

    env = envs.make(saved["env"])
    config = AnakinConfig(**saved["anakin"])
    geo = geometry(config, len(jax.devices()) if config.num_devices == 0 else config.num_devices)
    agent_config = _agent_config(saved)
    agent = make_agent(saved["agent"], agent_config, env.spec, BatchShape(geo.num_updates, geo.rollout_len,
                                                                          geo.envs_per_lane))
    about = {"agent": saved["agent"], "env": saved["env"], "agent_config": dataclasses.asdict(agent_config)}
    program = anakin_program(agent, env, config, about)
    state, counters = _restored(restore, run_dir, program.init(), program.fingerprint, update)
    evaluator = AnakinEvaluator(agent, env, eval_config, config.seed, program.steps_per_update)
    evaluator.request(state, counters["update"])
    frames = None
    if video:
        local = jax.tree.map(lambda x: x[0], seed_learners(state))  # the first seed's
        frames = _anakin_frames(agent, env, agent.actor_params(local), eval_config, config.seed)
    return evaluator.collect(wait=True), counters["update"], frames


def _anakin_frames(agent, env, params, eval_config: EvalConfig, seed: int) -> list:
    """One episode of one environment, stepped on the host, its pictures."""
    import jax

    from envs.render import draw
    from podracer import evaluation

    act = jax.jit(evaluation.policy(agent, eval_config))
    step = jax.jit(env.step)
    key = jax.random.fold_in(jax.random.key(seed), 0x766964)
    state, obs = jax.jit(env.reset)(key)
    states = [state.env_state]
    for t in range(min(int(env.max_episode_steps), 100_000)):
        action = act(params, obs[None], jax.random.fold_in(key, t))[0]
        state, ts = step(state, action)
        if bool(ts.episode.done) or not bool(ts.valid):
            break
        states.append(state.env_state)
        obs = ts.obs
    return draw(env.env, jax.device_get(states))


def _sebulba(saved: dict, run_dir: str, update: int | None, eval_config: EvalConfig, video: str | None):
    import jax

    from agents import make_agent
    from envs.host import HostEnv, HostEnvConfig
    from podracer.checkpoint import restore
    from podracer.evaluation import summary
    from podracer.parallel import device_mesh, first_local_replica, per_device
    from sebulba.config import SebulbaConfig, geometry, topology
    from sebulba.evaluate import SebulbaEvaluator
    from sebulba.run import batch_shape, env_spec, sebulba_fingerprint

    config, env_config = SebulbaConfig(**saved["sebulba"]), HostEnvConfig(**saved["host_env"])
    topo = topology(config)
    geo = geometry(config, topo)
    agent_config = _agent_config(saved)
    agent = make_agent(saved["agent"], agent_config, env_spec(saved["env"], env_config), batch_shape(config))
    about = {"agent": saved["agent"], "agent_config": dataclasses.asdict(agent_config), "env": saved["env"]}
    like = per_device(agent.init(jax.random.fold_in(jax.random.key(config.seed), 0)),
                      device_mesh(topo.global_learner_devices))
    fingerprint = sebulba_fingerprint(about, config, env_config, geo.num_learners * geo.processes)
    state, counters = _restored(restore, run_dir, like, fingerprint, update)
    probe = HostEnv(saved["env"], 1, 0, env_config)  # for the layout its observations reach the agent in
    probe.close()
    device = topo.actor_devices[0]
    evaluator = SebulbaEvaluator(agent, saved["env"], env_config, eval_config, device, config.seed,
                                 geo.steps_per_update, probe.to_agent_layout, threading.Event())
    params = jax.device_put(first_local_replica(agent.actor_params(state)), device)
    env = evaluator.make_env(eval_config.eval_episodes)
    try:
        returns = evaluator.play(env, params, jax.random.key(config.seed))
    finally:
        env.close()
    frames = None
    if video:
        frames, env = [], evaluator.make_env(1, render=True)
        try:
            evaluator.play(env, params, jax.random.key(config.seed + 1), frames)
        finally:
            env.close()
    return summary(returns[None], counters["update"] * geo.steps_per_update), counters["update"], frames


def _restored(restore, run_dir: str, like, fingerprint: dict, update: int | None):
    from podracer.checkpoint import CheckpointUnreadable, IncompatibleCheckpoint

    try:
        restored = restore(run_dir, like, fingerprint, update=update, repair=False)
    except (IncompatibleCheckpoint, CheckpointUnreadable) as error:
        raise EvalError(str(error).splitlines()[0]) from None
    except ValueError as error:
        raise EvalError(str(error)) from None
    if restored is None:
        raise EvalError(f"{run_dir} holds no checkpoint yet (a run saves one at its end, on a stop signal and "
                        "with --checkpoint-every)")
    return restored


def write_video(path: str, frames: list) -> None:
    import imageio.v2 as imageio

    if path.lower().endswith(".mp4"):
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            raise EvalError("--video: writing .mp4 needs imageio-ffmpeg (pip install imageio-ffmpeg); a .gif "
                            "needs nothing more") from None
        imageio.mimsave(path, frames, fps=VIDEO_FPS)
    else:
        imageio.mimsave(path, frames, duration=1000 / VIDEO_FPS, loop=0)


def run_eval(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="podracer eval",
        description="Evaluate a run's checkpoint with the run's own settings; optionally write a video of it playing.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (podracer anakin/sebulba --logdir)")
    parser.add_argument("--checkpoint", type=int, default=None, metavar="UPDATE",
                        help="the checkpoint's update number (default: the newest)")
    parser.add_argument("--episodes", type=int, default=16, help="episodes to play (default: %(default)s)")
    parser.add_argument("--policy", choices=POLICIES, default="greedy",
                        help="greedy (the agent's best action) or sample (default: %(default)s)")
    parser.add_argument("--video", default=None, metavar="FILE",
                        help="write the first episode to FILE (.gif, or .mp4 with imageio-ffmpeg)")
    args = parser.parse_args(argv)
    try:
        if args.episodes < 1:
            raise EvalError(f"--episodes must be at least 1, got {args.episodes}")
        saved = _saved_config(args.run_dir)
        _check_video_path(args.video)
        _use_the_run_devices(saved)
        import sebulba  # noqa: F401 - before JAX starts, as training imports it

        evaluate = {"anakin": _anakin, "sebulba": _sebulba}.get(saved["architecture"])
        if evaluate is None:
            raise EvalError(f"{args.run_dir} holds a run of unknown architecture {saved['architecture']!r}")
        eval_config = EvalConfig(eval_episodes=args.episodes, eval_policy=args.policy)
        fields, update, frames = evaluate(saved, args.run_dir, args.checkpoint, eval_config, args.video)
        if not fields["eval_episodes"]:
            raise EvalError("no episode ended within the step limit of an evaluation (an environment without "
                            "a time limit)")
        if frames is not None:
            write_video(args.video, frames)
    except ValueError as error:  # EvalError, and what the run's settings or the video cannot do
        print(f"podracer eval: error: {error}", file=sys.stderr)
        return 2
    print(f"{args.run_dir}: {saved['agent']} on {saved['env']}, checkpoint at update {update} "
          f"({fields['eval_env_steps']:,} env steps), {args.policy} policy")
    print(f"return {fields['eval_return']:.4g} ± {fields['eval_return_stderr']:.2g} (standard error) over "
          f"{fields['eval_episodes']} episodes; min {fields['eval_return_min']:.4g}, max {fields['eval_return_max']:.4g}")
    if frames is not None:
        print(f"video: {args.video} ({len(frames)} frames)")
    print(f"EVAL return={fields['eval_return']} stderr={fields['eval_return_stderr']} episodes={fields['eval_episodes']} "
          f"update={update}")
    return 0
