"""Epochs of shuffled minibatch steps, with the loop structure chosen per backend."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

UNROLL_CHOICES = ("auto", "scan", "unroll")


def resolve_unroll(choice: str, has_conv: bool) -> bool | int:
    """``lax.scan``'s ``unroll`` for the minibatch loop.

    XLA:CPU takes a far slower path for convolution gradients inside a rolled
    ``lax.scan`` (measured on a 2-core CPU: a Nature-CNN PPO learner took ~6
    sample-gradients/s inside the scan, ~102 unrolled), so ``auto`` unrolls the loop
    for conv networks on the CPU backend and keeps it rolled elsewhere (shorter
    compiles, same speed).
    """
    if choice not in UNROLL_CHOICES:
        raise ValueError(f"unknown minibatch loop {choice!r}: choose one of {UNROLL_CHOICES}")
    if choice == "auto":
        return True if has_conv and jax.default_backend() == "cpu" else 1
    return True if choice == "unroll" else 1


def minibatch_loop(step: Callable, carry, xs, unroll: bool | int = 1):
    """``lax.scan(step, carry, xs, unroll=unroll)``, where ``unroll=True`` is a Python loop.

    jax lowers a fully unrolled ``lax.scan`` of length 1 to a ``while`` loop of one
    trip, which XLA keeps, and convolution gradients inside a loop body take XLA:CPU's
    slow path: a PPO update with ``--num-epochs 1`` (IMPALA ResNet, 16 x 32 Breakout
    frames, 4 minibatches) took 71 s where two epochs took 9. A Python loop has no
    loop to lower.

    Returns:
      ``(carry, outputs)`` with outputs stacked ``[len(xs), ...]``, as ``lax.scan``.
    """
    if unroll is not True:
        return jax.lax.scan(step, carry, xs, unroll=unroll)
    outputs = []
    for index in range(jax.tree.leaves(xs)[0].shape[0]):
        carry, output = step(carry, jax.tree.map(lambda x: x[index], xs))
        outputs.append(output)
    return carry, jax.tree.map(lambda *pieces: jnp.stack(pieces), *outputs)


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
        return minibatch_loop(step, carry, minibatches, unroll)

    carry, metrics = minibatch_loop(epoch, carry, jax.random.split(key, num_epochs), unroll)
    return carry, jax.tree.map(lambda m: m.reshape((-1, *m.shape[2:])), metrics)
