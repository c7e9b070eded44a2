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
"""

from __future__ import annotations

import dataclasses
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
    for name in ("learning_rate", "max_grad_norm", "support_max"):
        if not is_traced(getattr(config, name)) and getattr(config, name) <= 0:
            raise ValueError(f"{flag_name(name)} must be positive, got {getattr(config, name)}")


def value_transform(config: MuZeroConfig) -> rlax.TxPair:
    """Scalar <-> two-hot probabilities over the signed-hyperbolic support."""
    return rlax.muzero_pair(-config.support_max, config.support_max, config.support_bins, rlax.SIGNED_HYPERBOLIC_PAIR)


def n_step_targets(reward, discount, valid, values, gamma: float, n: int) -> jax.Array:
    """n-step value targets for the first ``W - n`` positions of windows of ``W`` steps.

    Args:
      reward, discount: ``[..., W - 1]`` of the transitions out of positions ``0..W-2``.
      valid: ``[..., W]``; False where a position ended an episode by truncation
        (its transition is an auto-reset), so the return bootstraps there and stops.
      values: ``[..., W]`` bootstrap values (the target network's).

    Returns:
      ``[..., W - n]``: ``sum_i gamma^i (prod d) r + gamma^m (prod d) V[k + m]`` with
      ``m = min(n, steps to the first truncation)``; termination zeroes what follows.
    """
    count = values.shape[-1] - n
    total = jnp.zeros(values.shape[:-1] + (count,), values.dtype)
    scale = jnp.ones_like(total)
    running = jnp.ones_like(total)
    for i in range(n):
        ahead = slice(i, i + count)
        total += running * scale * reward[..., ahead]
        scale = scale * gamma * discount[..., ahead]
        ends_here = running * (1.0 - valid[..., i + 1 : i + 1 + count])
        total += ends_here * scale * values[..., i + 1 : i + 1 + count]
        running = running - ends_here
    return total + running * scale * values[..., n : n + count]


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
) -> tuple[jax.Array, dict]:
    """MuZero's loss over a K-step unroll: policy, value and reward cross-entropies.

    Args:
      policy_logits: ``[b, K + 1, A]`` from the prediction function at the root and each unrolled step.
      value_logits: ``[b, K + 1, bins]`` over ``tx``'s support.
      reward_logits: ``[b, K, bins]`` from the dynamics function.
      targets: what they are trained towards; scalar values and rewards become
        two-hot distributions with ``tx``.

    Returns:
      ``(loss, metrics)``: each cross-entropy counts 1 at the root and 1/K at each
      unrolled step, times the window's importance weight, summed over the unroll
      and averaged over the windows (and over every replica, see
      :func:`podracer.parallel.masked_mean`) where ``targets.inside``;
      ``loss = policy + value_coef * value + reward_coef * reward``.
    """
    k = reward_logits.shape[1]
    chex.assert_rank([policy_logits, value_logits, reward_logits], 3)
    chex.assert_equal_shape([policy_logits[..., 0], value_logits[..., 0], targets.value, targets.inside])
    chex.assert_equal_shape([reward_logits[..., 0], targets.reward])

    def cross_entropy(target_probs, logits):
        return -jnp.sum(target_probs * jax.nn.log_softmax(logits), axis=-1)

    scale = jnp.concatenate([jnp.ones((1,)), jnp.full((k,), 1.0 / k)])
    reward_ce = jnp.pad(cross_entropy(tx.apply(targets.reward), reward_logits), ((0, 0), (1, 0)))  # none at the root
    per_step = jnp.stack(
        [  # [b, K + 1, 3]
            cross_entropy(targets.policy, policy_logits),
            cross_entropy(tx.apply(targets.value), value_logits),
            reward_ce,
        ],
        -1,
    ) * (scale[:, None] * targets.weight[:, None, None])
    means = masked_mean(per_step, targets.inside > 0) * (k + 1)  # one reduction; a sum over the unroll
    total = means[0] + value_coef * means[1] + reward_coef * means[2]
    return total, {"policy_loss": means[0], "value_loss": means[1], "reward_loss": means[2]}


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
    """MuZero's MLP for vector observations, its ResNet for images (``--torso``)."""
    if not spec.discrete:
        raise ValueError(
            f"MuZero searches over a discrete action set; this environment's actions are continuous "
            f"({spec.actions.shape[0]}-dimensional): use --agent ppo or impala"
        )
    torso = config.torso if config.torso != "auto" else ("resnet" if spec.images else "mlp")
    if torso == "mlp":
        return MuZeroMLP(spec.num_actions, config.support_bins, config.embedding_size, tuple(config.hidden_sizes))
    if torso == "resnet":
        return MuZeroResNet(spec.num_actions, config.support_bins, tuple(config.resnet_channels))
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
                max_num_considered_actions=config.max_considered_actions,
            )
        return mctx.muzero_policy(
            params,
            key,
            model.root(params, obs),
            model.recurrent,
            config.num_simulations,
            invalid_actions,
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


def unroll(config: MuZeroConfig, model: Model, params, sample) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The model unrolled ``K`` steps from each window's first observation along its actions: policy and value
    logits ``[b, K + 1, ...]``, reward logits ``[b, K, ...]``."""
    network, k = model.network, config.unroll_steps
    state = model.apply(params, network.represent, jax.tree.map(lambda x: x[:, 0], sample.obs))
    policy_logits, value_logits, reward_logits = [], [], []
    for step in range(k + 1):
        logits, value = model.apply(params, network.predict, state)
        policy_logits.append(logits)
        value_logits.append(value)
        if step < k:
            hidden = _scale_gradient(state, config.hidden_gradient_scale)
            state, reward = model.apply(params, network.dynamics, hidden, sample.action[:, step])
            reward_logits.append(reward)
    return jnp.stack(policy_logits, 1), jnp.stack(value_logits, 1), jnp.stack(reward_logits, 1)


def make_loss(config: MuZeroConfig, model: Model, num_actions: int) -> Callable:
    """``loss(params, target_params, sample) -> (total, (new priorities [b], metrics))``: this replica's loss over
    ``[b]`` sampled windows of ``K + n + 1`` steps."""
    k, n = config.unroll_steps, config.td_steps
    window = k + n + 1

    def loss(params, target_params, sample):
        batch = sample.action.shape[0]
        flat_obs = jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), sample.obs)
        bootstrap = jax.lax.stop_gradient(model.root(target_params, flat_obs).value.reshape(batch, window))
        value_target = n_step_targets(
            sample.reward[:, :-1], sample.discount[:, :-1], sample.valid, bootstrap, config.gamma, n
        )  # [b, K + 1]
        alive, inside = unroll_masks(sample.discount, sample.valid, k)
        value_target = value_target * alive
        reward_target = sample.reward[:, :k] * alive[:, :k]
        uniform = jnp.full((num_actions,), 1.0 / num_actions)
        policy_target = jnp.where(alive[..., None] > 0, sample.extras["search_policy"][:, : k + 1], uniform)

        policy_logits, value_logits, reward_logits = unroll(config, model, params, sample)
        targets = UnrollTargets(policy_target, value_target, reward_target, inside, sample.weight)
        total, metrics = muzero_loss(
            policy_logits, value_logits, reward_logits, targets, model.tx, config.value_coef, config.reward_coef
        )
        predicted = model.tx.apply_inv(jax.nn.softmax(value_logits[:, 0]))
        metrics["value_target"] = jnp.mean(value_target[:, 0])
        return total, (jax.lax.stop_gradient(jnp.abs(predicted - value_target[:, 0])), metrics)

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


def make_learn(config: MuZeroConfig, loss: Callable, optimizer: optax.GradientTransformation) -> Callable:
    """``learn(state, traj, key)``: adds ``traj`` to this replica's replay, then takes gradient steps on sampled
    windows once the replay holds ``--min-replay-steps`` (at least one window); until then the state is kept."""
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
            sample = replay_sample(replay, key, per_replica, window, alpha, config.priority_beta)
            (total, (priority, metrics)), grads = jax.value_and_grad(loss, has_aux=True)(params, target, sample)
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

    learn = make_learn(config, make_loss(config, model, spec.num_actions), optimizer)
    return MuZeroAgent(init, lambda state: state.params, act, learn, act_greedy, no_core, search)
