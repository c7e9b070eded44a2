"""Sebulba's evaluation: a thread of its own on an actor device, with its own envpool batch, beside training.

On request the learner hands the thread a copy of the acting parameters (on
the thread's device) and goes on learning; the thread plays
``--eval-episodes`` games, one per environment, for at most ``--eval-max-steps``
steps each (a game still running then is cut short and left out of the score),
with the greedy or the sampling policy, and leaves the result for the next record. A request that arrives
while an evaluation runs replaces any older one still waiting, so the learner
never waits for evaluations, except for the final one at the end of the run.
Atari games are evaluated as games: no life loss ends an episode, rewards are
not clipped, the score is the game's (sticky actions as configured).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time

import jax
import numpy as np

from podracer import evaluation
from podracer.envs.host import HostEnv, HostEnvConfig, is_atari
from podracer.evaluation import EvalConfig, summary
from podracer.parallel import first_local_replica
from podracer.types import Agent

EVAL_SEED_OFFSET = 1_000_003  # evaluation environments' seeds start here past the run's seed
REPORT_SECONDS = 30.0  # while the run waits for an evaluation, a progress line this often


class SebulbaEvaluator:
    """:class:`podracer.evaluation.Evaluator` running in a thread that :meth:`run` is the target of."""

    def __init__(
        self,
        agent: Agent,
        env_id: str,
        env_config: HostEnvConfig,
        config: EvalConfig,
        device: jax.Device,
        seed: int,
        steps_per_update: int,
        to_agent_layout,
        stop: threading.Event,
    ):
        self.agent, self.env_id, self.config, self.device, self.seed = agent, env_id, config, device, seed
        self.steps_per_update, self.stop = steps_per_update, stop
        self.env_config = env_config
        policy = evaluation.policy(agent, config)
        # Runs where the parameters are: they are put on ``device`` with each request.
        self.act = jax.jit(lambda params, obs, key, core: policy(params, to_agent_layout(obs), key, core))
        self.requests: queue.Queue = queue.Queue(maxsize=1)
        self.results: queue.Queue = queue.Queue()
        self.outstanding = 0  # requested and not yet collected
        self.games = (0, 0)  # the evaluation playing now: (games over, steps taken)

    def request(self, state, update: int) -> None:
        params = jax.device_put(first_local_replica(self.agent.actor_params(state)), self.device)
        try:  # a newer request replaces one still waiting: evaluations never hold the learner up
            self.requests.get_nowait()
            self.outstanding -= 1
        except queue.Empty:
            pass
        self.requests.put((update, params))
        self.outstanding += 1

    def collect(self, wait: bool, report=None) -> dict:
        fields, started, reported = {}, time.monotonic(), 0
        while self.outstanding:
            try:
                fields = self.results.get(timeout=0.1) if wait else self.results.get_nowait()
            except queue.Empty:
                if not wait or self.stop.is_set():
                    break
                waited = time.monotonic() - started
                if report is not None and waited >= (reported + 1) * REPORT_SECONDS:
                    reported += 1
                    over, steps = self.games
                    limit = self.config.eval_max_steps
                    bound = f"it stops at --eval-max-steps {limit:,}, " if limit else ""
                    report(
                        f"evaluation: {over}/{self.config.eval_episodes} games over after {steps:,} steps "
                        f"({waited:.0f}s; {bound}--eval-episodes 0 skips it)"
                    )
                continue
            self.outstanding -= 1
        return fields

    def make_env(self, num_envs: int, render: bool = False) -> HostEnv:
        """Evaluation environments: seeded apart from training's; Atari as whole games with raw scores."""
        env_config = self.env_config
        if is_atari(self.env_id):
            env_config = dataclasses.replace(env_config, episodic_life=False, reward_clip=False)
        return HostEnv(self.env_id, num_envs, self.seed + EVAL_SEED_OFFSET, env_config, render=render)

    def run(self) -> None:
        """The thread: evaluates each request until the run stops."""
        env = self.make_env(self.config.eval_episodes)
        key = jax.device_put(jax.random.fold_in(jax.random.key(self.seed), EVAL_SEED_OFFSET), self.device)
        try:
            while not self.stop.is_set():
                try:
                    update, params = self.requests.get(timeout=0.1)
                except queue.Empty:
                    continue
                key, episode_key = jax.random.split(key)
                played = self.play(env, params, episode_key)
                if played is not None:
                    returns, finished = played
                    self.results.put(summary(returns[None], update * self.steps_per_update, finished[None]))
        finally:
            env.close()

    def play(self, env: HostEnv, params, key, frames: list | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """One game per environment, each of at most ``--eval-max-steps`` steps: ``(scores [M], finished [M])``
        (a game cut short there is not finished), or None if the run stopped first; with ``frames``, the first
        environment's pictures until its game ends are appended there."""
        episodes = env.num_envs
        obs, score = env.reset(), np.zeros(episodes)
        core = jax.device_put(self.agent.initial_core(episodes), self.device)  # one game each: never reset
        final, finished = np.zeros(episodes), np.zeros(episodes, bool)
        steps, bound = 0, self.config.eval_max_steps or np.inf
        while not finished.all() and steps < bound:
            if self.stop.is_set():
                return None
            self.games, steps = (int(finished.sum()), steps), steps + 1
            key, step_key = jax.random.split(key)
            action, core = self.act(params, obs, step_key, core)
            env.send(np.asarray(action))
            step = env.recv()
            if frames is not None and not finished[0]:
                frames.append(env.render()[0])
            score += np.where(finished, 0.0, step.real_reward)
            ended = step.game_over & ~finished
            final[ended], finished = score[ended], finished | ended
            obs = step.obs
        return final, finished
