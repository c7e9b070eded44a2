"""IMPALA actor-critic with V-trace off-policy corrections (rlax).

Minibatches are whole sequences of some of the environments, so a recurrent core (``--core``) replays each from
the core its actor started it with (IMPALA's and SEED RL's stored state; on-policy enough that no burn-in is
taken).
"""

from __future__ import annotations

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp

from podracer.agents import actor_critic
from podracer.agents.actor_critic import ActorCriticConfig, LearnerState
from podracer.agents.returns import vtrace
from podracer.agents.sgd import random_permutation, resolve_unroll
from podracer.config import knob
from podracer.parallel import masked_mean
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


def vtrace_loss(
    log_prob: jax.Array, entropy: jax.Array, values: jax.Array, traj: Trajectory, config: ImpalaConfig
) -> tuple[jax.Array, dict]:
    """This replica's IMPALA loss.

    Args:
      log_prob, entropy: ``[T, B]`` the taken actions' log-probabilities and the entropies under the current policy.
      values: ``[T + 1, B]`` current values (``values[T]`` bootstraps).
      traj: the trajectory; ``traj.extras["log_prob"]`` is the behaviour log-probability.
    """
    chex.assert_rank(log_prob, 2)
    chex.assert_equal_shape([log_prob, entropy, traj.reward, traj.valid, traj.extras["log_prob"]])
    rho = jnp.exp(jax.lax.stop_gradient(log_prob) - traj.extras["log_prob"])
    out = vtrace(
        traj.reward,
        traj.discount,
        traj.valid,
        values,
        rho,
        config.gamma,
        config.vtrace_lambda,
        config.clip_rho,
        config.clip_pg_rho,
    )
    policy_loss = masked_mean(-log_prob * jax.lax.stop_gradient(out.pg_advantage), traj.valid)
    value_loss = 0.5 * masked_mean(jnp.square(out.errors), traj.valid)
    entropy = masked_mean(entropy, traj.valid)
    loss = policy_loss + config.value_coef * value_loss - config.entropy_coef * entropy
    metrics = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "mean_rho": masked_mean(rho, traj.valid),
    }
    return loss, metrics


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
        loss, metrics = vtrace_loss(log_prob, entropy, values, traj, config)
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
