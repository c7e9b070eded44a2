"""agents.conv: lax's convolution with gradients that stay in XLA:CPU's fast form inside loops."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from podracer.agents.conv import NHWC, conv_general_dilated

CASES = [  # input shape, kernel size, out channels, stride, padding
    ((3, 36, 36, 4), 8, 8, 4, "VALID"),  # the Nature CNN's three
    ((3, 8, 8, 8), 4, 8, 2, "VALID"),
    ((3, 3, 3, 8), 3, 4, 1, "VALID"),
    ((3, 12, 12, 3), 3, 5, 1, "SAME"),  # the IMPALA ResNet's
    ((3, 10, 7, 3), 3, 8, 2, "SAME"),  # MuZero's downsampling, odd sizes
    ((3, 11, 9, 3), 3, 4, 2, ((1, 2), (0, 1))),
    ((3, 6, 6, 3), 1, 4, 1, "SAME"),
    ((3, 2, 2, 3), 3, 4, 1, "VALID"),  # no output pixels
]


@pytest.mark.parametrize("shape, kernel, out_channels, stride, padding", CASES)
def test_values_and_gradients_are_lax_convolutions(shape, kernel, out_channels, stride, padding):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=shape), jnp.float32)
    w = jnp.asarray(rng.normal(size=(kernel, kernel, shape[-1], out_channels)) * 0.1, jnp.float32)
    outputs = {}
    for name, conv in (("lax", lax.conv_general_dilated), ("ours", conv_general_dilated)):
        y, vjp = jax.vjp(lambda x, w, conv=conv: conv(x, w, (stride, stride), padding, dimension_numbers=NHWC), x, w)
        cotangent = jnp.asarray(np.random.default_rng(1).normal(size=y.shape), jnp.float32)
        outputs[name] = (y, *vjp(cotangent))
    for ours, theirs in zip(outputs["ours"], outputs["lax"]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_other_convolutions_are_left_to_lax():
    x, w = jnp.ones((2, 8, 8, 4)), jnp.ones((3, 3, 2, 6))
    cases = [
        dict(window_strides=(1, 1), padding="SAME", feature_group_count=2, dimension_numbers=NHWC),
        dict(window_strides=(1, 1), padding="SAME", rhs_dilation=[2, 2], dimension_numbers=NHWC, feature_group_count=2),
        dict(
            window_strides=(1, 1),
            padding=((1, 1), (1, 1)),
            lhs_dilation=[2, 1],
            dimension_numbers=NHWC,
            feature_group_count=2,
        ),
    ]
    for kwargs in cases:
        jaxpr = str(jax.make_jaxpr(lambda x, w, kwargs=kwargs: conv_general_dilated(x, w, **kwargs))(x, w))
        assert "custom_vjp" not in jaxpr
        np.testing.assert_allclose(conv_general_dilated(x, w, **kwargs), lax.conv_general_dilated(x, w, **kwargs))
    nchw = jnp.ones((2, 4, 8, 8))
    jaxpr = str(jax.make_jaxpr(lambda x: conv_general_dilated(x, jnp.ones((6, 4, 3, 3)), (1, 1), "SAME"))(nchw))
    assert "custom_vjp" not in jaxpr  # lax's default dimension numbers (NCHW, OIHW)
    assert "custom_vjp" in str(
        jax.make_jaxpr(
            lambda x: conv_general_dilated(
                x, jnp.ones((3, 3, 4, 6)), (1, 1), "SAME", lhs_dilation=[1, 1], dimension_numbers=NHWC
            )
        )(x)
    )


def test_gradients_inside_a_loop_compile_to_nhwc_convolutions():
    """The form XLA:CPU hands to Eigen (``b01f_01io->b01f``); lax's own gradients inside a loop compile to
    others (``f01b_i01o->01bf``), which it runs through a generic loop nest 15-50x slower."""
    if jax.default_backend() != "cpu":
        pytest.skip("a CPU compiler property")
    x, w = jnp.ones((4, 12, 12, 3)), jnp.ones((3, 3, 3, 8))
    grad = jax.grad(lambda x, w: conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=NHWC).sum(), (0, 1))

    def looped(x, w):
        return lax.fori_loop(0, 2, lambda i, total: jax.tree.map(jnp.add, total, grad(x * i, w)), (x * 0, w * 0))

    hlo = jax.jit(looped).lower(x, w).compile().as_text()
    forms = set(re.findall(r"dim_labels=([\w>-]+)", hlo))
    assert forms == {"b01f_01io->b01f"}, forms
