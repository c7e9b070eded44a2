"""MuZero with a pure-JAX search (mctx), learning from a per-replica replay on the learner.

* Acting: Gumbel MuZero search (default) or classic MuZero search with
  Dirichlet noise over the learned model; extras hold the search policy and
  value for each step.
* Learning: each call appends its trajectory share to this replica's replay
  (:mod:`podracer.agents.replay`), then takes ``replay_ratio``-many sampled windows per
  new step in gradient steps: a K-step model unroll (hidden-state gradients
  scaled by 0.5), value and reward as categorical distributions over a
  signed-hyperbolic support with two-hot targets (rlax), n-step value targets
  bootstrapped from a *target network* (periodic copy or EMA) so they do not go
  stale, policy targets from the search's action weights, absorbing-state
  targets after termination, and bootstrapping through truncation.
* Reanalyse (``reanalyse_fraction``): a share of each batch's windows gets its
  policy targets (and, with ``reanalyse_value``, its bootstrap values) from a
  fresh search with the target parameters instead of the stored ones.
* Consistency (``consistency_coef``): EfficientZero's self-supervised loss between
  the dynamics' state at unroll step k and the representation of observation k.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import mctx
import optax
import rlax

from podracer.agents.muzero_networks import MuZeroMLP, MuZeroResNet
from podracer.agents.replay import Replay, can_sample, replay_add, replay_init, replay_sample, update_priorities
from podracer.config import check_knobs, flag_name, is_traced, knob
from podracer.parallel import masked_mean, mean_over_replicas, replica_count, replica_index
from podracer.types import BatchShape, EnvSpec, Params, Trajectory, no_core

SEARCHES = ("gumbel", "muzero")
TARGET_UPDATES = ("ema", "periodic")


@dataclasses.dataclass(frozen=True)
class MuZeroConfig:
    learning_rate: float = knob(1e-3, "Adam learning rate")
    weight_decay: float = knob(1e-4, "decoupled weight decay (AdamW)")
    max_grad_norm: float = knob(5.0, "clip gradients to this global norm")
    gamma: float = knob(0.99, "discount factor", minimum=0.0, maximum=1.0)
    search: str = knob(
        "gumbel", f"one of {SEARCHES}: Gumbel MuZero, or classic MuZero with Dirichlet noise", choices=SEARCHES
    )
    num_simulations: int = knob(16, "search simulations per step", minimum=1)
    max_considered_actions: int = knob(16, "Gumbel search: actions sampled at the root", minimum=1)
    dirichlet_alpha: float = knob(0.3, "classic search: Dirichlet noise concentration at the root")
    dirichlet_fraction: float = knob(0.25, "classic search: weight of the root noise", minimum=0.0, maximum=1.0)
    temperature: float = knob(1.0, "classic search: temperature of the visit-count policy")
    q_floor: float = knob(
        1e-8,
        "search: the least spread of Q values that the min-max normalisation of Q divides by (mctx's epsilon; the "
        "default leaves it scale-free, so a tiny Q gap already makes a peaked policy target)",
    )
    unroll_steps: int = knob(5, "K: model unroll steps per sampled window", minimum=1)
    td_steps: int = knob(10, "n: steps of the n-step value targets", minimum=1)
    support_max: float = knob(
        10.0, "value/reward support is [-max, max] after the signed hyperbolic transform", sweepable=False
    )
    support_bins: int = knob(41, "bins of the value/reward support", minimum=2)
    batch_size: int = knob(128, "sampled windows per gradient step, over all replicas", minimum=1)
    replay_ratio: float = knob(
        1.0, "sampled windows per new environment step (sets the gradient steps per call)", sweepable=False
    )
    replay_capacity: int = knob(2000, "replay steps kept per environment (each replica keeps its own envs)", minimum=1)
    min_replay_steps: int = knob(0, "steps per environment stored before learning starts (0: one window)", minimum=0)
    prioritized: bool = knob(False, "sample windows in proportion to |value error| ** priority_alpha")
    priority_alpha: float = knob(1.0, "prioritised replay exponent", sweepable=False)
    priority_beta: float = knob(1.0, "importance-weight exponent")
    target_update: str = knob(
        "ema", f"one of {TARGET_UPDATES}: how the target network follows the online one", choices=TARGET_UPDATES
    )
    target_period: int = knob(100, "periodic target: gradient steps between copies", minimum=1)
    target_ema: float = knob(0.01, "EMA target: step size towards the online parameters", minimum=0.0, maximum=1.0)
    value_coef: float = knob(0.25, "weight of the value loss")
    reward_coef: float = knob(1.0, "weight of the reward loss")
    hidden_gradient_scale: float = knob(0.5, "gradient scale on the hidden state entering the dynamics")
    reanalyse_fraction: float = knob(
        0.0,
        "Reanalyse: the share of each batch's windows whose policy targets come from a fresh search with the "
        "target parameters (one batched search over their K + 1 positions) instead of the stored ones",
        minimum=0.0,
        maximum=1.0,
        sweepable=False,
    )
    reanalyse_value: bool = knob(
        False, "Reanalyse: also bootstrap those windows' value targets from a fresh search's value"
    )
    consistency_coef: float = knob(
        0.0,
        "weight of EfficientZero's consistency loss (1 - cosine between a projection of the dynamics' state at "
        "step k and the stop-gradient projection of observation k's representation); 0: none, and no projection",
        minimum=0.0,
        sweepable=False,
    )
    projection_size: int = knob(128, "consistency loss: width of the projection (SimSiam) heads", minimum=2)
    torso: str = knob("auto", "mlp, resnet, or auto (mlp for vectors, resnet for images)")
    embedding_size: int = knob(64, "MLP: hidden-state size", minimum=1)
    hidden_sizes: tuple[int, ...] = knob((64, 64), "MLP: layer sizes of each function")
    resnet_channels: tuple[int, ...] = knob((32, 64), "ResNet: channels of its two stages (the paper: 128 256)")


class MuZeroState(NamedTuple):
    params: Params
    target_params: Params
    opt_state: optax.OptState
    replay: Replay
    update: jax.Array  # int32: learner calls
    steps: jax.Array  # int32: gradient steps taken


class MuZeroAgent(NamedTuple):
    """An :class:`Agent` (its first six fields; feed-forward: its core state is ``()``) that also exposes its
    search, for masks and tests."""

    init: Callable[[jax.Array], MuZeroState]
    actor_params: Callable[[MuZeroState], Params]
    act: Callable[[Params, jax.Array, jax.Array, tuple], tuple[jax.Array, dict, tuple]]
    learn: Callable[[MuZeroState, Trajectory, jax.Array], tuple[MuZeroState, dict]]
    act_greedy: Callable[[Params, jax.Array, jax.Array, tuple], tuple[jax.Array, tuple]]
    initial_core: Callable[[int], tuple]
    search: Callable[..., mctx.PolicyOutput]  # (params, obs [B, ...], key, invalid_actions [B, A] | None)


def _check(config: MuZeroConfig) -> None:
    check_knobs(config)
    for name in ("learning_rate", "max_grad_norm", "support_max", "q_floor"):
        if not is_traced(getattr(config, name)) and getattr(config, name) <= 0:
            raise ValueError(f"{flag_name(name)} must be positive, got {getattr(config, name)}")
    if config.reanalyse_value and not config.reanalyse_fraction:
        raise ValueError("--reanalyse-value re-searches Reanalyse's windows: it needs --reanalyse-fraction above 0")


def value_transform(config: MuZeroConfig) -> rlax.TxPair:
    """Scalar <-> two-hot probabilities over the signed-hyperbolic support."""
    return rlax.muzero_pair(-config.support_max, config.support_max, config.support_bins, rlax.SIGNED_HYPERBOLIC_PAIR)


def n_step_returns(reward, discount, valid, gamma: float, n: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The n-step returns of the first ``W - n`` positions of windows of ``W`` steps, before bootstrapping.

    Args:
      reward, discount: ``[..., W - 1]`` of the transitions out of positions ``0..W-2``.
      valid: ``[..., W]``; False where a position ended an episode by truncation
        (its transition is an auto-reset), so the return bootstraps there and stops.

    Returns:
      ``(partial, position, scale)``, each ``[..., W - n]``: the return from position ``k`` is
      ``partial[k] + scale[k] * V[position[k]]``, where ``partial`` sums ``gamma^i (prod d) r`` over
      ``m = min(n, steps to the first truncation)`` rewards, ``position = k + m`` (int32) and ``scale =
      gamma^m (prod d)``; termination zeroes what follows it. One bootstrap position per return, so only those
      values need computing.
    """
    count = valid.shape[-1] - n
    partial = jnp.zeros(valid.shape[:-1] + (count,), reward.dtype)
    scale = jnp.ones_like(partial)
    running = jnp.ones_like(partial)
    offset, bootstrap_scale = jnp.zeros_like(partial), jnp.zeros_like(partial)
    for i in range(n):
        ahead = slice(i, i + count)
        partial += running * scale * reward[..., ahead]
        scale = scale * gamma * discount[..., ahead]
        ends_here = running * (1.0 - valid[..., i + 1 : i + 1 + count])
        offset += ends_here * (i + 1)
        bootstrap_scale += ends_here * scale
        running = running - ends_here
    offset += running * n
    bootstrap_scale += running * scale
    return partial, jnp.arange(count) + offset.astype(jnp.int32), bootstrap_scale


def n_step_targets(reward, discount, valid, values, gamma: float, n: int) -> jax.Array:
    """:func:`n_step_returns` bootstrapped from ``values [..., W]``: ``[..., W - n]``."""
    partial, position, scale = n_step_returns(reward, discount, valid, gamma, n)
    return partial + scale * jnp.take_along_axis(values, position, axis=-1)


def unroll_masks(discount, valid, unroll_steps: int) -> tuple[jax.Array, jax.Array]:
    """``(alive, in_episode)``, each ``[..., K + 1]``, for windows starting at real steps.

    ``alive[k]`` is 0 once the episode terminated before position k (absorbing
    targets); ``in_episode[k]`` is 0 from a truncation boundary on (those
    positions belong to the next episode and are not learnt from).
    """
    alive, inside = [jnp.ones(discount.shape[:-1])], [jnp.ones(discount.shape[:-1])]
    for k in range(1, unroll_steps + 1):
        alive.append(alive[-1] * discount[..., k - 1])
        crossed = (alive[-1] > 0) & ~valid[..., k]
        inside.append(inside[-1] * (1.0 - crossed))
    return jnp.stack(alive, -1), jnp.stack(inside, -1)


def _scale_gradient(x: jax.Array, scale: float) -> jax.Array:
    return x * scale + jax.lax.stop_gradient(x) * (1.0 - scale)


class UnrollTargets(NamedTuple):
    """What the K-step unroll of ``b`` sampled windows is trained towards."""

    policy: jax.Array  # [b, K + 1, A] probabilities: the search's action weights (uniform after termination)
    value: jax.Array  # [b, K + 1] n-step returns (0 after termination)
    reward: jax.Array  # [b, K] rewards of the transitions the unroll takes (0 after termination)
    inside: jax.Array  # [b, K + 1] 1 where the position belongs to the window's episode, else 0 (not learnt)
    weight: jax.Array  # [b] importance weights of the windows


def muzero_loss(
    policy_logits,
    value_logits,
    reward_logits,
    targets: UnrollTargets,
    tx: rlax.TxPair,
    value_coef: float,
    reward_coef: float,
    *,
    consistency: jax.Array | None = None,
    consistency_coef: float = 0.0,
) -> tuple[jax.Array, dict]:
    """MuZero's loss over a K-step unroll: policy, value and reward cross-entropies (and a consistency term).

    Args:
      policy_logits: ``[b, K + 1, A]`` from the prediction function at the root and each unrolled step.
      value_logits: ``[b, K + 1, bins]`` over ``tx``'s support.
      reward_logits: ``[b, K, bins]`` from the dynamics function.
      targets: what they are trained towards; scalar values and rewards become
        two-hot distributions with ``tx``.
      consistency: ``[b, K]`` per-step consistency losses (:func:`consistency_loss`), 0 where there is
        nothing to compare (after termination); None: no consistency term.

    Returns:
      ``(loss, metrics)``: each term counts 1 at the root and 1/K at each
      unrolled step, times the window's importance weight, summed over the unroll
      and averaged over the windows (and over every replica, see
      :func:`podracer.parallel.masked_mean`) where ``targets.inside``;
      ``loss = policy + value_coef * value + reward_coef * reward (+ consistency_coef * consistency)``.
    """
    k = reward_logits.shape[1]
    chex.assert_rank([policy_logits, value_logits, reward_logits], 3)
    chex.assert_equal_shape([policy_logits[..., 0], value_logits[..., 0], targets.value, targets.inside])
    chex.assert_equal_shape([reward_logits[..., 0], targets.reward])

    def cross_entropy(target_probs, logits):
        return -jnp.sum(target_probs * jax.nn.log_softmax(logits), axis=-1)

    def after_the_root(per_unrolled_step):  # [b, K] -> [b, K + 1]: nothing at the root
        return jnp.pad(per_unrolled_step, ((0, 0), (1, 0)))

    terms = [
        cross_entropy(targets.policy, policy_logits),
        cross_entropy(tx.apply(targets.value), value_logits),
        after_the_root(cross_entropy(tx.apply(targets.reward), reward_logits)),
    ]
    if consistency is not None:
        chex.assert_equal_shape([consistency, targets.reward])
        terms.append(after_the_root(consistency))
    scale = jnp.concatenate([jnp.ones((1,)), jnp.full((k,), 1.0 / k)])
    per_step = jnp.stack(terms, -1) * (scale[:, None] * targets.weight[:, None, None])  # [b, K + 1, terms]
    means = masked_mean(per_step, targets.inside > 0) * (k + 1)  # one reduction; a sum over the unroll
    total = means[0] + value_coef * means[1] + reward_coef * means[2]
    metrics = {"policy_loss": means[0], "value_loss": means[1], "reward_loss": means[2]}
    if consistency is not None:
        total += consistency_coef * means[3]
        metrics["consistency_loss"] = means[3]
    return total, metrics


def consistency_loss(predicted: jax.Array, target: jax.Array) -> jax.Array:
    """EfficientZero's (SimSiam's) consistency loss, ``1 - cosine(predicted, target)`` over the last axis.

    Args:
      predicted: ``[..., P]`` the online branch (a dynamics state, projected and predicted).
      target: ``[..., P]`` the target branch (the next observation's representation, projected); the caller
        stops its gradient.

    Returns:
      ``[...]`` in ``[0, 2]``; 0 where the two point the same way.
    """
    chex.assert_equal_shape([predicted, target])

    def unit(x):
        return x / jnp.sqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + 1e-12)

    return 1.0 - jnp.sum(unit(predicted) * unit(target), axis=-1)


class Model(NamedTuple):
    """The learned model (representation, dynamics, prediction) as the search and the loss call it."""

    network: nn.Module
    tx: rlax.TxPair  # scalar <-> categorical value and reward
    gamma: float

    def apply(self, params, method, *args):
        return self.network.apply(params, *args, method=method)

    def root(self, params, obs) -> mctx.RootFnOutput:
        """The search's root from observations ``[B, ...]``."""
        state = self.apply(params, self.network.represent, obs)
        logits, value = self.apply(params, self.network.predict, state)
        return mctx.RootFnOutput(prior_logits=logits, value=self.tx.apply_inv(jax.nn.softmax(value)), embedding=state)

    def recurrent(self, params, key, action, state) -> tuple[mctx.RecurrentFnOutput, jax.Array]:
        """One step of the model from hidden states ``[B, ...]`` and actions ``[B]``."""
        state, reward = self.apply(params, self.network.dynamics, state, action)
        logits, value = self.apply(params, self.network.predict, state)
        out = mctx.RecurrentFnOutput(
            reward=self.tx.apply_inv(jax.nn.softmax(reward)),
            discount=jnp.full(action.shape, self.gamma),
            prior_logits=logits,
            value=self.tx.apply_inv(jax.nn.softmax(value)),
        )
        return out, state


def make_network(config: MuZeroConfig, spec: EnvSpec) -> nn.Module:
    """MuZero's MLP for vector observations, its ResNet for images (``--torso``); with a consistency loss, with
    the projection heads it compares."""
    if not spec.discrete:
        raise ValueError(
            f"MuZero searches over a discrete action set; this environment's actions are continuous "
            f"({spec.actions.shape[0]}-dimensional): use --agent ppo or impala"
        )
    torso = config.torso if config.torso != "auto" else ("resnet" if spec.images else "mlp")
    projection = config.projection_size if config.consistency_coef > 0 else 0
    if torso == "mlp":
        return MuZeroMLP(
            spec.num_actions, config.support_bins, config.embedding_size, tuple(config.hidden_sizes), projection
        )
    if torso == "resnet":
        return MuZeroResNet(spec.num_actions, config.support_bins, tuple(config.resnet_channels), 2, projection)
    raise ValueError(f"--torso must be mlp, resnet or auto for MuZero, got {config.torso!r}")


def make_search(config: MuZeroConfig, model: Model) -> Callable[..., mctx.PolicyOutput]:
    """``search(params, obs [B, ...], key, invalid_actions [B, A] | None)``: ``--search`` over the model;
    invalid actions are never chosen."""

    def search(params, obs, key, invalid_actions=None) -> mctx.PolicyOutput:
        if config.search == "gumbel":
            return mctx.gumbel_muzero_policy(
                params,
                key,
                model.root(params, obs),
                model.recurrent,
                config.num_simulations,
                invalid_actions,
                qtransform=functools.partial(mctx.qtransform_completed_by_mix_value, epsilon=config.q_floor),
                max_num_considered_actions=config.max_considered_actions,
            )
        return mctx.muzero_policy(
            params,
            key,
            model.root(params, obs),
            model.recurrent,
            config.num_simulations,
            invalid_actions,
            qtransform=functools.partial(mctx.qtransform_by_parent_and_siblings, epsilon=config.q_floor),
            dirichlet_fraction=config.dirichlet_fraction,
            dirichlet_alpha=config.dirichlet_alpha,
            temperature=config.temperature,
        )

    return search


def example_trajectory(spec: EnvSpec, shape: BatchShape) -> Trajectory:
    """The shapes of one replica's trajectory ``[T(+1), B, ...]``, with MuZero's extras (to size the replay)."""
    t, b = shape.rollout_len, shape.envs_per_replica
    obs = jax.ShapeDtypeStruct((t + 1, b, *spec.observation.shape), spec.observation.dtype)
    step = jax.ShapeDtypeStruct((t, b), jnp.float32)
    return Trajectory(
        obs,
        jax.ShapeDtypeStruct((t, b), jnp.int32),
        step,
        step,
        jax.ShapeDtypeStruct((t, b), jnp.bool_),
        {"search_policy": jax.ShapeDtypeStruct((t, b, spec.num_actions), jnp.float32), "search_value": step},
    )


def unroll(config: MuZeroConfig, model: Model, params, sample) -> tuple[jax.Array, ...]:
    """The model unrolled ``K`` steps from each window's first observation along its actions: policy and value
    logits ``[b, K + 1, ...]``, reward logits ``[b, K, ...]`` and the dynamics' hidden states ``[b, K, ...]``."""
    network, k = model.network, config.unroll_steps
    state = model.apply(params, network.represent, jax.tree.map(lambda x: x[:, 0], sample.obs))
    policy_logits, value_logits, reward_logits, states = [], [], [], []
    for step in range(k + 1):
        logits, value = model.apply(params, network.predict, state)
        policy_logits.append(logits)
        value_logits.append(value)
        if step < k:
            hidden = _scale_gradient(state, config.hidden_gradient_scale)
            state, reward = model.apply(params, network.dynamics, hidden, sample.action[:, step])
            reward_logits.append(reward)
            states.append(state)
    return tuple(jnp.stack(x, 1) for x in (policy_logits, value_logits, reward_logits, states))


def _flat(tree):
    """``[b, m, ...] -> [b * m, ...]`` on every leaf."""
    return jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), tree)


def reanalysed_windows(config: MuZeroConfig, batch: int) -> int:
    """How many of a replica's ``batch`` sampled windows Reanalyse re-searches (at least one where it is on)."""
    if config.reanalyse_fraction <= 0:
        return 0
    return max(1, round(config.reanalyse_fraction * batch))


def make_targets(config: MuZeroConfig, model: Model, search: Callable, num_actions: int) -> Callable:
    """``targets(target_params, sample, key) -> (UnrollTargets, alive [b, K + 1], metrics)`` for ``[b]`` sampled
    windows of ``K + n + 1`` steps, all computed with the target parameters and without gradients.

    Value targets bootstrap from the target network's value at the one position each return needs (or, for
    Reanalyse's windows with ``reanalyse_value``, from a fresh search's value there); the first
    :func:`reanalysed_windows` windows (a uniform draw, as sampling is) take their policy targets from a fresh
    search over their ``K + 1`` positions, in one batched search call.
    """
    k, n = config.unroll_steps, config.td_steps
    uniform = jnp.full((num_actions,), 1.0 / num_actions)

    def targets(target_params, sample, key):
        batch = sample.action.shape[0]
        fresh = reanalysed_windows(config, batch)
        policy_key, value_key = jax.random.split(key)
        partial, position, scale = n_step_returns(
            sample.reward[:, :-1], sample.discount[:, :-1], sample.valid, config.gamma, n
        )  # [b, K + 1]
        bootstrap_obs = jax.tree.map(lambda x: x[jnp.arange(batch)[:, None], position], sample.obs)
        bootstrap = model.root(target_params, _flat(bootstrap_obs)).value.reshape(batch, k + 1)
        if fresh and config.reanalyse_value:
            roots = _flat(jax.tree.map(lambda x: x[:fresh], bootstrap_obs))
            searched = search(target_params, roots, value_key).search_tree.summary().value
            bootstrap = bootstrap.at[:fresh].set(searched.reshape(fresh, k + 1))
        alive, inside = unroll_masks(sample.discount, sample.valid, k)
        policy = sample.extras["search_policy"][:, : k + 1]
        metrics = {}
        if fresh:
            roots = _flat(jax.tree.map(lambda x: x[:fresh, : k + 1], sample.obs))
            new = search(target_params, roots, policy_key).action_weights.reshape(fresh, k + 1, num_actions)
            compared = (alive * inside)[:fresh] > 0
            metrics["reanalyse_kl"] = masked_mean(_kl(policy[:fresh], new), compared)
            policy = policy.at[:fresh].set(new)
        policy = jnp.where(alive[..., None] > 0, policy, uniform)
        metrics["policy_target_entropy"] = masked_mean(-jnp.sum(policy * jnp.log(policy + 1e-12), -1), inside > 0)
        unroll_targets = UnrollTargets(
            policy, (partial + scale * bootstrap) * alive, sample.reward[:, :k] * alive[:, :k], inside, sample.weight
        )
        return jax.lax.stop_gradient((unroll_targets, alive, metrics))

    return targets


def _kl(p: jax.Array, q: jax.Array) -> jax.Array:
    """``KL(p || q)`` over the last axis of two probability arrays."""
    return jnp.sum(p * (jnp.log(p + 1e-12) - jnp.log(q + 1e-12)), axis=-1)


def make_loss(config: MuZeroConfig, model: Model) -> Callable:
    """``loss(params, sample, targets, alive) -> (total, (new priorities [b], metrics))``: this replica's loss over
    ``[b]`` sampled windows, towards :func:`make_targets`' targets."""
    network, k = model.network, config.unroll_steps

    def loss(params, sample, targets: UnrollTargets, alive):
        policy_logits, value_logits, reward_logits, states = unroll(config, model, params, sample)
        consistency = None
        if config.consistency_coef > 0:
            observed = _flat(jax.tree.map(lambda x: x[:, 1 : k + 1], sample.obs))
            target = model.apply(params, network.project, model.apply(params, network.represent, observed))
            predicted = model.apply(params, network.project_and_predict, _flat(states))
            per_step = consistency_loss(predicted, jax.lax.stop_gradient(target)).reshape(alive[:, 1:].shape)
            consistency = per_step * alive[:, 1:]  # nothing to compare once the episode terminated
        total, metrics = muzero_loss(
            policy_logits,
            value_logits,
            reward_logits,
            targets,
            model.tx,
            config.value_coef,
            config.reward_coef,
            consistency=consistency,
            consistency_coef=config.consistency_coef,
        )
        predicted_value = model.tx.apply_inv(jax.nn.softmax(value_logits[:, 0]))
        metrics["value_target"] = jnp.mean(targets.value[:, 0])
        return total, (jax.lax.stop_gradient(jnp.abs(predicted_value - targets.value[:, 0])), metrics)

    return loss


def _gradient_steps(config: MuZeroConfig, traj: Trajectory) -> tuple[int, int]:
    """``(gradient steps this call, windows each replica samples per step)``: ``--replay-ratio`` windows per new
    step over every replica, ``--batch-size`` windows per gradient step split over the replicas."""
    replicas = replica_count()
    if config.batch_size % replicas:
        raise ValueError(
            f"MuZero: --batch-size {config.batch_size} does not split evenly over {replicas} replicas; "
            f"use a multiple of {replicas}"
        )
    new_steps = traj.action.shape[0] * traj.action.shape[1] * replicas
    return max(1, round(config.replay_ratio * new_steps / config.batch_size)), config.batch_size // replicas


def make_learn(
    config: MuZeroConfig, targets: Callable, loss: Callable, optimizer: optax.GradientTransformation
) -> Callable:
    """``learn(state, traj, key)``: adds ``traj`` to this replica's replay, then takes gradient steps on sampled
    windows (:func:`make_targets`, then :func:`make_loss`) once the replay holds ``--min-replay-steps`` (at least
    one window); until then the state is kept."""
    window = config.unroll_steps + config.td_steps + 1
    min_steps = max(config.min_replay_steps, window)
    alpha = config.priority_alpha if config.prioritized else 0.0

    def follow(new_params, target, steps):
        if config.target_update == "ema":
            return optax.incremental_update(new_params, target, config.target_ema)
        return jax.tree.map(lambda p, t: jnp.where(steps % config.target_period == 0, p, t), new_params, target)

    def learn(state: MuZeroState, traj: Trajectory, key):
        gradient_steps, per_replica = _gradient_steps(config, traj)
        replay = replay_add(state.replay, traj)
        ready = can_sample(replay, window, min_steps)
        key = jax.random.fold_in(key, replica_index())  # each replica samples its own shard
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ready, a, b), new, old)  # noqa: E731

        def sgd_step(carry, key):
            params, target, opt_state, replay, steps = carry
            sample_key, target_key = jax.random.split(key)
            sample = replay_sample(replay, sample_key, per_replica, window, alpha, config.priority_beta)
            unroll_targets, alive, target_metrics = targets(target, sample, target_key)
            (total, (priority, metrics)), grads = jax.value_and_grad(loss, has_aux=True)(
                params, sample, unroll_targets, alive
            )
            metrics = {**metrics, **target_metrics, "sample_age": jnp.mean(replay.position - sample.start)}
            grads = mean_over_replicas(grads)
            updates, new_opt = optimizer.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            new_target = follow(new_params, target, steps + 1)
            if config.prioritized:
                replay = update_priorities(replay, sample, priority)
            steps = jnp.where(ready, steps + 1, steps)
            carry = (keep(new_params, params), keep(new_target, target), keep(new_opt, opt_state), replay, steps)
            return carry, {**metrics, "loss": total, "grad_norm": optax.tree.norm(grads)}

        carry = (state.params, state.target_params, state.opt_state, replay, state.steps)
        (params, target, opt_state, replay, steps), metrics = jax.lax.scan(
            sgd_step, carry, jax.random.split(key, gradient_steps)
        )
        metrics = jax.tree.map(jnp.mean, metrics)
        metrics["replay_ready"] = ready.astype(jnp.float32)
        return MuZeroState(params, target, opt_state, replay, state.update + 1, steps), metrics

    return learn


def make_muzero(config: MuZeroConfig, spec: EnvSpec, shape: BatchShape = BatchShape()) -> MuZeroAgent:
    """A MuZero :class:`Agent`; ``shape`` must give ``rollout_len`` and ``envs_per_replica`` (the replay's shape)."""
    _check(config)
    network = make_network(config, spec)
    if shape.rollout_len is None or shape.envs_per_replica is None:
        raise ValueError("MuZero needs the batch shape (rollout_len, envs_per_replica) to size its replay")
    model = Model(network, value_transform(config), config.gamma)
    optimizer = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adamw(config.learning_rate, weight_decay=config.weight_decay),
    )
    search = make_search(config, model)

    def act(params, obs, key, core):
        """Acts by search; extras: ``search_policy [B, A]`` (the action weights), ``search_value [B]``."""
        out = search(params, obs, key)
        extras = {"search_policy": out.action_weights, "search_value": out.search_tree.summary().value}
        return out.action.astype(jnp.int32), extras, core

    def init(key) -> MuZeroState:
        dummy = jnp.zeros((1, *spec.observation.shape), spec.observation.dtype)
        params = network.init(key, dummy, jnp.zeros((1,), jnp.int32))
        replay = replay_init(example_trajectory(spec, shape), config.replay_capacity)
        zero = jnp.int32(0)
        return MuZeroState(params, params, optimizer.init(params), replay, zero, zero)

    def act_greedy(params, obs, key, core):
        """The action the search weighs most (its improved policy's mode)."""
        return jnp.argmax(search(params, obs, key).action_weights, axis=-1).astype(jnp.int32), core

    learn = make_learn(
        config, make_targets(config, model, search, spec.num_actions), make_loss(config, model), optimizer
    )
    return MuZeroAgent(init, lambda state: state.params, act, learn, act_greedy, no_core, search)
