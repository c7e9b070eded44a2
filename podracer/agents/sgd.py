"""Epochs of shuffled minibatch steps in a ``lax.scan``."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

UNROLL_CHOICES = ("auto", "scan", "unroll")


def resolve_unroll(choice: str) -> bool | int:
    """``lax.scan``'s ``unroll`` for the minibatch loop: ``auto`` and ``scan`` keep it rolled.

    A rolled loop compiles in a time that does not grow with the number of gradient steps. (Conv torsos used
    to be unrolled on XLA:CPU, whose generic path for conv gradients in a loop was ~15x slower; their
    gradients are now convolutions that it runs fast in a loop too: see :mod:`podracer.agents.conv`.)
    """
    if choice not in UNROLL_CHOICES:
        raise ValueError(f"unknown minibatch loop {choice!r}: choose one of {UNROLL_CHOICES}")
    return True if choice == "unroll" else 1


# Up to 2**16 elements, a permutation is one sort of 32-bit words: random bits above each element's index.
PACKED_PERMUTATION_MAX = 2**16


def random_permutation(key: jax.Array, n: int) -> jax.Array:
    """A random permutation of ``range(n)``: the indices in the order of ``n`` random draws.

    Up to :data:`PACKED_PERMUTATION_MAX` elements each draw is a 32-bit word whose low bits are the element's
    index and whose high bits (at least 16) are random, and one sort of those words is the permutation. A sort
    of one operand is the cheapest XLA:CPU has: measured on 2 cores, 18 us for 512 elements where
    ``lax.top_k``'s sort of (draw, index) pairs took 64 us (338 vs 1,311 us for 8,192), and
    ``jax.random.permutation`` sorts pairs too. PPO shuffles every epoch: CartPole at 4 envs x 128 steps ran
    188K -> 238K steps/s, at 64 envs 271K -> 312K. Draws that tie keep their index order, a negligible bias.
    Beyond that size, ``lax.top_k`` of uniform draws (23 random bits each).
    """
    if n > PACKED_PERMUTATION_MAX:
        return jax.lax.top_k(jax.random.uniform(key, (n,)), n)[1]
    index_bits = max(1, (n - 1).bit_length())
    draws = jax.random.bits(key, (n,), jnp.uint32) >> index_bits
    words = (draws << index_bits) | jnp.arange(n, dtype=jnp.uint32)
    return (jax.lax.sort(words) & ((1 << index_bits) - 1)).astype(jnp.int32)


def shuffled_minibatches(
    step: Callable,
    carry,
    batch,
    key: jax.Array,
    num_epochs: int,
    num_minibatches: int,
    unroll: bool | int = 1,
    axis: int = 0,
):
    """Runs ``step(carry, minibatch) -> (carry, metrics)`` over shuffled minibatches.

    Args:
      batch: pytree of arrays split along ``axis`` (of size ``N``, which ``num_minibatches`` must divide): ``[N,
        ...]`` transitions, or with ``axis=1`` ``[T, N, ...]`` sequences of ``N`` environments, each minibatch then
        ``[T, N / num_minibatches, ...]``.
      num_epochs: passes over ``batch``, each in a fresh random order.

    Returns:
      ``(carry, metrics)`` with metrics stacked ``[num_epochs * num_minibatches]``.
    """
    n = jax.tree.leaves(batch)[0].shape[axis]
    if n % num_minibatches:
        raise ValueError(f"{num_minibatches} minibatches do not divide a batch of {n}")

    def split(x, order):
        x = jnp.take(x, order, axis=axis)
        x = x.reshape((*x.shape[:axis], num_minibatches, -1, *x.shape[axis + 1 :]))
        return jnp.moveaxis(x, axis, 0)

    def epoch(carry, order):
        # One gather per epoch, then static slices: cheaper than a gather per minibatch.
        return jax.lax.scan(step, carry, jax.tree.map(lambda x: split(x, order), batch), unroll=unroll)

    # Every epoch's order at once: one random draw and one sort for all of them (on XLA:CPU each draw is a loop
    # of its own), the same orders as drawn one epoch at a time.
    orders = jax.vmap(lambda epoch_key: random_permutation(epoch_key, n))(jax.random.split(key, num_epochs))
    carry, metrics = jax.lax.scan(epoch, carry, orders, unroll=unroll)
    return carry, jax.tree.map(lambda m: m.reshape((-1, *m.shape[2:])), metrics)
