"""IMPALA actor-critic with V-trace off-policy corrections (rlax).

Minibatches are whole sequences of some of the environments, so a recurrent core (``--core``) replays each from
the core its actor started it with (IMPALA's and SEED RL's stored state; on-policy enough that no burn-in is
taken).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from podracer.agents import actor_critic
from podracer.agents.actor_critic import ActorCriticConfig, LearnerState
from podracer.agents.returns import vtrace
from podracer.agents.sgd import random_permutation, resolve_unroll
from podracer.config import knob
from podracer.types import Agent, BatchShape, EnvSpec, Trajectory


@dataclasses.dataclass(frozen=True)
class ImpalaConfig(ActorCriticConfig):
    learning_rate: float = knob(6e-4, "learning rate")
    # 0.95 rather than rlax's 1: on Anakin's on-policy data (rho = 1) lambda 1 makes V-trace's advantages
    # T-step Monte-Carlo returns, and CartPole stalled near 320 where 0.95 reaches 500 (docs/results.md).
    vtrace_lambda: float = knob(0.95, "V-trace lambda (trace mixing)", minimum=0.0, maximum=1.0)
    clip_rho: float = knob(1.0, "V-trace clipping of importance ratios for the value targets")
    clip_pg_rho: float = knob(1.0, "V-trace clipping of importance ratios for the policy gradient")
    num_minibatches: int = knob(
        0,
        "gradient steps per batch, each on an equal share of its sequences (shuffled; "
        "Cleanba's IMPALA takes 4); 0: 4, or the largest of 2 and 1 that divides the "
        "sequences per replica",
        minimum=0,
    )
    summed_loss: bool = knob(
        False,
        "sum the loss over a gradient step's steps and sequences instead of averaging "
        "it: the IMPALA paper's and Cleanba's scale, which sets what --max-grad-norm and "
        "--rmsprop-eps mean",
    )


class VTraceTerms(NamedTuple):
    """IMPALA's per-step loss terms, each ``[T, B]``; :func:`podracer.agents.actor_critic.actor_critic_objective`
    averages and weighs them."""

    policy_loss: jax.Array  # -log pi(a|x) x the V-trace policy-gradient advantage
    value_loss: jax.Array  # 0.5 (v_s - V(x_s))^2
    entropy: jax.Array
    mean_rho: jax.Array  # the importance ratio pi / mu (averaged: its mean)


def vtrace_loss(
    log_prob: jax.Array,
    entropy: jax.Array,
    values: jax.Array,
    behaviour_log_prob: jax.Array,
    reward: jax.Array,
    discount: jax.Array,
    valid: jax.Array,
    *,
    gamma: float,
    vtrace_lambda: float,
    clip_rho: float,
    clip_pg_rho: float,
) -> VTraceTerms:
    """IMPALA's V-trace policy-gradient, value and entropy terms, per step (nothing reduced, no collective).

    Args:
      log_prob, entropy: ``[T, B]`` the taken actions' log-probabilities and the entropies under the current policy.
      values: ``[T + 1, B]`` current values (``values[T]`` bootstraps).
      behaviour_log_prob: ``[T, B]`` the actors' log-probabilities of the taken actions.
      reward, discount, valid: ``[T, B]`` as in :class:`podracer.types.Trajectory`.
    """
    chex.assert_rank(log_prob, 2)
    chex.assert_equal_shape([log_prob, entropy, behaviour_log_prob, reward, discount, valid, values[1:]])
    rho = jnp.exp(jax.lax.stop_gradient(log_prob) - behaviour_log_prob)
    out = vtrace(
        reward,
        discount,
        valid,
        values,
        rho,
        gamma=gamma,
        vtrace_lambda=vtrace_lambda,
        clip_rho=clip_rho,
        clip_pg_rho=clip_pg_rho,
    )
    return VTraceTerms(
        policy_loss=-log_prob * jax.lax.stop_gradient(out.pg_advantage),
        value_loss=0.5 * jnp.square(out.errors),
        entropy=entropy,
        mean_rho=rho,
    )


DEFAULT_MINIBATCHES = 4  # Cleanba's IMPALA; one step per batch learnt CartPole to ~200 where 4 reach 500


def resolve_minibatches(config: ImpalaConfig, envs_per_replica: int | None) -> int:
    """Gradient steps per batch: ``--num-minibatches``, or with 0 the largest of 4, 2, 1 dividing the sequences
    each replica learns from (4 where that number is not known yet)."""
    if config.num_minibatches:
        return config.num_minibatches
    return math.gcd(DEFAULT_MINIBATCHES, envs_per_replica) if envs_per_replica else DEFAULT_MINIBATCHES


def make_impala(config: ImpalaConfig, spec: EnvSpec, shape: BatchShape = BatchShape()) -> Agent:
    """An IMPALA :class:`Agent`: :func:`resolve_minibatches` gradient steps per trajectory batch."""
    minibatches = resolve_minibatches(config, shape.envs_per_replica)
    steps = shape.num_updates * minibatches if shape.num_updates else None
    parts = actor_critic.build(config, spec, steps)
    policy = parts.policy
    unroll = resolve_unroll(config.minibatch_loop)

    def loss_fn(params, traj: Trajectory):
        policy_out, values = actor_critic.sequence_outputs(parts, params, traj.obs, traj)
        policy_out = jax.tree.map(lambda x: x[:-1], policy_out)
        log_prob, entropy = policy.log_prob_and_entropy(policy_out, traj.action, traj.extras)
        terms = vtrace_loss(
            log_prob,
            entropy,
            values,
            traj.extras["log_prob"],
            traj.reward,
            traj.discount,
            traj.valid,
            gamma=config.gamma,
            vtrace_lambda=config.vtrace_lambda,
            clip_rho=config.clip_rho,
            clip_pg_rho=config.clip_pg_rho,
        )
        loss, metrics = actor_critic.actor_critic_objective(
            terms, traj.valid, value_coef=config.value_coef, entropy_coef=config.entropy_coef
        )
        return (loss * log_prob.size if config.summed_loss else loss), metrics

    def learn(state: LearnerState, traj: Trajectory, key: jax.Array):
        state, traj = actor_critic.prepare_batch(parts, state, traj)
        num_envs = traj.reward.shape[1]
        num_minibatches = resolve_minibatches(config, num_envs)
        if num_minibatches == 1:  # the whole batch, in its order: deterministic given the trajectory
            state, metrics = actor_critic.gradient_step(loss_fn, parts.optimizer, state, traj)
        else:
            if num_envs % num_minibatches:
                raise ValueError(
                    f"IMPALA: each replica learns from {num_envs} sequences, which --num-minibatches "
                    f"{num_minibatches} does not divide; pick a divisor of that number, or change the "
                    "environments per replica (anakin: --num-envs; sebulba: --envs-per-thread)"
                )
            shares = random_permutation(key, num_envs).reshape(num_minibatches, -1)

            def sgd_step(state: LearnerState, share: jax.Array):  # share: [B / num_minibatches] sequence indices
                # Gathered along the env axis, the minibatch stays time-major: a batch-major copy swapped back
                # made XLA:CPU's conv gradients ~10x slower (Nature CNN, 32 x 20 Pong frames, 4 minibatches).
                minibatch = jax.tree.map(lambda x: jnp.take(x, share, axis=1), traj)
                return actor_critic.gradient_step(loss_fn, parts.optimizer, state, minibatch)

            state, metrics = jax.lax.scan(sgd_step, state, shares, unroll=unroll)
            metrics = jax.tree.map(jnp.mean, metrics)
        return state._replace(update=state.update + 1), metrics

    return Agent(
        init=actor_critic.make_init(parts, spec),
        actor_params=actor_critic.actor_params,
        act=actor_critic.make_act(parts),
        learn=learn,
        act_greedy=actor_critic.make_act_greedy(parts),
        initial_core=parts.initial_core,
    )
