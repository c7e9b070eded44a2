"""Policy distributions for the actor-critic agents: categorical for discrete actions, diagonal Gaussian for
continuous ones.

A policy is the network's last layer (:meth:`head`) plus what is done with its
output: sampling an action for the environment with the behaviour
log-probability (:meth:`sample`), and the log-probability and entropy of a
stored action under the current parameters (:meth:`log_prob_and_entropy`).
The agents call these three and nothing else, so PPO and IMPALA are written
once for both kinds of action.
"""

from __future__ import annotations

import dataclasses

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from podracer.agents.dense import Dense
from podracer.config import flag_name, is_traced, knob
from podracer.types import Box, EnvSpec

STD_CHOICES = ("parameter", "network")
BOUND_CHOICES = ("clip", "tanh")


@dataclasses.dataclass(frozen=True)
class GaussianConfig:
    """How continuous actions are drawn; refused on discrete environments unless left at the defaults."""

    log_std: str = knob(
        "parameter",
        "continuous actions: the Gaussian's log-std is a learnt parameter per action "
        "dimension (parameter) or an output of the policy network (network)",
        choices=STD_CHOICES,
    )
    log_std_init: float = knob(0.0, "continuous actions: the initial log-std")
    action_bounds: str = knob(
        "clip",
        "continuous actions: the sample is clipped into the bounds (clip) or squashed "
        "by a scaled tanh (tanh); either way it is the unbounded sample that is learnt from",
        choices=BOUND_CHOICES,
    )


def _orthogonal(scale: float):
    return nn.initializers.orthogonal(scale)


class CategoricalPolicy:
    """Logits over ``num_actions``; actions ``[B]`` int32; extras ``{"log_prob": [B]}``."""

    def __init__(self, num_actions: int):
        self.num_actions = num_actions

    def head(self) -> nn.Module:
        return Dense(self.num_actions, kernel_init=_orthogonal(0.01))

    def sample(self, logits: jax.Array, key: jax.Array) -> tuple[jax.Array, dict]:
        action = jax.random.categorical(key, logits).astype(jnp.int32)
        log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=-1)[:, 0]
        return action, {"log_prob": log_prob}

    def greedy(self, logits: jax.Array) -> jax.Array:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def log_prob_and_entropy(self, logits: jax.Array, action: jax.Array, extras: dict) -> tuple[jax.Array, jax.Array]:
        """``logits [..., A]`` and ``action [...]``: log-probability and entropy, both ``[...]``."""
        del extras
        log_probs = jax.nn.log_softmax(logits)
        log_prob = jnp.take_along_axis(log_probs, action[..., None], axis=-1)[..., 0]
        entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
        return log_prob, entropy


class GaussianHead(nn.Module):
    """Mean ``[N, A]`` and log-std ``[N, A]`` of a diagonal Gaussian."""

    action_size: int
    state_dependent_std: bool
    log_std_init: float

    @nn.compact
    def __call__(self, features):
        mean = Dense(self.action_size, kernel_init=_orthogonal(0.01))(features)
        if self.state_dependent_std:
            log_std = Dense(
                self.action_size, kernel_init=_orthogonal(0.01), bias_init=nn.initializers.constant(self.log_std_init)
            )(features)
        else:
            log_std = jnp.broadcast_to(
                self.param("log_std", nn.initializers.constant(self.log_std_init), (self.action_size,)), mean.shape
            )
        return mean, log_std


class GaussianPolicy:
    """A diagonal Gaussian over ``R^A`` whose samples are mapped into the environment's :class:`Box`.

    The environment receives the mapped action (``[B, A]`` float32, inside the
    bounds); the unbounded sample goes into the extras (``{"sample": [B, A],
    "log_prob": [B]}``) and it is what the learner scores. The mapping is the
    same fixed function for the behaviour and the current policy, so the
    importance ratios of the samples are exactly those of the actions. With
    ``tanh`` the mapping is invertible and the entropy reported is that of the
    Gaussian before squashing.
    """

    def __init__(self, box: Box, config: GaussianConfig = GaussianConfig()):
        self.box, self.config = box, config
        self.low = np.asarray(box.low, np.float32)
        self.high = np.asarray(box.high, np.float32)

    def head(self) -> nn.Module:
        return GaussianHead(self.box.shape[0], self.config.log_std == "network", self.config.log_std_init)

    def distribution(self, out: tuple[jax.Array, jax.Array]) -> distrax.Distribution:
        mean, log_std = out
        return distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))

    def to_bounds(self, sample: jax.Array) -> jax.Array:
        """``[..., A]`` unbounded samples to actions inside the bounds."""
        if self.config.action_bounds == "tanh":
            return self.low + (jnp.tanh(sample) + 1.0) * (0.5 * (self.high - self.low))
        return jnp.clip(sample, self.low, self.high)

    def greedy(self, out) -> jax.Array:
        """The Gaussian's mean, mapped into the bounds."""
        return self.to_bounds(out[0])

    def sample(self, out, key: jax.Array) -> tuple[jax.Array, dict]:
        sample, log_prob = self.distribution(out).sample_and_log_prob(seed=key)
        return self.to_bounds(sample), {"sample": sample, "log_prob": log_prob}

    def log_prob_and_entropy(self, out, action: jax.Array, extras: dict) -> tuple[jax.Array, jax.Array]:
        """``out`` (mean and log-std ``[..., A]``): the stored samples' log-probability and the entropy, ``[...]``."""
        del action  # the environment's (mapped) action; the sample is what was drawn
        dist = self.distribution(out)
        return dist.log_prob(extras["sample"]), dist.entropy()


def make_policy(spec: EnvSpec, config: GaussianConfig) -> CategoricalPolicy | GaussianPolicy:
    """The policy for ``spec``'s actions; continuous-action settings on a discrete environment are refused."""
    if spec.discrete:
        changed = [
            f.name
            for f in dataclasses.fields(GaussianConfig)
            if not is_traced(getattr(config, f.name)) and getattr(config, f.name) != f.default
        ]
        if changed:
            flags = ", ".join(map(flag_name, changed))
            verb = "sets" if len(changed) == 1 else "set"
            raise ValueError(
                f"{flags} {verb} how continuous actions are drawn, but this environment's actions are "
                f"discrete ({spec.num_actions} of them); leave {'it' if len(changed) == 1 else 'them'} out"
            )
        return CategoricalPolicy(spec.num_actions)
    return GaussianPolicy(spec.actions, config)
