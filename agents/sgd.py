"""Epochs of shuffled minibatch steps in a ``lax.scan``."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

UNROLL_CHOICES = ("auto", "scan", "unroll")


def resolve_unroll(choice: str) -> bool | int:
    """``lax.scan``'s ``unroll`` for the minibatch loop: ``auto`` and ``scan`` keep it rolled.

    A rolled loop compiles in a time that does not grow with the number of gradient steps. (Conv torsos used
    to be unrolled on XLA:CPU, whose generic path for conv gradients in a loop was ~15x slower; their
    gradients are now convolutions that it runs fast in a loop too: see :mod:`agents.conv`.)
    """
    if choice not in UNROLL_CHOICES:
        raise ValueError(f"unknown minibatch loop {choice!r}: choose one of {UNROLL_CHOICES}")
    return True if choice == "unroll" else 1


def random_permutation(key: jax.Array, n: int) -> jax.Array:
    """A random permutation of ``range(n)``: the order of ``n`` uniform draws.

    ``lax.top_k`` sorts the draws alone, where ``jax.random.permutation`` sorts
    (key, index) pairs: about 15x faster on XLA:CPU. Draws that tie (23 random
    bits each) keep their index order, a negligible bias.
    """
    return jax.lax.top_k(jax.random.uniform(key, (n,)), n)[1]


def shuffled_minibatches(
    step: Callable,
    carry,
    batch,
    key: jax.Array,
    num_epochs: int,
    num_minibatches: int,
    unroll: bool | int = 1,
):
    """Runs ``step(carry, minibatch) -> (carry, metrics)`` over shuffled minibatches.

    Args:
      batch: pytree of ``[N, ...]`` arrays; ``num_minibatches`` must divide ``N``.
      num_epochs: passes over ``batch``, each in a fresh random order.

    Returns:
      ``(carry, metrics)`` with metrics stacked ``[num_epochs * num_minibatches]``.
    """
    n = jax.tree.leaves(batch)[0].shape[0]
    if n % num_minibatches:
        raise ValueError(f"{num_minibatches} minibatches do not divide a batch of {n}")

    def epoch(carry, key):
        # One gather per epoch, then static slices: cheaper than a gather per minibatch.
        order = random_permutation(key, n)
        minibatches = jax.tree.map(
            lambda x: jnp.take(x, order, axis=0).reshape((num_minibatches, -1, *x.shape[1:])), batch
        )
        return jax.lax.scan(step, carry, minibatches, unroll=unroll)

    carry, metrics = jax.lax.scan(epoch, carry, jax.random.split(key, num_epochs), unroll=unroll)
    return carry, jax.tree.map(lambda m: m.reshape((-1, *m.shape[2:])), metrics)
