# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Bad input raises kdnn.Error (a ValueError) naming the argument and what
was expected: never a crash, a NaN or a wrong result."""
import math
import re

import pytest
import torch

import kdnn
from kdnn import _kdnn
from kdnn._options import Options
from kdnn._tensors import DEVICES


def raises(fragment):
    return pytest.raises(kdnn.Error, match=fragment)


def test_error_is_a_value_error():
    assert issubclass(kdnn.Error, ValueError)


def test_wrong_dtype():
    with raises(r"sinkhorn: x has dtype torch.float16, expected torch.float32 or torch.float64"):
        kdnn.sinkhorn(torch.zeros(2, 3, 3, dtype=torch.float16))
    with raises(r"ssd: dt has dtype torch.float32, expected torch.float64 \(as x has "
                r"torch.float64\)"):
        kdnn.ssd(torch.zeros(1, 4, 2, 2, dtype=torch.float64), torch.zeros(1, 4, 2),
                 torch.zeros(2), torch.zeros(1, 4, 1, 2), torch.zeros(1, 4, 1, 2), chunk_size=4)
    with raises("causal_conv1d: x is a list, expected a torch.Tensor"):
        kdnn.causal_conv1d([[1.0]], torch.zeros(1, 2))


def test_wrong_device():
    with raises(r"flash_attention: q is on meta, expected a tensor on cpu"):
        q = torch.zeros(1, 1, 2, 4, device="meta")
        kdnn.flash_attention(q, q, q)


def test_wrong_rank():
    with raises(r"flash_attention: k has shape \[2, 4, 8\], expected 4 dimensions \[B, Hkv, Sk, D\]"):
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
                 torch.zeros(1, 5, 3, 2), torch.zeros(1, 5, 3, 2), chunk_size=4)


def ssd_args(dt_value=0.5, a_value=-1.0):
    dt = torch.full((1, 5, 2), 0.5)
    dt[0, 3, 1] = dt_value
    return (torch.randn(1, 5, 2, 3), dt, torch.full((2,), a_value), torch.randn(1, 5, 1, 4),
            torch.randn(1, 5, 1, 4))


@pytest.mark.parametrize("value", [-0.5, math.nan, math.inf])
def test_ssd_refuses_a_bad_dt_naming_it(value):
    # A negative step always; a NaN or an infinity with check_finite
    # (without it, it propagates: test_non_finite.py).
    check = {} if value < 0 else {"check_finite": True}
    with raises(r"dt\[0, 3, 1\]=.*expected (dt >= 0|finite values)"):
        kdnn.ssd(*ssd_args(dt_value=value), chunk_size=4, **check)


def test_ssd_refuses_a_positive_a():
    with raises(r"A\[0\]=0.5, expected a finite A <= 0"):
        kdnn.ssd(*ssd_args(a_value=0.5), chunk_size=4)


def test_bad_options():
    x = torch.zeros(2, 3, 3)
    with raises(r"sinkhorn: iters=0, expected an integer in \[1, 2147483647\]"):
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
    with raises(r"ssd: chunk_size=0, expected an integer in \[1, 2147483647\]"):
        kdnn.ssd(*ssd_args(), chunk_size=0)
    with raises(r"dt_softplus: dt_limit=\(1.0, 0.0\), expected \(low, high\) with low <= high"):
        kdnn.dt_softplus(torch.zeros(1, 2, 3), torch.zeros(3), dt_limit=(1.0, 0.0))
    with raises("causal_conv1d: activation='relu', expected one of"):
        kdnn.causal_conv1d(torch.zeros(1, 2, 3), torch.zeros(3, 2), activation="relu")


# Hostile input: options that are merely truthy, out of range, of the wrong
# type or differentiable; tensors that are None, sparse or lazily negated.
@pytest.mark.parametrize("value", [0.1, "false", 1, None])
def test_a_boolean_option_must_be_a_bool(value):
    q = torch.randn(1, 1, 3, 4)
    with raises(re.escape(f"flash_attention: causal={value!r}, expected True or False")):
        kdnn.flash_attention(q, q, q, causal=value)
    with raises(re.escape(f"ssd: return_final_states={value!r}, expected True or False")):
        kdnn.ssd(*ssd_args(), chunk_size=4, return_final_states=value)
    with raises(re.escape(f"causal_conv1d: return_final_states={value!r}, expected True or False")):
        kdnn.causal_conv1d(torch.zeros(1, 2, 3), torch.zeros(3, 2), return_final_states=value)


def test_options_are_keyword_only():
    # Tensors are positional, options keyword-only: flash-attn's fourth
    # positional argument (dropout_p) or an old positional chunk size is
    # never taken for another option.
    q = torch.randn(1, 1, 3, 4)
    x, dt, A, B, C = ssd_args()
    calls = [lambda: kdnn.flash_attention(q, q, q, 0.1),
             lambda: kdnn.sinkhorn(torch.zeros(2, 3, 3), 20),
             lambda: kdnn.causal_conv1d(torch.zeros(1, 2, 3), torch.zeros(3, 2), None, None, "silu"),
             lambda: kdnn.dt_softplus(torch.zeros(1, 2, 3), torch.zeros(3), (0.0, 1.0)),
             lambda: kdnn.ssd(x, dt, A, B, C, None, None, None, None, 4)]
    for call in calls:
        with pytest.raises(TypeError, match="positional argument"):
            call()
    # kdnn's earlier positional chunk size: chunk_size is required by keyword
    with pytest.raises(TypeError, match="keyword-only argument: 'chunk_size'"):
        kdnn.ssd(x, dt, A, B, C, 4)
    with raises(r"ssd: D is a int, expected a torch.Tensor \[H\]"):
        kdnn.ssd(x, dt, A, B, C, 4, chunk_size=4)
    with raises(r"causal_conv1d: initial_state is a str, expected a torch.Tensor"):
        kdnn.causal_conv1d(torch.zeros(1, 2, 3), torch.zeros(3, 2), None, "silu")


def test_integer_options():
    np = pytest.importorskip("numpy")
    x = torch.randn(2, 3, 3)
    torch.testing.assert_close(kdnn.sinkhorn(x, iters=np.int64(5)), kdnn.sinkhorn(x, iters=5))
    args = ssd_args()
    torch.testing.assert_close(kdnn.ssd(*args, chunk_size=np.int32(4)),
                               kdnn.ssd(*args, chunk_size=4))
    with raises(r"sinkhorn: iters=2147483648, expected an integer in \[1, 2147483647\]"):
        kdnn.sinkhorn(x, iters=2**31)
    with raises(r"ssd: chunk_size=2147483648, expected an integer in \[1, 2147483647\]"):
        kdnn.ssd(*ssd_args(), chunk_size=2**31)
    for value in (5.0, "5", True):
        with raises(re.escape(f"sinkhorn: iters={value!r}, expected an integer")):
            kdnn.sinkhorn(x, iters=value)
    q = torch.zeros(1, 1, 2, 4)
    with raises(re.escape(f"flash_attention: seed='1', expected an integer in [0, {2**64 - 1}]")):
        kdnn.flash_attention(q, q, q, dropout_p=0.5, seed="1")
    with raises(r"nn.CausalConv1d: kernel_size=0, expected an integer in \[1, 2147483647\]"):
        kdnn.nn.CausalConv1d(5, 0)


def test_real_options():
    x = torch.randn(2, 3, 3)
    q = torch.randn(1, 1, 3, 4)
    with raises("sinkhorn: eps='0.1', expected a real number"):
        kdnn.sinkhorn(x, eps="0.1")
    with raises("flash_attention: scale='2', expected a real number"):
        kdnn.flash_attention(q, q, q, scale="2")
    with raises("flash_attention: dropout_p='0.1', expected a real number"):
        kdnn.flash_attention(q, q, q, dropout_p="0.1")
    with raises("dt_softplus: dt_limit='inf', expected a real number"):
        kdnn.dt_softplus(torch.zeros(1, 2, 3), torch.zeros(3), dt_limit=(0.0, "inf"))
    with raises(r"dt_softplus: dt_limit=1.0, expected \(low, high\)"):
        kdnn.dt_softplus(torch.zeros(1, 2, 3), torch.zeros(3), dt_limit=1.0)
    # A tensor option is its value, unless it requires grad: kdnn would
    # drop its gradient (a learnable temperature would never train).
    torch.testing.assert_close(kdnn.flash_attention(q, q, q, scale=torch.tensor(0.5)),
                               kdnn.flash_attention(q, q, q, scale=0.5))
    with raises("flash_attention: scale is a tensor that requires grad"):
        kdnn.flash_attention(q, q, q, scale=torch.tensor(0.5, requires_grad=True))
    with raises("sinkhorn: eps is a tensor that requires grad"):
        kdnn.sinkhorn(x, eps=torch.tensor(0.1, requires_grad=True))
    with raises(r"sinkhorn: eps is a tensor of shape \[2\]"):
        kdnn.sinkhorn(x, eps=torch.zeros(2))


def test_required_and_unusual_tensors():
    with raises(r"causal_conv1d: weight is None, expected a torch.Tensor \[C, K\]"):
        kdnn.causal_conv1d(torch.zeros(1, 2, 3), None)
    x, dt, _, B, C = ssd_args()
    with raises(r"ssd: A is None, expected a torch.Tensor \[H\]"):
        kdnn.ssd(x, dt, None, B, C, chunk_size=4)
    with raises(r"sinkhorn: x has layout torch.sparse_coo, expected torch.strided"):
        kdnn.sinkhorn(torch.zeros(2, 3, 3).to_sparse())


def test_a_lazily_negated_tensor_is_read_with_its_sign():
    dt = torch.tensor([[[1 + 2j]]]).conj().imag  # -2, held as 2 with PyTorch's negative bit
    assert dt.is_neg() and dt.is_contiguous()
    got = kdnn.dt_softplus(dt, torch.zeros(1))
    torch.testing.assert_close(got, torch.nn.functional.softplus(torch.full((1, 1, 1), -2.0)))
    assert dt.is_neg() and float(dt) == -2.0  # the caller's tensor as it was


def test_scores_past_float32_are_an_error_not_nan():
    q = torch.full((1, 1, 4, 4), 3.0)  # every score is 36·scale
    with raises(r"fused_attention_forward: opts.scale=1e\+37 with max\|q\|=3, max\|k\|=3 and D=4 "
                r"could take a score past"):
        kdnn.flash_attention(q, q, q, scale=1e37)
    out = kdnn.flash_attention(q.double(), q.double(), q.double(), scale=1e37)  # double's range
    torch.testing.assert_close(out, q.double())
    bad = q.clone()
    bad[0, 0, 2, 1] = math.nan
    with raises(r"fused_attention_forward: k\[0, 0, 2, 1\]=nan, expected finite values"):
        kdnn.flash_attention(q, bad, q, check_finite=True)


def test_a_head_size_past_every_gpu_form_is_an_error_where_a_gpu_form_runs():
    # The largest head size of the GPU forms is 256: past it, a CUDA tensor
    # or a launch pinned to a GPU form (the extension's options; kdnn's
    # functions pin none) is refused, naming the size; the CPU's host form
    # takes it.
    q = torch.randn(1, 1, 3, 8, dtype=torch.float64)
    v = torch.randn(1, 1, 3, 264, dtype=torch.float64)
    p = torch.softmax(q @ q.transpose(-1, -2) / math.sqrt(8), dim=-1)
    torch.testing.assert_close(kdnn.flash_attention(q, q, v), p @ v)
    pinned = Options("FusedAttentionOptions", launch=Options("Launch", form=_kdnn.KernelForm.gpu))
    o, lse = torch.empty_like(v), torch.empty(1, 1, 3, dtype=torch.float64)
    with raises(r"fused_attention_forward: v's head size Dv=264, expected at most 256"):
        _kdnn.flash_attention_forward(q, q, v, o, lse, None, pinned.bound(),
                                      Options("AttentionMask").bound(), 0)
    if torch.cuda.is_available() and "cuda" in DEVICES:
        with raises(r"fused_attention_forward: v's head size Dv=264, expected at most 256"):
            kdnn.flash_attention(q.cuda(), q.cuda(), v.cuda())


def test_an_unrolled_backward_that_cannot_run_fails_at_the_forward():
    x = torch.randn(2, 4, 4, dtype=torch.float64)
    # 10^5 iterations keep 2·4·10^5 scaling values per matrix, past the CPU
    # backends' team scratch: refused before the forward runs, when x
    # requires grad; without grad the forward alone is fine.
    with raises("sinkhorn::backward_unrolled: n=4 needs"):
        kdnn.sinkhorn(x.clone().requires_grad_(), iters=100000, backward="unrolled")
    kdnn.sinkhorn(x, iters=100000, backward="unrolled")


@pytest.mark.parametrize("op", ["sinkhorn", "flash_attention", "ssd"])
def test_double_backward_is_a_clear_error(op):
    torch.manual_seed(0)
    if op == "sinkhorn":
        inputs = [torch.randn(2, 3, 3, dtype=torch.float64)]
        fn = kdnn.sinkhorn
    elif op == "flash_attention":
        inputs = [torch.randn(1, 2, 5, 4, dtype=torch.float64) for _ in range(3)]
        fn = kdnn.flash_attention
    else:
        inputs = [t.double() for t in ssd_args()]
        fn = lambda *a: kdnn.ssd(*a, chunk_size=2)  # noqa: E731
    inputs = [t.requires_grad_() for t in inputs]
    out = fn(*inputs)
    first = torch.autograd.grad((out * out).sum(), inputs[0])[0]
    # create_graph=True: the same first-order gradient, which carries the error
    grad = torch.autograd.grad((fn(*inputs) ** 2).sum(), inputs[0], create_graph=True)[0]
    torch.testing.assert_close(grad, first, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match=f"kdnn.{op}: its backward is not differentiable"):
        torch.autograd.grad(grad.sum(), inputs[0])
