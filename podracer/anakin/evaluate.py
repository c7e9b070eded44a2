"""Anakin's evaluation: episodes on jittable environments of their own, in one compiled call per evaluation.

Every seed's parameters are evaluated (``vmap`` over seeds) on
``--eval-episodes`` environments reset with keys that never meet training's,
stepped until each has finished one episode, for at most ``--eval-max-steps``
steps or the environment's time limit (episodes still running then are cut
short and left out of the score). It runs on this process's first device; training waits for it, which
on Anakin costs about as many env steps as the evaluation takes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from podracer import evaluation
from podracer.anakin.sweep import Sweep
from podracer.evaluation import EvalConfig, summary
from podracer.types import Agent

MAX_EVAL_STEPS = 100_000  # per episode, for environments without a time limit
EVAL_STREAM = 0x65766C  # folded into the run's seed: the evaluation's keys never meet training's


def episode_returns(agent: Agent, env, config: EvalConfig, sweep: Sweep | None = None):
    """A jitted ``(params [seeds, ...], hparams {name: [seeds]}, key) -> (returns [seeds, M], finished [seeds, M])``
    for ``M`` episodes; with a ``sweep``, each seed acts as the agent of its own ``hparams`` (its member's settings,
    or PBT's), without one ``hparams`` is ``{}``."""
    episodes = config.eval_episodes
    limit = episode_step_bound(env, config)  # an episode of that many steps reports its end on the last

    def one_seed(params, hparams, key):
        act = evaluation.policy(sweep.agent_with(hparams) if sweep else agent, config)
        reset_key, act_key = jax.random.split(key)
        state, obs = jax.vmap(env.reset)(jax.random.split(reset_key, episodes))
        none = jnp.zeros(episodes, bool)

        def unfinished(carry):
            t, _, _, _, finished, _, _ = carry
            return (t < limit) & ~jnp.all(finished)

        def step(carry):  # each environment plays one episode: its core needs no reset
            t, state, obs, core, finished, returns, key = carry
            key, step_key = jax.random.split(key)
            action, core = act(params, obs, step_key, core)
            state, ts = env.step_batch(state, action)
            ended = ts.episode.done & ~finished
            returns = jnp.where(ended, ts.episode.episode_return, returns)
            return t + 1, state, ts.obs, core, finished | ended, returns, key

        core = agent.initial_core(episodes)
        carry = (jnp.int32(0), state, obs, core, none, jnp.zeros(episodes, jnp.float32), act_key)
        _, _, _, _, finished, returns, _ = jax.lax.while_loop(unfinished, step, carry)
        return returns, finished

    @jax.jit
    def run(params, hparams, key):
        seeds = jax.tree.leaves(params)[0].shape[0]
        return jax.vmap(one_seed)(params, hparams, jax.random.split(key, seeds))

    return run


def episode_step_bound(env, config: EvalConfig) -> int:
    """The most steps an evaluation episode on ``env`` may take: ``--eval-max-steps``, the environment's time
    limit or, for one without either, ``MAX_EVAL_STEPS``."""
    return min(int(env.max_episode_steps), config.eval_max_steps or MAX_EVAL_STEPS)


def seed_learners(state):
    """Every seed's learner state ``[seeds, ...]`` from a runner state, on this process's first device.

    The runner state's leaves are ``[devices, seeds, lanes, ...]``; every lane and device holds the same learner.
    """
    return first_lane(state.learner)


def first_lane(tree):
    """``tree``'s leaves ``[devices, seeds, lanes, ...]`` (a runner state's) as ``[seeds, ...]``, from this
    process's first device and its first lane."""
    return jax.tree.map(lambda x: x.addressable_shards[0].data[0, :, 0], tree)


class AnakinEvaluator:
    """:class:`podracer.evaluation.Evaluator` for Anakin's runner state (evaluates at once, on request)."""

    def __init__(
        self, agent: Agent, env, config: EvalConfig, seed: int, steps_per_update: int, sweep: Sweep | None = None
    ):
        self.agent, self.steps_per_update = agent, steps_per_update
        self.run = episode_returns(agent, env, config, sweep)
        self.key = jax.random.fold_in(jax.random.key(seed), EVAL_STREAM)
        self.finished: dict = {}

    def request(self, state, update: int) -> None:
        local = seed_learners(state)
        key = jax.random.fold_in(self.key, update)
        returns, finished = jax.device_get(self.run(self.agent.actor_params(local), first_lane(state.hparams), key))
        self.finished = summary(returns, update * self.steps_per_update, finished)

    def collect(self, wait: bool, report=None) -> dict:  # never waits: ``request`` evaluated at once
        finished, self.finished = self.finished, {}
        return finished
