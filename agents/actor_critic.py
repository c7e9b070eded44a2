"""What PPO and IMPALA share: configuration, network, optimiser, acting, gradient steps."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp
import optax

from agents.networks import TORSOS, ActorCritic, make_torso, resolve_torso
from podracer.config import check_knobs, flag_name, knob
from podracer.parallel import mean_over_replicas
from podracer.types import EnvSpec, Params


@dataclasses.dataclass(frozen=True)
class ActorCriticConfig:
    learning_rate: float = knob(2.5e-4, "Adam learning rate")
    anneal_lr: bool = knob(True, "decay the learning rate linearly to 0 over the run")
    adam_eps: float = knob(1e-5, "Adam epsilon")
    max_grad_norm: float = knob(0.5, "clip gradients to this global norm")
    gamma: float = knob(0.99, "discount factor")
    entropy_coef: float = knob(0.01, "weight of the entropy bonus")
    value_coef: float = knob(0.5, "weight of the value loss")
    torso: str = knob("auto", f"network torso, one of {TORSOS}; auto: MLP for vectors, conv for images")
    hidden_sizes: tuple[int, ...] = knob((64, 64), "MLP torso layer sizes")
    shared_torso: bool = knob(False, "actor and critic share one torso (else each has its own)")


class LearnerState(NamedTuple):
    params: Params
    opt_state: optax.OptState
    update: jax.Array  # int32 scalar: learner updates done so far


def _ensure_positive(config: ActorCriticConfig) -> None:
    check_knobs(config)
    for name in ("learning_rate", "max_grad_norm"):
        if getattr(config, name) <= 0:
            raise ValueError(f"{flag_name(name)} must be positive, got {getattr(config, name)}")
    if not 0.0 <= config.gamma <= 1.0:
        raise ValueError(f"--gamma must lie in [0, 1], got {config.gamma}")


class ActorCriticParts(NamedTuple):
    """The pieces an actor-critic agent is assembled from."""

    network: ActorCritic
    optimizer: optax.GradientTransformation
    has_conv: bool


def build(config: ActorCriticConfig, spec: EnvSpec, optimizer_steps: int | None) -> ActorCriticParts:
    """Network and optimiser for ``spec``; ``optimizer_steps`` sets the length of LR annealing."""
    _ensure_positive(config)
    torso = resolve_torso(config.torso, spec)
    network = ActorCritic(make_torso(torso, config.hidden_sizes), spec.num_actions, config.shared_torso)
    learning_rate = config.learning_rate
    if config.anneal_lr and optimizer_steps:
        learning_rate = optax.linear_schedule(config.learning_rate, 0.0, optimizer_steps)
    optimizer = optax.flatten(optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adam(learning_rate, eps=config.adam_eps),
    ))
    return ActorCriticParts(network, optimizer, has_conv=torso != "mlp")


def make_init(parts: ActorCriticParts, spec: EnvSpec):
    def init(key: jax.Array) -> LearnerState:
        dummy = jnp.zeros((1, *spec.observation.shape), spec.observation.dtype)
        params = parts.network.init(key, dummy)
        return LearnerState(params, parts.optimizer.init(params), jnp.int32(0))

    return init


def actor_params(state: LearnerState) -> Params:
    return state.params


def make_act(network: ActorCritic):
    """Samples from the policy; extras hold the behaviour log-probability ``[B]``."""

    def act(params: Params, obs: jax.Array, key: jax.Array):
        logits = network.apply(params, obs, method=ActorCritic.policy)
        action = jax.random.categorical(key, logits).astype(jnp.int32)
        log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=-1)[:, 0]
        return action, {"log_prob": log_prob}

    return act


def time_major(fn):
    """Lifts ``fn: [N, ...] -> [N, ...]`` (pytrees) to ``[T, B, ...] -> [T, B, ...]``."""

    def apply(x):
        leading = jax.tree.leaves(x)[0].shape[:2]
        flat = jax.tree.map(lambda a: a.reshape((-1, *a.shape[2:])), x)
        return jax.tree.map(lambda a: a.reshape((*leading, *a.shape[1:])), fn(flat))

    return apply


def log_prob_and_entropy(logits: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Log-probability of ``action`` and the policy's entropy, both shaped like ``action``."""
    log_probs = jax.nn.log_softmax(logits)
    log_prob = jnp.take_along_axis(log_probs, action[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return log_prob, entropy


def gradient_step(loss_fn, optimizer: optax.GradientTransformation, state: LearnerState, batch):
    """One optimiser step on ``loss_fn(params, batch) -> (loss, metrics)``, gradients averaged over replicas."""
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    grads = mean_over_replicas(grads)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    # The norm of the concatenated gradients: XLA shares that concatenation with optax.flatten's, where a
    # norm per leaf costs ~20 more runtime operations per step on XLA:CPU.
    flat_grads, _ = jax.flatten_util.ravel_pytree(grads)
    metrics = {**metrics, "loss": loss, "grad_norm": jnp.sqrt(jnp.sum(jnp.square(flat_grads)))}
    return LearnerState(params, opt_state, state.update), metrics
