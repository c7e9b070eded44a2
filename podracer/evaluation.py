"""Evaluation on separate environments: its settings, the protocol an architecture implements, the record fields.

The driver asks for an evaluation every ``--eval-every`` env steps and once at
the end of the run; the architecture runs ``--eval-episodes`` episodes on
environments of its own (their own seeds, never the training ones) with the
agent's greedy policy (``Agent.act_greedy``) or its sampling one, and the
driver adds the result to the next record: ``eval_return`` (the mean over
episodes and seeds), ``eval_return_stderr``, ``eval_return_min``/``_max``,
``eval_episodes`` (those that ended), ``eval_cut_short`` (those still running
after ``--eval-max-steps`` steps, left out of the score) and ``eval_env_steps``
(the env steps the evaluated parameters had trained for).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import numpy as np

from podracer.config import STEP_COUNT_MAX, check_knobs, knob
from podracer.types import Agent

POLICIES = ("greedy", "sample")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    eval_every: int = knob(
        0,
        "env steps (per seed) between evaluations on separate environments; 0: only the final one",
        minimum=0,
        maximum=STEP_COUNT_MAX,
    )
    eval_episodes: int = knob(
        8, "episodes per evaluation (per seed); 0: no evaluation, not even the final one", minimum=0
    )
    eval_max_steps: int = knob(
        4_500,
        "agent steps each evaluation episode may take: one still running then is cut short and left out of the "
        "score (counted in eval_cut_short); 0: no bound but the environment's own time limit "
        "(default: DQN's 5 minutes of Atari play)",
        minimum=0,
        maximum=STEP_COUNT_MAX,
    )
    eval_policy: str = knob(
        "greedy",
        "the agent's best action (greedy: argmax, the Gaussian's mean, the search's "
        "most weighted; an agent without Agent.act_greedy samples) or a sample of its policy "
        "(sample)",
        choices=POLICIES,
    )


OFF = EvalConfig(eval_episodes=0)  # no evaluation at all (benchmarks, and tests of something else)


class Evaluator(Protocol):
    """What an architecture gives the driver to evaluate with."""

    def request(self, state, update: int) -> None:
        """Evaluates the parameters of ``state`` (after ``update`` updates), now or in the background."""

    def collect(self, wait: bool, report: Callable[[str], None] | None = None) -> dict:
        """Record fields of the evaluations finished since the last call (``{}`` if none); ``wait``: block until
        every requested one has finished, calling ``report`` with a line on its progress now and then."""


def policy(agent: Agent, config: EvalConfig) -> Callable:
    """``(params, obs[B], key, core[B]) -> (action[B], core[B])`` for evaluating ``agent`` (sampling where it has
    no greedy policy); the core state starts at ``agent.initial_core(B)`` and is carried through an episode."""
    if config.eval_policy == "greedy" and agent.act_greedy is not None:
        return agent.act_greedy

    def sample(params, obs, key, core):
        action, _, core = agent.act(params, obs, key, core)
        return action, core

    return sample


def summary(returns: np.ndarray, env_steps: int, finished: np.ndarray | None = None) -> dict:
    """Record fields for episode returns ``[seeds, episodes]`` of parameters trained for ``env_steps``; with
    ``finished`` (same shape), the episodes cut short by ``--eval-max-steps`` are left out and counted in
    ``eval_cut_short`` (and the per-seed means, no longer over equal counts, are not given)."""
    returns = np.asarray(returns, np.float64)
    cut_short = 0
    if finished is not None and not np.all(finished):
        finished = np.asarray(finished, bool)
        cut_short, returns = int((~finished).sum()), returns[finished].reshape(1, -1)
    flat = returns.ravel()
    if not flat.size:
        return {"eval_episodes": 0, "eval_cut_short": cut_short, "eval_env_steps": int(env_steps)}
    fields = {
        "eval_return": float(flat.mean()),
        "eval_return_stderr": float(flat.std(ddof=1) / np.sqrt(flat.size)) if flat.size > 1 else 0.0,
        "eval_return_min": float(flat.min()),
        "eval_return_max": float(flat.max()),
        "eval_episodes": int(flat.size),
        "eval_cut_short": cut_short,
        "eval_env_steps": int(env_steps),
    }
    if returns.shape[0] > 1:
        fields["eval_return_per_seed"] = returns.mean(axis=1).tolist()
    return fields


def describe(fields: dict, max_steps: int, flag: str = "--eval-max-steps") -> str:
    """One line on an evaluation's record ``fields``: the return over the episodes that ended, and how many
    were cut short at ``max_steps`` (``flag`` sets it)."""
    cut = fields.get("eval_cut_short", 0)
    bound = f"{cut} cut short at {flag} {max_steps:,} and left out" if cut else ""
    if not fields["eval_episodes"]:
        return f"no episode ended: all {cut} cut short at {flag} {max_steps:,}, so no return"
    return (
        f"return {fields['eval_return']:.4g} ± {fields['eval_return_stderr']:.2g} (standard error) over "
        f"{fields['eval_episodes']} episodes, min {fields['eval_return_min']:.4g}, max {fields['eval_return_max']:.4g}"
        + (f"; {bound}" if bound else "")
    )


def check(config: EvalConfig) -> None:
    """Refuses settings that cannot evaluate, before anything compiles."""
    check_knobs(config)
    if config.eval_every and not config.eval_episodes:
        raise ValueError("--eval-every needs --eval-episodes of at least 1")
