# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Bad input raises kdnn.Error (a ValueError) naming the argument and what
was expected: never a crash, a NaN or a wrong result."""
import math

import pytest
import torch

import kdnn


def raises(fragment):
    return pytest.raises(kdnn.Error, match=fragment)


def test_error_is_a_value_error():
    assert issubclass(kdnn.Error, ValueError)


def test_wrong_dtype():
    with raises(r"sinkhorn: x has dtype torch.float16, expected torch.float32 or torch.float64"):
        kdnn.sinkhorn(torch.zeros(2, 3, 3, dtype=torch.float16))
    with raises(r"ssd: dt has dtype torch.float32, expected torch.float64 \(as the first tensor\)"):
        kdnn.ssd(torch.zeros(1, 4, 2, 2, dtype=torch.float64), torch.zeros(1, 4, 2),
                 torch.zeros(2), torch.zeros(1, 4, 1, 2), torch.zeros(1, 4, 1, 2), 4)
    with raises("causal_conv1d: x is a list, expected a torch.Tensor"):
        kdnn.causal_conv1d([[1.0]], torch.zeros(1, 2))


def test_wrong_device():
    with raises(r"flash_attention: q is on meta, expected a tensor on cpu"):
        q = torch.zeros(1, 1, 2, 4, device="meta")
        kdnn.flash_attention(q, q, q)


def test_wrong_rank():
    with raises(r"flash_attention: k has shape \[2, 4, 8\], expected 4 dimensions \[B, H, Sk, D\]"):
        kdnn.flash_attention(torch.zeros(1, 2, 4, 8), torch.zeros(2, 4, 8), torch.zeros(1, 2, 4, 8))
    with raises(r"sinkhorn: x has shape \[5\], expected at least 2 dimensions"):
        kdnn.sinkhorn(torch.zeros(5))


def test_mismatched_shapes_are_the_cpp_checks():
    x = torch.zeros(2, 9, 6)
    with raises(r"causal_conv1d_forward: w has extent\(0\)=5, expected 6"):
        kdnn.causal_conv1d(x, torch.zeros(5, 4))
    q = torch.zeros(1, 2, 4, 8)
    with raises(r"fused_attention_forward: k has extent\(3\)=7, expected 8"):
        kdnn.flash_attention(q, torch.zeros(1, 2, 4, 7), q)
    with raises(r"ssd_forward: B has extent\(2\)=3, expected a number of groups G >= 1 that divides H=4"):
        kdnn.ssd(torch.zeros(1, 5, 4, 2), torch.zeros(1, 5, 4), -torch.ones(4),
                 torch.zeros(1, 5, 3, 2), torch.zeros(1, 5, 3, 2), 4)


def ssd_args(dt_value=0.5, a_value=-1.0):
    dt = torch.full((1, 5, 2), 0.5)
    dt[0, 3, 1] = dt_value
    return (torch.randn(1, 5, 2, 3), dt, torch.full((2,), a_value), torch.randn(1, 5, 1, 4),
            torch.randn(1, 5, 1, 4))


@pytest.mark.parametrize("value", [-0.5, math.nan, math.inf])
def test_ssd_refuses_a_bad_dt_naming_it(value):
    with raises(r"dt\[0, 3, 1\]=.*expected a finite dt >= 0"):
        kdnn.ssd(*ssd_args(dt_value=value), 4)


def test_ssd_refuses_a_positive_a():
    with raises(r"A\[0\]=0.5, expected A <= 0"):
        kdnn.ssd(*ssd_args(a_value=0.5), 4)


def test_bad_options():
    x = torch.zeros(2, 3, 3)
    with raises("sinkhorn: iters=0, expected an int >= 1"):
        kdnn.sinkhorn(x, iters=0)
    with raises("sinkhorn: order='cols', expected one of"):
        kdnn.sinkhorn(x, order="cols")
    with raises("sinkhorn: backward='auto', expected one of"):
        kdnn.sinkhorn(x, backward="auto")
    with raises(r"sinkhorn: eps=nan, expected in \[0, 1\]"):
        kdnn.sinkhorn(x, eps=math.nan)
    q = torch.zeros(1, 1, 2, 4)
    with raises(r"flash_attention: dropout_p=1.0, expected in \[0, 1\)"):
        kdnn.flash_attention(q, q, q, dropout_p=1.0)
    with raises("flash_attention: scale=inf, expected a finite number"):
        kdnn.flash_attention(q, q, q, scale=math.inf)
    with raises("ssd: chunk_size=0, expected an int >= 1"):
        kdnn.ssd(*ssd_args(), 0)
    with raises(r"dt_softplus: dt_limit=\(1.0, 0.0\), expected \(low, high\) with low <= high"):
        kdnn.dt_softplus(torch.zeros(1, 2, 3), torch.zeros(3), (1.0, 0.0))
    with raises("causal_conv1d: activation='relu', expected one of"):
        kdnn.causal_conv1d(torch.zeros(1, 2, 3), torch.zeros(3, 2), activation="relu")
