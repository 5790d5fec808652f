# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.causal_conv1d, kdnn.dt_softplus and kdnn.ssd against PyTorch
formulations (F.conv1d, softplus, the chunked SSD of kdnn_reference) and
finite differences."""
import math

import pytest
import torch
import torch.nn.functional as F
from common import DTYPES, TOLERANCE, assert_matches
from kdnn_reference import ssd as ssd_reference

import kdnn


def conv_reference(x, w, bias=None, silu=False, init=None):
    """Depthwise causal conv1d by F.conv1d, channel-last, and the final state."""
    B, L, C = x.shape
    K = w.shape[1]
    if init is None:
        init = x.new_zeros(B, K - 1, C)
    xx = torch.cat([init, x], dim=1)  # [B, K-1+L, C]
    y = F.conv1d(xx.transpose(1, 2), w[:, None, :], bias, groups=C).transpose(1, 2)
    return (F.silu(y) if silu else y), xx[:, xx.shape[1] - (K - 1):]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [1, 2, 4, 5])
@pytest.mark.parametrize("options", [dict(), dict(bias=True, silu=True),
                                     dict(bias=True, silu=True, init=True)])
def test_conv_matches_conv1d(dtype, K, options):
    B, L, C = 2, 19, 6
    x = torch.randn(B, L, C, dtype=dtype, requires_grad=True)
    w = torch.randn(C, K, dtype=dtype, requires_grad=True)
    bias = torch.randn(C, dtype=dtype, requires_grad=True) if options.get("bias") else None
    init = (torch.randn(B, K - 1, C, dtype=dtype, requires_grad=True)
            if options.get("init") else None)
    silu = options.get("silu", False)
    y, fin = kdnn.causal_conv1d(x, w, bias, init, activation="silu" if silu else None,
                                return_final_states=True)
    leaves = [t for t in (x, w, bias, init) if t is not None]
    assert_matches((y, fin), conv_reference(x, w, bias, silu, init), leaves, **TOLERANCE[dtype])


def test_conv_gradcheck():
    x = torch.randn(2, 7, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    init = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *a: kdnn.causal_conv1d(*a, activation="silu", return_final_states=True),
        (x, w, b, init))


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_takes_any_strides(dtype):
    # x channel-first (a contiguous [B, C, L] transposed), a sliced x and an
    # expanded gradient are read in place; the results are those of
    # contiguous copies (to the rounding of differently vectorised loops),
    # and y and x's gradient follow x's dimension order.
    w, b = torch.randn(6, 4, dtype=dtype), torch.randn(6, dtype=dtype)
    for x in (torch.randn(2, 6, 40, dtype=dtype).transpose(1, 2),
              torch.randn(2, 40, 12, dtype=dtype)[:, :, ::2]):
        xs = x.detach().requires_grad_()
        xc = x.detach().contiguous().requires_grad_()
        y = kdnn.causal_conv1d(xs, w, b, activation="silu")
        yc = kdnn.causal_conv1d(xc, w, b, activation="silu")
        y.sum().backward()  # an expanded gradient: stride 0 everywhere
        yc.sum().backward()
        torch.testing.assert_close(y, yc, **TOLERANCE[dtype])
        torch.testing.assert_close(xs.grad, xc.grad, **TOLERANCE[dtype])
        if x.stride(1) == 1:
            assert y.stride(1) == 1 and xs.grad.stride(1) == 1


def test_conv_module():
    m = kdnn.nn.CausalConv1d(8, kernel_size=4, dtype=torch.float64)
    x = torch.randn(2, 11, 8, dtype=torch.float64)
    torch.testing.assert_close(m(x), conv_reference(x, m.weight, m.bias, True)[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("limit", [(0.0, math.inf), (0.01, 0.5)])
def test_dt_softplus(dtype, limit):
    dt = (5 * torch.randn(2, 9, 4, dtype=dtype)).requires_grad_(True)
    bias = torch.randn(4, dtype=dtype, requires_grad=True)
    assert_matches(kdnn.dt_softplus(dt, bias, dt_limit=limit), F.softplus(dt + bias).clamp(*limit),
                   (dt, bias), **TOLERANCE[dtype])


def test_dt_softplus_gradcheck():
    dt = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda d, b: kdnn.dt_softplus(d, b, dt_limit=(0.1, 2.0)), (dt, bias))


def ssd_inputs(dtype, b=2, L=21, h=4, p=3, g=2, n=5, D=True, init=True):
    def leaf(t):
        return t.to(dtype).requires_grad_(True)
    x = leaf(torch.randn(b, L, h, p))
    dt = leaf(F.softplus(torch.randn(b, L, h)))
    A = leaf(-torch.rand(h) - 0.1)
    B, C = leaf(torch.randn(b, L, g, n)), leaf(torch.randn(b, L, g, n))
    Dv = leaf(torch.randn(h)) if D else None
    s0 = leaf(torch.randn(b, h, p, n)) if init else None
    return x, dt, A, B, C, Dv, s0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [1, 4, 8, 64])
@pytest.mark.parametrize("optional", [False, True])
def test_ssd_matches_the_chunked_formulation(dtype, chunk, optional):
    x, dt, A, B, C, D, s0 = ssd_inputs(dtype, D=optional, init=optional)
    y, fin = kdnn.ssd(x, dt, A, B, C, D, s0, chunk_size=chunk, return_final_states=True)
    leaves = [t for t in (x, dt, A, B, C, D, s0) if t is not None]
    assert_matches((y, fin), ssd_reference.ssd_chunked(x, dt, A, B, C, chunk, D=D, init=s0), leaves,
                   **TOLERANCE[dtype])


def test_ssd_gradcheck():
    args = ssd_inputs(torch.float64, b=1, L=6, h=2, p=2, g=1, n=3)
    x, dt, A, B, C, D, s0 = args
    assert torch.autograd.gradcheck(
        lambda *a: kdnn.ssd(*a, chunk_size=4, return_final_states=True),
        args)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ssd_with_d_per_channel(dtype):
    x, dt, A, B, C, _, s0 = ssd_inputs(dtype, D=False)
    D = torch.randn(4, 3, dtype=dtype, requires_grad=True)  # [H, P]
    y = kdnn.ssd(x, dt, A, B, C, D, s0, chunk_size=8)
    assert_matches(y, ssd_reference.ssd_chunked(x, dt, A, B, C, 8, D=D, init=s0)[0],
                   [x, dt, A, B, C, D, s0], **TOLERANCE[dtype])
    args = ssd_inputs(torch.float64, b=1, L=6, h=2, p=3, g=1, n=2, D=False)
    Dd = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, dt, A, B, C, D, s0: kdnn.ssd(x, dt, A, B, C, D, s0, chunk_size=4),
        (*args[:5], Dd, args[6]))
    with pytest.raises(kdnn.Error, match=r"ssd: D has shape \[3, 4\], expected \[H\] = \[4\] "
                                         r"or \[H, P\] = \[4, 3\] \(from x\)"):
        kdnn.ssd(x, dt, A, B, C, torch.randn(3, 4, dtype=dtype), chunk_size=8)


STEP_OPTIONS = [dict(dt_softplus=True, bias=True, gate=True),
                dict(dt_softplus=True, dt_limit=(0.1, 0.8)),
                dict(bias=True), dict(gate=True), dict(dt_limit=(-math.inf, 0.5), gate=True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options", STEP_OPTIONS)
def test_ssd_transforms_dt_and_gates_inside_the_call(dtype, options):
    """dt_bias, dt_softplus, dt_limit and z as mamba's
    mamba_chunk_scan_combined: clamp(f(dt + dt_bias), *dt_limit) as the
    step sizes, then y * silu(z); gradients of every input."""
    x, _, A, B, C, D, s0 = ssd_inputs(dtype)
    bias = torch.randn(4, dtype=dtype, requires_grad=True) if options.get("bias") else None
    # Some steps below 0 where softplus or the lower limit 0 takes them up.
    low = -0.3 if options.get("dt_softplus") or bias is not None else 0.05
    dt = (torch.rand(2, 21, 4, dtype=dtype) * 0.7 + low).requires_grad_()
    z = torch.randn_like(x, requires_grad=True) if options.get("gate") else None
    softplus = options.get("dt_softplus", False)
    limit = options.get("dt_limit", (0.0, math.inf))
    y, fin = kdnn.ssd(x, dt, A, B, C, D, s0, z, bias, chunk_size=8, dt_softplus=softplus,
                      dt_limit=limit, return_final_states=True)
    steps = dt if bias is None else dt + bias
    steps = (F.softplus(steps) if softplus else steps).clamp(*limit)
    want_y, want_fin = ssd_reference.ssd_chunked(x, steps, A, B, C, 8, D=D, init=s0)
    if z is not None:
        want_y = want_y * F.silu(z)
    leaves = [t for t in (x, dt, A, B, C, D, s0, z, bias) if t is not None]
    assert_matches((y, fin), (want_y, want_fin), leaves, **TOLERANCE[dtype])


def test_ssd_transform_and_gate_gradcheck():
    x, _, A, B, C, D, s0 = ssd_inputs(torch.float64, b=1, L=6, h=2, p=2, g=1, n=3)
    dt = torch.randn(1, 6, 2, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(2, dtype=torch.float64, requires_grad=True)
    z = torch.randn_like(x, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *a: kdnn.ssd(*a, chunk_size=4, dt_softplus=True, dt_limit=(0.05, 3.0),
                            return_final_states=True),
        (x, dt, A, B, C, D, s0, z, bias))


def test_ssd_step_options_are_checked():
    x, dt, A, B, C, D, _ = ssd_inputs(torch.float64)
    with pytest.raises(kdnn.Error, match=r"ssd: dt_softplus=1, expected True or False"):
        kdnn.ssd(x, dt, A, B, C, chunk_size=8, dt_softplus=1)
    with pytest.raises(kdnn.Error, match=r"ssd: dt_limit=\(1.0, 0.5\), expected \(low, high\)"):
        kdnn.ssd(x, dt, A, B, C, chunk_size=8, dt_limit=(1.0, 0.5))
    with pytest.raises(kdnn.Error, match=r"dt_bias has extent\(0\)=3, expected 4"):
        kdnn.ssd(x, dt, A, B, C, None, None, None, torch.zeros(3, dtype=torch.float64),
                 chunk_size=8)
    with pytest.raises(kdnn.Error, match=r"z has extent\(1\)=3, expected 21"):
        kdnn.ssd(x, dt, A, B, C, None, None, x[:, :3], chunk_size=8)
    # Without the transform dt is the step sizes: a negative one is refused;
    # with it (a zero bias, the default limits) it is clamped to 0.
    bad = dt.detach().clone()
    bad[0, 3, 1] = -0.5
    with pytest.raises(kdnn.Error, match=r"dt\[0, 3, 1\]=-0.5, expected dt >= 0"):
        kdnn.ssd(x, bad, A, B, C, chunk_size=8)
    zero = torch.zeros(4, dtype=torch.float64)
    torch.testing.assert_close(kdnn.ssd(x, bad, A, B, C, None, None, None, zero, chunk_size=8),
                               kdnn.ssd(x, bad.clamp(min=0), A, B, C, chunk_size=8))


def test_ssd_output_only_and_an_empty_sequence():
    x, dt, A, B, C, D, _ = ssd_inputs(torch.float64, L=0, init=False)
    y = kdnn.ssd(x, dt, A, B, C, D, chunk_size=8)
    y.sum().backward()
    assert y.shape == x.shape and A.grad is not None and torch.all(A.grad == 0)
