"""PPO: clipped surrogate objective, GAE, epochs x minibatches, entropy bonus, value clipping.

With a shared torso, GAE takes the values the actors computed beside the policy (the behaviour values).
With a recurrent core (``--core``), minibatches are whole sequences of some of the environments (split along
environments, never along time) and the network replays each from the core its actor started it with.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from podracer.agents import actor_critic
from podracer.agents.actor_critic import ActorCriticConfig, LearnerState
from podracer.agents.networks import ActorCritic
from podracer.agents.returns import generalized_advantages
from podracer.agents.sgd import resolve_unroll, shuffled_minibatches
from podracer.config import check_knobs, knob
from podracer.parallel import global_masked_moments
from podracer.types import Agent, BatchShape, EnvSpec, Trajectory


@dataclasses.dataclass(frozen=True)
class PPOConfig(ActorCriticConfig):
    gae_lambda: float = knob(0.95, "GAE lambda", minimum=0.0, maximum=1.0)
    clip_eps: float = knob(0.2, "PPO ratio clipping epsilon")
    num_epochs: int = knob(4, "passes over each batch", minimum=1)
    num_minibatches: int = knob(4, "minibatches per pass; each spans every device", minimum=1)
    clip_value: bool = knob(True, "clip the value loss around the behaviour values")
    normalize_advantages: bool = knob(True, "normalise advantages per minibatch (over all devices)")


class PPOTerms(NamedTuple):
    """PPO's per-step loss terms, each ``[N]``; :func:`podracer.agents.actor_critic.actor_critic_objective`
    averages and weighs them."""

    policy_loss: jax.Array  # -min(ratio * A, clip(ratio) * A)
    value_loss: jax.Array  # 0.5 (V - target)^2, clipped around the behaviour value where asked
    entropy: jax.Array
    approx_kl: jax.Array  # (ratio - 1) - log ratio, no gradient
    clip_fraction: jax.Array  # 1 where the ratio left [1 - eps, 1 + eps]


def ppo_loss(
    log_prob: jax.Array,
    entropy: jax.Array,
    values: jax.Array,
    behaviour_log_prob: jax.Array,
    behaviour_value: jax.Array,
    advantage: jax.Array,
    target: jax.Array,
    *,
    clip_eps: float,
    clip_value: bool = True,
) -> PPOTerms:
    """PPO's clipped-surrogate, value and entropy terms of ``N`` transitions, per step (nothing reduced, no
    collective: the caller averages them, normalises the advantages beforehand if it wants them normalised).

    Args:
      log_prob, entropy: ``[N]`` the taken actions' log-probabilities and the entropies under the current policy.
      values: ``[N]`` current value estimates.
      behaviour_log_prob, behaviour_value: ``[N]`` the actors' log-probabilities and values.
      advantage, target: ``[N]`` the advantages and value targets.
      clip_eps: the ratio's clipping epsilon (also the value's, with ``clip_value``).
    """
    chex.assert_rank(log_prob, 1)
    chex.assert_equal_shape([log_prob, entropy, values, behaviour_log_prob, behaviour_value, advantage, target])
    log_ratio = log_prob - behaviour_log_prob
    ratio = jnp.exp(log_ratio)
    clipped_ratio = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    value_error = jnp.square(values - target)
    if clip_value:
        clipped = behaviour_value + jnp.clip(values - behaviour_value, -clip_eps, clip_eps)
        value_error = jnp.maximum(value_error, jnp.square(clipped - target))
    return PPOTerms(
        policy_loss=-jnp.minimum(ratio * advantage, clipped_ratio * advantage),
        value_loss=0.5 * value_error,
        entropy=entropy,
        approx_kl=jax.lax.stop_gradient((ratio - 1.0) - log_ratio),
        clip_fraction=(jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32),
    )


def normalized_advantages(advantage: jax.Array, valid: jax.Array) -> jax.Array:
    """``advantage`` standardised by its mean and deviation where ``valid`` over the global batch (a
    cross-replica reduction)."""
    mean, var = global_masked_moments(advantage, valid)
    return (advantage - mean) / (jnp.sqrt(var) + 1e-8)


class PPOBatch(NamedTuple):
    """What each PPO minibatch holds: ``[N, ...]`` transitions, or ``[T, N, ...]`` sequences with a core."""

    obs: jax.Array
    action: jax.Array
    extras: dict  # the actors' extras: "log_prob", the recurrent cores, ...
    value: jax.Array  # behaviour values
    advantage: jax.Array
    target: jax.Array
    valid: jax.Array
    discount: jax.Array | None = None  # sequences only: where episodes restart inside them


def _check_minibatches(config: PPOConfig, rollout_len: int, num_envs: int) -> None:
    if config.core != "none" and num_envs % config.num_minibatches:
        raise ValueError(
            f"PPO with --core {config.core}: minibatches are whole sequences of some of the {num_envs} "
            f"environments of each replica, which --num-minibatches {config.num_minibatches} does not divide; "
            "pick a divisor of that number, or change the environments per replica (anakin: --num-envs; "
            "sebulba: --envs-per-thread)"
        )
    if (rollout_len * num_envs) % config.num_minibatches:
        raise ValueError(
            f"PPO: each replica learns from rollout_len x envs = {rollout_len} x {num_envs} = "
            f"{rollout_len * num_envs} transitions, which --num-minibatches {config.num_minibatches} "
            "does not divide; pick a divisor of that number, or change the environments per replica "
            "(anakin: --num-envs; sebulba: --envs-per-thread) or --rollout-len"
        )


def _values(parts: actor_critic.ActorCriticParts, params, traj: Trajectory, acting_values: bool) -> jax.Array:
    """``[T + 1, B]`` values of ``traj.obs``: the actors' (``extras["value"]``) where acting computed them, with
    only the bootstrap observation's computed here; else all of them (a recurrent network replaying the whole
    sequence)."""
    if parts.recurrent:
        return actor_critic.sequence_outputs(parts, params, traj.obs, traj)[1]
    if acting_values:
        bootstrap = actor_critic.apply_network(parts, params, traj.obs[-1], ActorCritic.value)
        return jnp.concatenate([traj.extras["value"], bootstrap[None]])
    return actor_critic.time_major(lambda obs: actor_critic.apply_network(parts, params, obs, ActorCritic.value))(
        traj.obs
    )


def make_ppo(config: PPOConfig, spec: EnvSpec, shape: BatchShape = BatchShape()) -> Agent:
    """A PPO :class:`Agent` for ``spec``; ``shape.num_updates`` sets the length of LR annealing."""
    check_knobs(config)
    steps = shape.num_updates * config.num_epochs * config.num_minibatches if shape.num_updates else None
    parts = actor_critic.build(config, spec, steps)
    policy = parts.policy
    unroll = resolve_unroll(config.minibatch_loop)
    # With one torso for policy and value, acting computes the values too for a dense head more, and the
    # learner is spared a forward pass over the batch (as CleanRL's and Cleanba's PPO keep the rollout's
    # values); with two torsos the critic's would double the actors' work, so the learner computes them.
    acting_values = config.shared_torso and not parts.recurrent

    def minibatch_loss(params, mb: PPOBatch):
        if parts.recurrent:  # mb: [T, b] sequences of b environments
            replayed = Trajectory((), (), (), mb.discount, mb.valid, mb.extras)  # the restarts and cores
            policy_out, values = actor_critic.sequence_outputs(parts, params, mb.obs, replayed)
            policy_out, values, mb = jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), (policy_out, values, mb))
        else:  # mb: [N] transitions
            policy_out, values = actor_critic.apply_network(parts, params, mb.obs)
        log_prob, entropy = policy.log_prob_and_entropy(policy_out, mb.action, mb.extras)
        advantage = normalized_advantages(mb.advantage, mb.valid) if config.normalize_advantages else mb.advantage
        terms = ppo_loss(
            log_prob,
            entropy,
            values,
            mb.extras["log_prob"],
            mb.value,
            advantage,
            mb.target,
            clip_eps=config.clip_eps,
            clip_value=config.clip_value,
        )
        return actor_critic.actor_critic_objective(
            terms, mb.valid, value_coef=config.value_coef, entropy_coef=config.entropy_coef
        )

    def sgd_step(state: LearnerState, minibatch):
        return actor_critic.gradient_step(minibatch_loss, parts.optimizer, state, minibatch)

    def learn(state: LearnerState, traj: Trajectory, key: jax.Array):
        _check_minibatches(config, *traj.reward.shape)
        state, traj = actor_critic.prepare_batch(parts, state, traj)
        values = _values(parts, state.params, traj, acting_values)
        advantage = generalized_advantages(
            traj.reward, traj.discount, traj.valid, values, config.gamma, config.gae_lambda
        )
        batch = PPOBatch(
            obs=traj.obs[:-1],
            action=traj.action,
            extras=traj.extras,
            value=values[:-1],
            advantage=advantage,
            target=advantage + values[:-1],
            valid=traj.valid,
        )
        if parts.recurrent:  # sequences, shuffled along environments
            state, metrics = shuffled_minibatches(
                sgd_step,
                state,
                batch._replace(discount=traj.discount),
                key,
                config.num_epochs,
                config.num_minibatches,
                unroll,
                axis=1,
            )
        else:
            flat = jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), batch)
            state, metrics = shuffled_minibatches(
                sgd_step, state, flat, key, config.num_epochs, config.num_minibatches, unroll
            )
        state = state._replace(update=state.update + 1)
        return state, jax.tree.map(jnp.mean, metrics)

    return Agent(
        init=actor_critic.make_init(parts, spec),
        actor_params=actor_critic.actor_params,
        act=actor_critic.make_act(parts, with_value=acting_values),
        learn=learn,
        act_greedy=actor_critic.make_act_greedy(parts),
        initial_core=parts.initial_core,
    )
