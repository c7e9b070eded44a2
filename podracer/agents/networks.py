"""Flax networks: torsos for vector and image observations, recurrent cores, and actor-critic heads.

Every module takes a batch ``[N, *obs_shape]`` and returns ``[N, ...]``.
Image observations are channels-last ``[H, W, C]``; uint8 pixels are scaled to [0, 1].
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from podracer.agents import conv
from podracer.agents.dense import Dense
from podracer.types import EnvSpec

TORSOS = ("auto", "mlp", "conv", "nature_cnn", "impala_resnet")
CORES = ("none", "lstm", "gru")
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {"tanh": nn.tanh, "relu": nn.relu}


# flax's convolution with gradients XLA:CPU computes fast inside loops (see podracer/agents/conv.py); same parameters.
Conv = functools.partial(nn.Conv, conv_general_dilated=conv.conv_general_dilated)


def _orthogonal(scale: float = np.sqrt(2)):
    return nn.initializers.orthogonal(scale)


def _as_float(x: jax.Array) -> jax.Array:
    return x.astype(jnp.float32) / 255.0 if x.dtype == jnp.uint8 else x.astype(jnp.float32)


class MLP(nn.Module):
    """Flattens each observation, then ``Dense -> activation`` per hidden size."""

    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x):
        x = _as_float(x).reshape((x.shape[0], -1))
        for size in self.hidden_sizes:
            x = ACTIVATIONS[self.activation](Dense(size, kernel_init=_orthogonal())(x))
        return x


class SmallConv(nn.Module):
    """For small grids such as MinAtar's 10x10: one 3x3 conv, then an MLP layer."""

    channels: int = 16
    hidden_size: int = 128

    @nn.compact
    def __call__(self, x):
        x = nn.relu(Conv(self.channels, (3, 3), kernel_init=_orthogonal())(_as_float(x)))
        x = x.reshape((x.shape[0], -1))
        return nn.relu(Dense(self.hidden_size, kernel_init=_orthogonal())(x))


class NatureCNN(nn.Module):
    """The DQN paper's torso for 84x84 frames: three convs and a 512-unit layer."""

    @nn.compact
    def __call__(self, x):
        x = _as_float(x)
        for channels, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.relu(Conv(channels, (kernel, kernel), (stride, stride), "VALID", kernel_init=_orthogonal())(x))
        x = x.reshape((x.shape[0], -1))
        return nn.relu(Dense(512, kernel_init=_orthogonal())(x))


def max_pool_same(x: jax.Array, window: int = 3, stride: int = 2) -> jax.Array:
    """``nn.max_pool(x, (window, window), (stride, stride), "SAME")`` on ``x [N, H, W, C]`` -> ``[N, ceil(H /
    stride), ceil(W / stride), C]``, as the maximum of ``window**2`` strided slices of ``x`` padded with -inf.

    The same function, but its gradient is a few selects and pads where ``reduce_window``'s is a
    ``select_and_scatter``, which XLA:CPU expands into a scatter with index arrays (``iota``s) as large as the
    padded input; those have no operands, so XLA's scheduler computes them all at the start of a learner step
    and keeps them live: an unrolled PPO update (4 epochs x 4 minibatches, IMPALA ResNet, 16 x 32 frames) asked
    for 8.5 GB of temporary memory with it.
    """
    pads, out = [(0, 0)], []
    for size in x.shape[1:3]:
        out.append(-(-size // stride))
        total = max((out[-1] - 1) * stride + window - size, 0)
        pads.append((total // 2, total - total // 2))
    x = jnp.pad(x, pads + [(0, 0)], constant_values=-jnp.inf)
    pieces = [
        x[:, i : i + stride * (out[0] - 1) + 1 : stride, j : j + stride * (out[1] - 1) + 1 : stride]
        for i in range(window)
        for j in range(window)
    ]
    return functools.reduce(jnp.maximum, pieces)


class ResidualBlock(nn.Module):
    channels: int

    @nn.compact
    def __call__(self, x):
        y = Conv(self.channels, (3, 3), kernel_init=_orthogonal())(nn.relu(x))
        y = Conv(self.channels, (3, 3), kernel_init=_orthogonal())(nn.relu(y))
        return x + y


class ImpalaResNet(nn.Module):
    """The IMPALA paper's deep torso: three (conv, max-pool, 2 residual blocks) stages, then 256 units."""

    channels: Sequence[int] = (16, 32, 32)

    @nn.compact
    def __call__(self, x):
        x = _as_float(x)
        for channels in self.channels:
            x = Conv(channels, (3, 3), kernel_init=_orthogonal())(x)
            x = max_pool_same(x)
            x = ResidualBlock(channels)(x)
            x = ResidualBlock(channels)(x)
        x = nn.relu(x).reshape((x.shape[0], -1))
        return nn.relu(Dense(256, kernel_init=_orthogonal())(x))


def resolve_torso(kind: str, spec: EnvSpec) -> str:
    """The torso ``kind`` names; ``auto``: an MLP for vectors, a small conv net for small images (MinAtar's
    10x10), the Nature CNN for larger ones (Atari's 84x84)."""
    if kind != "auto":
        return kind
    if not spec.images:
        return "mlp"
    return "nature_cnn" if min(spec.observation.shape[:2]) >= 64 else "conv"


def make_torso(kind: str, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh") -> Callable[[], nn.Module]:
    """A factory for the torso ``kind`` (already resolved, see :func:`resolve_torso`); the MLP's
    ``hidden_sizes`` and ``activation`` (a key of ``ACTIVATIONS``)."""
    factories = {
        "mlp": lambda: MLP(tuple(hidden_sizes), activation),
        "conv": SmallConv,
        "nature_cnn": NatureCNN,
        "impala_resnet": ImpalaResNet,
    }
    if kind not in factories:
        raise ValueError(f"unknown torso {kind!r}: choose one of {TORSOS}")
    return factories[kind]


class ActorCritic(nn.Module):
    """The policy head's output (``[N, A]`` logits, or a Gaussian's mean and log-std) and state values ``[N]``.

    With ``shared_torso`` both heads read one torso (the usual choice for
    images); otherwise actor and critic have torsos of their own and
    :meth:`policy` runs the actor alone, which is all acting needs.
    """

    torso: Callable[[], nn.Module]
    policy_head_factory: Callable[[], nn.Module]  # see agents.policies
    shared_torso: bool = False

    def setup(self):
        self.actor_torso = self.torso()
        if not self.shared_torso:
            self.critic_torso = self.torso()
        self.policy_head = self.policy_head_factory()
        self.value_head = Dense(1, kernel_init=_orthogonal(1.0))

    def policy(self, obs):
        return self.policy_head(self.actor_torso(obs))

    def value(self, obs):
        torso = self.actor_torso if self.shared_torso else self.critic_torso
        return self.value_head(torso(obs))[:, 0]

    def __call__(self, obs):
        actor_features = self.actor_torso(obs)
        critic_features = actor_features if self.shared_torso else self.critic_torso(obs)
        return self.policy_head(actor_features), self.value_head(critic_features)[:, 0]


def recurrent_cell(core: str, size: int) -> nn.RNNCellBase:
    """flax's LSTM (``lstm``, its carry a pair ``(c, h)``) or GRU (``gru``, ``h``) cell of ``size`` units."""
    cells = {"lstm": nn.OptimizedLSTMCell, "gru": nn.GRUCell}
    if core not in cells:
        raise ValueError(f"unknown recurrent core {core!r}: choose one of {CORES[1:]}")
    return cells[core](features=size)


class RecurrentActorCritic(nn.Module):
    """A torso, a recurrent core and the policy and value heads on the core's output.

    Actor and critic share the torso and the core (as IMPALA's and PureJaxRL's
    recurrent agents do), so one step of the core serves both heads.

    ``__call__: (core [B, ...], obs [B, ...]) -> (core, (policy out, values [B]))`` is one acting step; the
    learner replays a sequence with :meth:`embed` (``[N, ...] -> [N, F]``, all steps at once), :meth:`step`
    (``(core, [B, F]) -> (core, [B, H])``, one step at a time) and :meth:`heads` (``[N, H]`` -> policy out and
    values ``[N]``).
    """

    torso: Callable[[], nn.Module]
    policy_head_factory: Callable[[], nn.Module]
    core: str = "lstm"
    core_size: int = 128

    def setup(self):
        self.encoder = self.torso()
        self.cell = recurrent_cell(self.core, self.core_size)
        self.policy_head = self.policy_head_factory()
        self.value_head = Dense(1, kernel_init=_orthogonal(1.0))

    def embed(self, obs):
        return self.encoder(obs)

    def step(self, core, features):
        return self.cell(core, features)

    def heads(self, outputs):
        return self.policy_head(outputs), self.value_head(outputs)[:, 0]

    def __call__(self, core, obs):
        core, outputs = self.step(core, self.embed(obs))
        return core, self.heads(outputs)
