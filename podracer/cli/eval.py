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
import os
import sys
import threading

from podracer.cli.terminal import Parser
from podracer.evaluation import POLICIES, EvalConfig, describe
from podracer.sebulba.actor import prefer_synchronous_cpu_dispatch

VIDEO_FPS = 15


class EvalError(ValueError):
    """Bad input to ``podracer eval``: reported in one line, exit code 2."""


def _saved_config(run_dir: str) -> dict:
    from podracer.rundir import read_run_config
    from podracer.runlog import CONFIG_FILE

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
    """Simulates as many CPU devices as a CPU run had, if JAX has not started yet (in a notebook that already ran
    JAX, the devices it has must do); accelerators are as they are."""
    import jax

    from podracer.parallel import backends_started

    devices = saved.get("devices") or saved.get("actor_devices", []) + saved.get("learner_devices", [])
    if devices and all(str(d).startswith("cpu") for d in devices) and not backends_started():
        jax.config.update("jax_num_cpu_devices", len(set(devices)))


def _anakin(run_dir: str, update: int | None, eval_config: EvalConfig, video: str | None):
    from podracer.anakin.evaluate import AnakinEvaluator
    from podracer.anakin.load import first_seed_params, load_run

    run = load_run(run_dir, update)
    steps_per_update = run.program.steps_per_update
    evaluator = AnakinEvaluator(run.agent, run.env, eval_config, run.config.seed, steps_per_update, run.sweep)
    evaluator.request(run.state, run.update)
    frames = _anakin_frames(run.agent, run.env, first_seed_params(run), eval_config, run.config.seed) if video else None
    return evaluator.collect(wait=True), run.update, frames


def _anakin_frames(agent, env, params, eval_config: EvalConfig, seed: int) -> list:
    """One episode of one environment, stepped on the host, its pictures."""
    import jax

    from podracer import evaluation
    from podracer.anakin.evaluate import episode_step_bound
    from podracer.envs.render import draw

    act = jax.jit(evaluation.policy(agent, eval_config))
    step = jax.jit(env.step)
    key = jax.random.fold_in(jax.random.key(seed), 0x766964)
    state, obs = jax.jit(env.reset)(key)
    states, core = [state.env_state], agent.initial_core(1)
    for t in range(episode_step_bound(env, eval_config)):
        action, core = act(params, obs[None], jax.random.fold_in(key, t), core)
        state, ts = step(state, action[0])
        if bool(ts.episode.done) or not bool(ts.valid):
            break
        states.append(state.env_state)
        obs = ts.obs
    return draw(env.env, jax.device_get(states))


def _sebulba(run_dir: str, update: int | None, eval_config: EvalConfig, video: str | None):
    import jax

    from podracer.envs.host import HostEnv
    from podracer.evaluation import summary
    from podracer.sebulba.evaluate import SebulbaEvaluator
    from podracer.sebulba.load import load_run

    run = load_run(run_dir, update)
    probe = HostEnv(run.env_id, 1, 0, run.env_config)  # for the layout its observations reach the agent in
    probe.close()
    evaluator = SebulbaEvaluator(
        run.agent,
        run.env_id,
        run.env_config,
        eval_config,
        run.topology.actor_devices[0],
        run.config.seed,
        run.geometry.steps_per_update,
        probe.to_agent_layout,
        threading.Event(),
    )
    params = run.actor_params()
    env = evaluator.make_env(eval_config.eval_episodes)
    try:
        returns, finished = evaluator.play(env, params, jax.random.key(run.config.seed))
    finally:
        env.close()
    frames = None
    if video:
        frames, env = [], evaluator.make_env(1, render=True)
        try:
            evaluator.play(env, params, jax.random.key(run.config.seed + 1), frames)
        finally:
            env.close()
    fields = summary(returns[None], run.update * run.geometry.steps_per_update, finished[None])
    return fields, run.update, frames


def write_video(path: str, frames: list) -> None:
    import imageio.v2 as imageio

    if path.lower().endswith(".mp4"):
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            raise EvalError(
                "--video: writing .mp4 needs imageio-ffmpeg (pip install imageio-ffmpeg); a .gif needs nothing more"
            ) from None
        imageio.mimsave(path, frames, fps=VIDEO_FPS)
    else:
        imageio.mimsave(path, frames, duration=1000 / VIDEO_FPS, loop=0)


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="podracer eval",
        description="Evaluate a run's checkpoint with the run's own settings; optionally write a video of it playing.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (podracer anakin/sebulba --logdir)")
    parser.add_argument(
        "--checkpoint",
        type=int,
        default=None,
        metavar="UPDATE",
        help="the checkpoint's update number (default: the newest)",
    )
    parser.add_argument("--episodes", type=int, default=16, help="episodes to play (default: %(default)s)")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=EvalConfig.eval_max_steps,
        metavar="N",
        help="steps an episode may take: one still running then is cut short and left out of the score "
        "(0: the environment's own time limit; default: %(default)s)",
    )
    parser.add_argument(
        "--policy",
        choices=POLICIES,
        default="greedy",
        help="greedy (the agent's best action) or sample (default: %(default)s)",
    )
    parser.add_argument(
        "--video",
        default=None,
        metavar="FILE",
        help="write the first episode to FILE (.gif, or .mp4 with imageio-ffmpeg)",
    )
    return parser


def run_eval(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.episodes < 1:
            raise EvalError(f"--episodes must be at least 1, got {args.episodes}")
        if args.max_steps < 0:
            raise EvalError(f"--max-steps must be at least 0, got {args.max_steps}")
        saved = _saved_config(args.run_dir)
        _check_video_path(args.video)
        _use_the_run_devices(saved)
        prefer_synchronous_cpu_dispatch()  # before JAX starts, as training does

        evaluate = {"anakin": _anakin, "sebulba": _sebulba}.get(saved["architecture"])
        if evaluate is None:
            raise EvalError(f"{args.run_dir} holds a run of unknown architecture {saved['architecture']!r}")
        eval_config = EvalConfig(eval_episodes=args.episodes, eval_max_steps=args.max_steps, eval_policy=args.policy)
        fields, update, frames = evaluate(args.run_dir, args.checkpoint, eval_config, args.video)
        if not fields["eval_episodes"]:
            raise EvalError(
                f"no episode of {args.episodes} ended within --max-steps {args.max_steps or 'unbounded'} steps; "
                "raise --max-steps (0: the environment's own time limit) or try --policy sample"
            )
        if frames is not None:
            write_video(args.video, frames)
    except ValueError as error:  # EvalError, RunDirectoryError, and what the run's settings or the video cannot do
        print(f"podracer eval: error: {error}", file=sys.stderr)
        return 2
    _report(args, saved, fields, update, frames)
    return 0


def _report(args: argparse.Namespace, saved: dict, fields: dict, update: int, frames) -> None:
    """Prints what was evaluated, the return, and the machine-readable EVAL line."""
    print(
        f"{args.run_dir}: {saved['agent']} on {saved['env']}, checkpoint at update {update} "
        f"({fields['eval_env_steps']:,} env steps), {args.policy} policy"
    )
    print(describe(fields, args.max_steps, "--max-steps"))
    if frames is not None:
        print(f"video: {args.video} ({len(frames)} frames)")
    print(
        f"EVAL return={fields['eval_return']} stderr={fields['eval_return_stderr']} episodes={fields['eval_episodes']} "
        f"cut_short={fields['eval_cut_short']} update={update}"
    )
