"""What PPO and IMPALA share: configuration, network, policy distribution, observation statistics, optimiser,
acting and gradient steps."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.flatten_util
import jax.numpy as jnp
import optax

from podracer.agents import normalization
from podracer.agents.networks import (
    ACTIVATIONS,
    CORES,
    TORSOS,
    ActorCritic,
    RecurrentActorCritic,
    make_torso,
    recurrent_cell,
    resolve_torso,
)
from podracer.agents.normalization import RunningMoments
from podracer.agents.policies import CategoricalPolicy, GaussianConfig, GaussianPolicy, make_policy
from podracer.agents.sgd import UNROLL_CHOICES
from podracer.config import INT32_MAX, check_knobs, flag_name, is_traced, knob
from podracer.parallel import masked_mean, mean_over_replicas
from podracer.types import EnvSpec, Params, Trajectory, episode_restarts, no_core, reset_core

OPTIMIZERS = ("adam", "rmsprop")


@dataclasses.dataclass(frozen=True)
class ActorCriticConfig(GaussianConfig):
    learning_rate: float = knob(2.5e-4, "learning rate")
    anneal_lr: bool = knob(True, "decay the learning rate linearly to 0 over the run")
    optimizer: str = knob(
        "adam",
        "adam, or rmsprop as the IMPALA paper and Cleanba's IMPALA take it (no momentum, "
        "epsilon added to the root as PyTorch does)",
        choices=OPTIMIZERS,
    )
    adam_eps: float = knob(1e-5, "Adam epsilon", minimum=0.0)
    rmsprop_decay: float = knob(0.99, "RMSProp: decay of the average of squared gradients", minimum=0.0, maximum=0.9999)
    rmsprop_eps: float = knob(0.01, "RMSProp epsilon (added to the root of that average)", minimum=0.0)
    max_grad_norm: float = knob(0.5, "clip gradients to this global norm")
    gamma: float = knob(0.99, "discount factor", minimum=0.0, maximum=1.0)
    entropy_coef: float = knob(0.01, "weight of the entropy bonus")
    value_coef: float = knob(0.5, "weight of the value loss")
    torso: str = knob("auto", f"network torso, one of {TORSOS}; auto: MLP for vectors, conv for images")
    hidden_sizes: tuple[int, ...] = knob((64, 64), "MLP torso layer sizes")
    activation: str = knob("tanh", "MLP torso activation", choices=tuple(ACTIVATIONS))
    shared_torso: bool = knob(False, "actor and critic share one torso (else each has its own; with --core, shared)")
    core: str = knob(
        "none",
        "a recurrent core between the torso and the heads, shared by actor and critic: lstm, gru, or none "
        "(feed-forward)",
        choices=CORES,
    )
    core_size: int = knob(128, "units of the recurrent core (--core lstm|gru)", minimum=1)
    normalize_observations: bool = knob(
        False,
        "standardise vector observations by running statistics of every "
        "observation learnt from (kept in the learner state)",
    )
    reward_scale: float = knob(1.0, "multiply rewards by this before learning (the logged returns are unscaled)")
    minibatch_loop: str = knob(
        "auto", f"one of {UNROLL_CHOICES}: how the minibatch loop is compiled", choices=UNROLL_CHOICES
    )


class LearnerState(NamedTuple):
    params: Params
    opt_state: optax.OptState
    update: jax.Array  # int32 scalar: learner updates done so far
    obs_moments: RunningMoments | tuple  # with --normalize-observations, else ()


class ActingParams(NamedTuple):
    """What acting needs (:func:`actor_params`): the network's parameters and the observation statistics."""

    network: Params
    obs_moments: RunningMoments | tuple


_BOUNDS = {  # knob -> (whether a value is allowed, what it must be)
    "learning_rate": (lambda v: v > 0, "be positive"),
    "max_grad_norm": (lambda v: v > 0, "be positive"),
    "reward_scale": (lambda v: v > 0, "be positive"),
}


def _ensure_positive(config: ActorCriticConfig) -> None:
    check_knobs(config)
    for name, (allowed, must) in _BOUNDS.items():
        value = getattr(config, name)
        if not is_traced(value) and not allowed(value):
            raise ValueError(f"{flag_name(name)} must {must}, got {value}")


# XLA:CPU computes a conv torso's gradient several times faster in slices of a few dozen Atari frames than over
# a whole batch (measured on 2 cores, forward and backward of 672 frames: IMPALA ResNet 10.8 s whole, 4.3 s in
# slices of 32; Nature CNN 1.9 s -> 0.55 s; MinAtar's small conv over 8,192 observations 0.35 s -> 0.2 s in
# slices of 1,024), its working set then fitting the caches. Slices that one iteration of the loop over them
# applies side by side (unrolled) are independent, and XLA:CPU runs them concurrently on its cores, each conv
# then being small enough for one core. Measured on 2 cores with podracer/agents/conv.py's gradients, the IMPALA ResNet
# learner (Cleanba's setting): a PPO update on 16 x 32 Atari frames (minibatches of 128) 14.1 s whole, 13.4 s in
# slices of 32 one at a time, 10.1 s with those 4 side by side, 8.7 s in 8 slices of 16 side by side; an IMPALA
# update on 32 x 20 (minibatches of 168) 4.5 s in 5 slices one at a time, 3.4 s in 10 slices side by side.
# About this many observation elements per slice (18 Atari frames):
CPU_CONV_SLICE_ELEMENTS = 2**19
# and at most this many slices side by side per iteration (so that the compiled learner stays small at any
# batch: a PPO update on 64 x 32, minibatches of 512, took 39.4 s in 28 slices at once and 40.8 s in 4
# iterations of 8):
SLICES_PER_ITERATION = 16


class ActorCriticParts(NamedTuple):
    """The pieces an actor-critic agent is assembled from."""

    network: ActorCritic
    policy: CategoricalPolicy | GaussianPolicy
    optimizer: optax.GradientTransformation
    has_conv: bool
    config: ActorCriticConfig
    learner_slice: int | None = None  # rows per network application in the learner (None: the whole batch)
    initial_core: Callable[[int], Any] = no_core  # B -> the core state of a fresh episode (recurrent networks)

    @property
    def recurrent(self) -> bool:
        return self.config.core != "none"


def learner_slice(spec: EnvSpec, has_conv: bool) -> int | None:
    """Rows per network application when learning: on the CPU backend, a conv torso's batch is taken in slices
    of about :data:`CPU_CONV_SLICE_ELEMENTS` observation elements (at least 8 rows); elsewhere, whole."""
    if not has_conv or jax.default_backend() != "cpu":
        return None
    return max(8, CPU_CONV_SLICE_ELEMENTS // math.prod(spec.observation.shape))


def apply_network(parts: ActorCriticParts, params: Params, obs: jax.Array, method=None):
    """``parts.network`` on ``obs [N, ...]`` for the learner, in slices of at most ``parts.learner_slice`` rows
    (``obs`` padded to equal slices), :data:`SLICES_PER_ITERATION` of them side by side in each iteration of
    a loop; the same function of ``obs``."""

    def apply(x):
        return parts.network.apply(params, x, method=method)

    n = obs.shape[0]
    if parts.learner_slice is None or n <= parts.learner_slice:
        return apply(obs)
    slices = -(-n // parts.learner_slice)
    side_by_side = min(SLICES_PER_ITERATION, slices)
    slices = side_by_side * -(-slices // side_by_side)  # whole iterations: smaller slices rather than more padding
    size = -(-n // slices)
    padded = jnp.pad(obs, [(0, slices * size - n)] + [(0, 0)] * (obs.ndim - 1))
    _, outs = jax.lax.scan(
        lambda carry, x: (carry, apply(x)), None, padded.reshape((slices, size, *obs.shape[1:])), unroll=side_by_side
    )
    return jax.tree.map(lambda out: out.reshape((slices * size, *out.shape[2:]))[:n], outs)


def build(config: ActorCriticConfig, spec: EnvSpec, optimizer_steps: int | None) -> ActorCriticParts:
    """Network, policy and optimiser for ``spec``; ``optimizer_steps`` sets the length of LR annealing."""
    _ensure_positive(config)
    if config.normalize_observations and spec.images:
        raise ValueError(
            f"--normalize-observations standardises vector observations; these are images {spec.observation.shape}"
        )
    torso = resolve_torso(config.torso, spec)
    policy = make_policy(spec, config)
    make = make_torso(torso, config.hidden_sizes, config.activation)
    initial_core = no_core
    if config.core == "none":
        network = ActorCritic(make, policy.head, config.shared_torso)
    else:
        network = RecurrentActorCritic(make, policy.head, config.core, config.core_size)
        cell = recurrent_cell(config.core, config.core_size)

        def initial_core(batch: int):
            return cell.initialize_carry(jax.random.key(0), (batch, 1))  # zeros; the input size is not used

    learning_rate = config.learning_rate
    if config.anneal_lr and optimizer_steps:
        if optimizer_steps > INT32_MAX:
            raise ValueError(
                f"--anneal-lr counts {optimizer_steps:,} gradient steps over the run, more than the {INT32_MAX:,} "
                "its int32 step counter holds: use fewer --total-env-steps, or --no-anneal-lr"
            )
        learning_rate = optax.linear_schedule(config.learning_rate, 0.0, optimizer_steps)
    if config.optimizer == "rmsprop":
        scale = optax.rmsprop(learning_rate, decay=config.rmsprop_decay, eps=config.rmsprop_eps, eps_in_sqrt=False)
    else:
        scale = optax.adam(learning_rate, eps=config.adam_eps)
    optimizer = optax.flatten(optax.chain(optax.clip_by_global_norm(config.max_grad_norm), scale))
    has_conv = torso != "mlp"
    return ActorCriticParts(network, policy, optimizer, has_conv, config, learner_slice(spec, has_conv), initial_core)


def make_init(parts: ActorCriticParts, spec: EnvSpec):
    def init(key: jax.Array) -> LearnerState:
        dummy = jnp.zeros((1, *spec.observation.shape), spec.observation.dtype)
        params = (
            parts.network.init(key, parts.initial_core(1), dummy) if parts.recurrent else parts.network.init(key, dummy)
        )
        moments = RunningMoments.initial(spec.observation.shape) if parts.config.normalize_observations else ()
        return LearnerState(params, parts.optimizer.init(params), jnp.int32(0), moments)

    return init


def actor_params(state: LearnerState) -> ActingParams:
    return ActingParams(state.params, state.obs_moments)


def _observe(moments: RunningMoments | tuple, obs: jax.Array) -> jax.Array:
    return normalization.normalize(moments, obs) if isinstance(moments, RunningMoments) else obs


def make_act(parts: ActorCriticParts, with_value: bool = False):
    """Samples from the policy: actions ``[B, ...]``, extras with the behaviour log-probability ``[B]`` and,
    ``with_value``, the state values ``[B]`` (one more dense head when the torso is shared); a recurrent network
    keeps instead the core it acted from (``extras["core"]``), for the learner to replay the sequence from."""

    def act(params: ActingParams, obs: jax.Array, key: jax.Array, core):
        if parts.recurrent:
            new_core, (policy_out, _) = parts.network.apply(params.network, core, _observe(params.obs_moments, obs))
            action, extras = parts.policy.sample(policy_out, key)
            return action, {**extras, "core": core}, new_core
        if not with_value:
            return (*parts.policy.sample(_policy_out(parts, params, obs), key), core)
        policy_out, value = parts.network.apply(params.network, _observe(params.obs_moments, obs))
        action, extras = parts.policy.sample(policy_out, key)
        return action, {**extras, "value": value}, core

    return act


def make_act_greedy(parts: ActorCriticParts):
    """The most likely action (discrete) or the Gaussian's mean in the bounds (continuous), ``[B, ...]``, and the
    core state after it."""

    def act_greedy(params: ActingParams, obs: jax.Array, key: jax.Array, core):
        del key
        if parts.recurrent:
            core, (policy_out, _) = parts.network.apply(params.network, core, _observe(params.obs_moments, obs))
            return parts.policy.greedy(policy_out), core
        return parts.policy.greedy(_policy_out(parts, params, obs)), core

    return act_greedy


def _policy_out(parts: ActorCriticParts, params: ActingParams, obs: jax.Array):
    return parts.network.apply(params.network, _observe(params.obs_moments, obs), method=ActorCritic.policy)


def sequence_outputs(parts: ActorCriticParts, params: Params, obs: jax.Array, traj: Trajectory):
    """The policy outputs and values ``[L, B]`` of ``obs [L, B, ...]``: the first ``L`` observations of ``traj``
    (``L`` is ``T`` or ``T + 1``), taken as the learner takes them (normalised: :func:`prepare_batch`).

    A recurrent network replays the sequence from the core its actor had at ``obs[0]`` (``traj.extras["core"]``),
    back to the initial core after every episode restart, as acting did; a feed-forward one sees each
    observation alone.
    """
    if not parts.recurrent:
        return time_major(lambda x: apply_network(parts, params, x))(obs)
    length, batch = obs.shape[:2]
    restarts = jnp.concatenate([jnp.zeros((1, batch), bool), episode_restarts(traj.valid, traj.discount)[: length - 1]])
    features = time_major(lambda x: apply_network(parts, params, x, RecurrentActorCritic.embed))(obs)
    initial = parts.initial_core(batch)

    def step(core, inputs):
        x, restart = inputs
        return parts.network.apply(params, reset_core(core, initial, restart), x, method=RecurrentActorCritic.step)

    start = jax.tree.map(lambda x: x[0], traj.extras["core"])
    _, outputs = jax.lax.scan(step, start, (features, restarts))
    return time_major(lambda y: parts.network.apply(params, y, method=RecurrentActorCritic.heads))(outputs)


def prepare_batch(parts: ActorCriticParts, state: LearnerState, traj: Trajectory) -> tuple[LearnerState, Trajectory]:
    """The trajectory as the learner sees it and the state with this batch's observations counted.

    Observations are standardised with the statistics the actors acted with (so
    the first epoch's importance ratios are exactly 1 on-policy); the statistics
    then take in this batch's observations ``obs[:-1]`` from every replica, for
    the next rollouts. Rewards are multiplied by ``--reward-scale``.
    """
    traj = traj._replace(reward=traj.reward * parts.config.reward_scale)  # exact where the scale is 1
    if not isinstance(state.obs_moments, RunningMoments):
        return state, traj
    seen = traj.obs[:-1].reshape((-1, *traj.obs.shape[2:]))
    normalized = traj._replace(obs=_observe(state.obs_moments, traj.obs))
    return state._replace(obs_moments=normalization.update(state.obs_moments, seen)), normalized


def time_major(fn):
    """Lifts ``fn: [N, ...] -> [N, ...]`` (pytrees) to ``[T, B, ...] -> [T, B, ...]``."""

    def apply(x):
        leading = jax.tree.leaves(x)[0].shape[:2]
        flat = jax.tree.map(lambda a: a.reshape((-1, *a.shape[2:])), x)
        return jax.tree.map(lambda a: a.reshape((*leading, *a.shape[1:])), fn(flat))

    return apply


def actor_critic_objective(
    terms: NamedTuple, valid: jax.Array, *, value_coef: float, entropy_coef: float
) -> tuple[jax.Array, dict]:
    """The loss and metrics of per-step loss ``terms`` (a NamedTuple of equal-shape arrays with ``policy_loss``,
    ``value_loss`` and ``entropy`` among its fields), averaged where ``valid`` over the global batch.

    The one cross-replica reduction of PPO's and IMPALA's losses (their loss functions reduce nothing), done in
    one stacked masked mean: on XLA:CPU each separate reduction is a kernel launch. Returns ``(policy_loss +
    value_coef * value_loss - entropy_coef * entropy, {field: mean})``.
    """
    chex.assert_equal_shape([*terms, valid])
    means = type(terms)(*masked_mean(jnp.stack(terms, axis=-1), valid))
    loss = means.policy_loss + value_coef * means.value_loss - entropy_coef * means.entropy
    return loss, means._asdict()


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
    return state._replace(params=params, opt_state=opt_state), metrics
