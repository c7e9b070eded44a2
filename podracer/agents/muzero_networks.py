"""MuZero's three functions as one flax module: representation, dynamics, prediction.

Hidden states are min-max normalised to [0, 1] per example (as in MuZero).
Rewards and values come out as logits over a categorical support (see
``podracer.agents.muzero`` for the transform). Two families:

* ``mlp`` for vector observations: MLPs over a flat embedding.
* ``resnet`` for images (channels-last): the MuZero paper's downsampling
  residual representation and residual dynamics, with configurable widths.

With ``projection_size > 0`` either family also has EfficientZero's SimSiam
projection of hidden states (``project``, ``project_and_predict``), which its
consistency loss compares (see :func:`podracer.agents.muzero.consistency_loss`).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from podracer.agents.dense import Dense
from podracer.agents.networks import Conv, ResidualBlock, _as_float


def _normalise(state: jax.Array) -> jax.Array:
    axes = tuple(range(1, state.ndim))
    low, high = state.min(axis=axes, keepdims=True), state.max(axis=axes, keepdims=True)
    return (state - low) / (high - low + 1e-5)


class _MLP(nn.Module):
    sizes: Sequence[int]

    @nn.compact
    def __call__(self, x):
        for size in self.sizes:
            x = nn.relu(Dense(size)(x))
        return x


class Projection(nn.Module):
    """EfficientZero's projection and prediction heads (SimSiam), over flattened hidden states.

    ``__call__: [N, ...] -> [N, size]`` projects a state; ``predict: [N, size] -> [N, size]`` is the head only
    the online (dynamics) branch goes through. Layer norm stands in for EfficientZero's batch norm, which would
    need batch statistics threaded through the search.
    """

    size: int

    def setup(self):
        self.hidden = Dense(self.size)
        self.norm = nn.LayerNorm()
        self.out = Dense(self.size)
        self.predict_hidden = Dense(self.size // 2)
        self.predict_out = Dense(self.size)

    def __call__(self, state):
        x = state.reshape((state.shape[0], -1))
        return self.out(nn.relu(self.norm(self.hidden(x))))

    def predict(self, projected):
        return self.predict_out(nn.relu(self.predict_hidden(projected)))


class _Consistency:
    """The projection methods both families share; ``projection_size == 0``: none (and no parameters)."""

    def project(self, state):
        """``[N, ...] -> [N, P]``: the target branch (a representation's state, under stop-gradient)."""
        return self.projection(state)

    def project_and_predict(self, state):
        """``[N, ...] -> [N, P]``: the online branch (a dynamics state)."""
        return self.projection.predict(self.projection(state))

    def _init_projection(self, state):
        if self.projection_size:  # creates its parameters at init
            self.project_and_predict(state)


class MuZeroMLP(_Consistency, nn.Module):
    """``represent: [N, *obs] -> [N, E]``, ``dynamics: ([N, E], [N]) -> ([N, E], [N, bins])``,
    ``predict: [N, E] -> ([N, A], [N, bins])``."""

    num_actions: int
    support_bins: int
    embedding_size: int = 64
    hidden_sizes: Sequence[int] = (64, 64)
    projection_size: int = 0

    def setup(self):
        self.representation = _MLP(tuple(self.hidden_sizes))
        self.embed = Dense(self.embedding_size)
        self.transition = _MLP(tuple(self.hidden_sizes))
        self.next_state = Dense(self.embedding_size)
        self.reward_head = Dense(self.support_bins, kernel_init=nn.initializers.zeros)
        self.prediction = _MLP(tuple(self.hidden_sizes))
        self.policy_head = Dense(self.num_actions, kernel_init=nn.initializers.zeros)
        self.value_head = Dense(self.support_bins, kernel_init=nn.initializers.zeros)
        if self.projection_size:
            self.projection = Projection(self.projection_size)

    def represent(self, obs):
        x = _as_float(obs).reshape((obs.shape[0], -1))
        return _normalise(self.embed(self.representation(x)))

    def dynamics(self, state, action):
        x = jnp.concatenate([state, jax.nn.one_hot(action, self.num_actions)], axis=-1)
        features = self.transition(x)
        return _normalise(self.next_state(features)), self.reward_head(features)

    def predict(self, state):
        features = self.prediction(state)
        return self.policy_head(features), self.value_head(features)

    def __call__(self, obs, action):
        state = self.represent(obs)
        next_state, reward = self.dynamics(state, action)
        self._init_projection(next_state)
        return self.predict(next_state), reward


class Downsample(nn.Module):
    """MuZero's Atari representation: two stride-2 convs and two average pools (/16), residual blocks between."""

    channels: Sequence[int]

    @nn.compact
    def __call__(self, obs):
        small, large = self.channels
        x = Conv(small, (3, 3), strides=(2, 2))(_as_float(obs))
        x = ResidualBlock(small)(ResidualBlock(small)(x))
        x = Conv(large, (3, 3), strides=(2, 2))(x)
        for _ in range(3):
            x = ResidualBlock(large)(x)
        x = nn.avg_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for _ in range(3):
            x = ResidualBlock(large)(x)
        return nn.avg_pool(x, (3, 3), strides=(2, 2), padding="SAME")


class MuZeroResNet(_Consistency, nn.Module):
    """The same interface as :class:`MuZeroMLP` for ``[N, H, W, C]`` frames; states are ``[N, H/16, W/16, C2]``."""

    num_actions: int
    support_bins: int
    channels: Sequence[int] = (32, 64)  # the MuZero paper: (128, 256)
    dynamics_blocks: int = 2
    projection_size: int = 0

    def setup(self):
        large = self.channels[1]
        self.downsample = Downsample(tuple(self.channels))
        self.transition = Conv(large, (3, 3))
        self.blocks = [ResidualBlock(large) for _ in range(self.dynamics_blocks)]
        self.reward_conv = Conv(16, (1, 1))
        self.reward_head = Dense(self.support_bins, kernel_init=nn.initializers.zeros)
        self.prediction = ResidualBlock(large)
        self.head_conv = Conv(16, (1, 1))
        self.policy_head = Dense(self.num_actions, kernel_init=nn.initializers.zeros)
        self.value_head = Dense(self.support_bins, kernel_init=nn.initializers.zeros)
        if self.projection_size:
            self.projection = Projection(self.projection_size)

    def represent(self, obs):
        return _normalise(self.downsample(obs))

    def dynamics(self, state, action):
        planes = jnp.broadcast_to(
            jax.nn.one_hot(action, self.num_actions)[:, None, None, :], (*state.shape[:3], self.num_actions)
        )
        x = nn.relu(self.transition(jnp.concatenate([state, planes], axis=-1)))
        for block in self.blocks:
            x = block(x)
        reward = self.reward_head(nn.relu(self.reward_conv(x)).reshape((x.shape[0], -1)))
        return _normalise(x), reward

    def predict(self, state):
        x = nn.relu(self.head_conv(self.prediction(state))).reshape((state.shape[0], -1))
        return self.policy_head(x), self.value_head(x)

    def __call__(self, obs, action):
        state = self.represent(obs)
        next_state, reward = self.dynamics(state, action)
        self._init_projection(next_state)
        return self.predict(next_state), reward
