"""agents.dense: a matrix product whose weight gradient XLA:CPU runs through the same fast kernel as the product."""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from podracer.agents.dense import PLAIN_MATMUL, Dense, dot_general


@pytest.mark.parametrize("rows, inputs, outputs", [(128, 64, 64), (5, 4, 2), (1, 3, 1), (516, 64, 1)])
def test_values_and_gradients_are_lax_products(rows, inputs, outputs):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(rows, inputs)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(inputs, outputs)), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=(rows, outputs)), jnp.float32)
    results = {}
    for name, product in (("lax", lax.dot_general), ("ours", dot_general)):
        y, vjp = jax.vjp(lambda x, w, product=product: product(x, w, PLAIN_MATMUL), x, w)
        results[name] = (y, *vjp(cotangent))
    for ours, theirs in zip(results["ours"], results["lax"]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_other_products_are_left_to_lax():
    cases = [  # a batch of sequences, a batched product, another result type, mixed dtypes
        (jnp.ones((2, 3, 4)), jnp.ones((4, 5)), (((2,), (0,)), ((), ())), None),
        (jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5)), (((2,), (1,)), ((0,), (0,))), None),
        (jnp.ones((3, 4)), jnp.ones((4, 5)), PLAIN_MATMUL, jnp.float32),
        (jnp.ones((3, 4), jnp.bfloat16), jnp.ones((4, 5)), PLAIN_MATMUL, None),  # mixed dtypes
    ]
    for x, w, numbers, result_type in cases:
        product = functools.partial(dot_general, dimension_numbers=numbers, preferred_element_type=result_type)
        assert "custom_vjp" not in str(jax.make_jaxpr(product)(x, w))
    plain = jax.make_jaxpr(lambda x, w: dot_general(x, w, PLAIN_MATMUL))(jnp.ones((3, 4)), jnp.ones((4, 5)))
    assert "custom_vjp" in str(plain)


def test_dense_keeps_flax_parameters_and_function():
    x = jnp.asarray(np.random.default_rng(1).normal(size=(7, 3)), jnp.float32)
    ours, flax_dense = Dense(5), nn.Dense(5)
    params = flax_dense.init(jax.random.key(0), x)
    assert jax.tree.structure(ours.init(jax.random.key(0), x)) == jax.tree.structure(params)
    np.testing.assert_allclose(ours.apply(params, x), flax_dense.apply(params, x), rtol=1e-6)


def test_weight_gradients_inside_a_loop_contract_no_leading_dimension():
    """XLA:CPU runs products contracting dimension 0 (lax's ``x.T @ g``) through Eigen at half the rate of its
    small-matrix kernels or less; every product of the gradient of a dense network in a loop is the plain form."""
    if jax.default_backend() != "cpu":
        pytest.skip("a CPU compiler property")
    network = nn.Sequential([Dense(16), nn.tanh, Dense(2)])
    x = jnp.ones((8, 32, 4))
    params = network.init(jax.random.key(0), x[0])
    grad = jax.grad(lambda p, batch: jnp.sum(network.apply(p, batch) ** 2))

    def looped(params, xs):
        return lax.scan(lambda p, batch: (jax.tree.map(lambda a, g: a - 0.1 * g, p, grad(p, batch)), None), params, xs)

    hlo = jax.jit(looped).lower(params, x).compile().as_text()
    contractions = set(re.findall(r"lhs_contracting_dims=\{(\d+)\}", hlo))
    assert contractions and contractions <= {"1"}, contractions
