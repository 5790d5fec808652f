# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""bfloat16 and float16 storage with float32 compute, by flash-attn's
criterion: for each operator, output and gradient, the largest error of
kdnn's result against float64 on the same 16-bit inputs is at most twice
the error of the same computation done by PyTorch in that 16-bit type.

PyTorch's 16-bit computation is modelled as its GPU kernels (and its CPU
kernels, where it has them) run it: each operation computed in float32 from
16-bit operands, and its result, forward and backward, rounded to the 16-bit
type. The inputs are a pure 16-bit model's (parameters in the 16-bit type
too), so every side sees the same values. Also: the tensors are read and
written in place (no copy), mixed dtypes are refused naming both tensors,
float32 parameters beside 16-bit activations keep float32 gradients."""
import pytest
import torch
import torch.nn.functional as F

import kdnn

HALVES = [torch.bfloat16, torch.float16]


def in_dtype(dtype, f):
    """f as one PyTorch operation on tensors of `dtype`: computed in float32,
    its result rounded to dtype (and, backward, its inputs' gradients)."""
    def op(*args):
        return f(*(a.float() if isinstance(a, torch.Tensor) else a for a in args)).to(dtype)
    return op


def largest_errors(run, inputs, grads, reference):
    """max |result - reference| of run's outputs and of the gradients of its
    inputs (outputs' gradients `grads`), each as float64."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    outs = run(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    got = list(outs) + list(torch.autograd.grad(outs, leaves, [g.to(o.dtype) for g, o in
                                                              zip(grads, outs)]))
    return [(a.double() - b).abs().max().item() for a, b in zip(got, reference)]


def check_criterion(name, dtype, kdnn_run, torch_run, exact_run, inputs, output_shapes):
    """kdnn's errors at most 2x PyTorch's in `dtype` (exact_run in float64 is
    the reference), for every output and gradient; returns both lists."""
    grads = [torch.randn(s).to(dtype) for s in output_shapes]
    leaves = [t.double().requires_grad_() for t in inputs]
    outs = exact_run(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    reference = [o.detach() for o in outs] + list(
        torch.autograd.grad(outs, leaves, [g.double() for g in grads]))
    ours = largest_errors(kdnn_run, inputs, grads, reference)
    theirs = largest_errors(torch_run, inputs, grads, reference)
    print(f"{name} {dtype}: kdnn {['%.3g' % e for e in ours]}, "
          f"PyTorch {['%.3g' % e for e in theirs]}")
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a <= 2 * b, f"{name} {dtype}: result {i}: kdnn's error {a:.3g}, PyTorch's {b:.3g}"
    return ours, theirs


def conv_as(dtype_op, silu):
    """The conv (+ SiLU) of x [B, L, C] with weight, bias and an initial
    state, each operation as `dtype_op` runs it."""
    def run(x, w, b, init):
        C = x.shape[2]
        xbar = torch.cat([init, x], 1)
        z = dtype_op(lambda xb, w, b: F.conv1d(xb.transpose(1, 2), w.unsqueeze(1), b,
                                               groups=C).transpose(1, 2))(xbar, w, b)
        return dtype_op(F.silu)(z) if silu else z
    return run


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("width", [2, 4])
def test_conv_criterion(dtype, silu, width):
    torch.manual_seed(width + 10 * silu)
    B, L, C = 2, 300, 48
    inputs = [torch.randn(B, L, C).to(dtype), (0.5 * torch.randn(C, width)).to(dtype),
              torch.randn(C).to(dtype), torch.randn(B, width - 1, C).to(dtype)]

    def kdnn_run(x, w, b, init):
        return kdnn.causal_conv1d(x, w, b, init, activation="silu" if silu else None)

    check_criterion("causal_conv1d", dtype, kdnn_run, conv_as(lambda f: in_dtype(dtype, f), silu),
                    conv_as(lambda f: f, silu), inputs, [(B, L, C)])


@pytest.mark.parametrize("dtype", HALVES)
def test_dt_softplus_criterion(dtype):
    torch.manual_seed(3)
    dt, bias = (4 * torch.randn(3, 200, 8)).to(dtype), torch.randn(8).to(dtype)
    check_criterion("dt_softplus", dtype, lambda d, b: kdnn.dt_softplus(d, b),
                    lambda d, b: in_dtype(dtype, F.softplus)(in_dtype(dtype, torch.add)(d, b)),
                    lambda d, b: F.softplus(d + b), [dt, bias], [(3, 200, 8)])


@pytest.mark.parametrize("dtype", HALVES)
def test_conv_reads_and_writes_in_place(copies, dtype):
    x = torch.randn(2, 16, 40).to(dtype).transpose(1, 2)  # causal-conv1d's [B, C, L] memory
    x.requires_grad_()
    w = torch.randn(16, 4, requires_grad=True)
    y = kdnn.causal_conv1d(x, w, activation="silu")
    y.backward(torch.randn(2, 40, 16).to(dtype))
    assert copies == []
    assert y.dtype == dtype and y.stride() == x.stride() and x.grad.stride() == x.stride()
    assert x.grad.dtype == dtype and w.grad.dtype == torch.float32


@pytest.mark.parametrize("dtype", HALVES)
def test_parameters_keep_their_dtype(dtype):
    x = torch.randn(2, 9, 3).to(dtype)
    for param_dtype in (torch.float32, dtype):
        w = torch.randn(3, 4, dtype=param_dtype, requires_grad=True)
        b = torch.randn(3, dtype=param_dtype, requires_grad=True)
        kdnn.causal_conv1d(x, w, b).sum().backward()
        assert w.grad.dtype == param_dtype and b.grad.dtype == param_dtype
        dt = torch.randn(2, 9, 3).to(dtype).requires_grad_()
        out = kdnn.dt_softplus(dt, b)
        assert out.dtype == torch.float32  # the step sizes, as mamba keeps them
        out.sum().backward()
        assert dt.grad.dtype == dtype


def test_mixed_dtypes_name_both_tensors():
    x = torch.randn(2, 9, 3, dtype=torch.bfloat16)
    with pytest.raises(kdnn.Error, match=r"causal_conv1d: initial_state has dtype torch.float16, "
                       r"expected torch.bfloat16 \(as x has torch.bfloat16\)"):
        kdnn.causal_conv1d(x, torch.randn(3, 4), initial_state=torch.zeros(2, 3, 3,
                                                                          dtype=torch.float16))
    with pytest.raises(kdnn.Error, match=r"causal_conv1d: weight has dtype torch.float16, "
                       r"expected torch.bfloat16 or torch.float32 \(as x has torch.bfloat16\)"):
        kdnn.causal_conv1d(x, torch.randn(3, 4, dtype=torch.float16))
    with pytest.raises(kdnn.Error, match=r"dt_softplus: dt_bias has dtype torch.float64, "
                       r"expected torch.float16 or torch.float32 \(as dt has torch.float16\)"):
        kdnn.dt_softplus(torch.randn(2, 9, 3, dtype=torch.float16),
                         torch.randn(3, dtype=torch.float64))
    with pytest.raises(kdnn.Error, match=r"causal_conv1d: weight has dtype torch.bfloat16, "
                       r"expected torch.float32 \(as x has torch.float32\)"):
        kdnn.causal_conv1d(torch.randn(2, 9, 3), torch.randn(3, 4, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", HALVES)
def test_conv_update_in_16_bits(dtype):
    # The decoding step continues the whole sequence's forward; its state
    # holds x's values bitwise.
    torch.manual_seed(5)
    x = torch.randn(2, 7, 6).to(dtype)
    w, b = torch.randn(6, 4), torch.randn(6)
    whole = kdnn.causal_conv1d(x, w, b, activation="silu")
    state = torch.zeros(2, 6, 3, dtype=dtype)
    for t in range(7):
        y = kdnn.causal_conv1d_update(x[:, t], state, w, b, activation="silu")
        assert y.dtype == dtype
        # Two roundings of one float value differ by a unit at most.
        torch.testing.assert_close(y, whole[:, t], rtol=2 ** -7 if dtype == torch.bfloat16
                                   else 2 ** -10, atol=1e-3)
    assert torch.equal(state, x[:, 4:].transpose(1, 2))
