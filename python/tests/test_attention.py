# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.flash_attention against softmax(scale q k^T, masked) v written with
torch, its backward against autograd through that and finite differences,
and its dropout mask against the NumPy Philox of kdnn_reference."""
import math

import pytest
import torch
from common import DTYPES, TOLERANCE, assert_matches
from kdnn_reference import philox

import kdnn
from kdnn._tensors import DEVICES


def reference(q, k, v, causal=False, scale=None, keep=None, p=0.0):
    """Attention written plainly; a query row with no visible key is zero."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q @ k.transpose(-1, -2)
    if causal:
        S, Sk = s.shape[-2:]
        seen = torch.ones(S, Sk, dtype=torch.bool).tril()
        s = s.masked_fill(~seen, -math.inf)
    P = torch.softmax(s, dim=-1)
    if keep is not None:
        P = P * keep.to(P.dtype) / (1.0 - p)
    return P @ v


def inputs(dtype, B=2, H=3, S=17, Sk=17, D=32, Dv=32, grad=False):
    q = torch.randn(B, H, S, D, dtype=dtype, requires_grad=grad)
    k = torch.randn(B, H, Sk, D, dtype=dtype, requires_grad=grad)
    v = torch.randn(B, H, Sk, Dv, dtype=dtype, requires_grad=grad)
    return q, k, v


SHAPES = [dict(), dict(S=1, Sk=1), dict(S=40, Sk=23, D=16, Dv=8), dict(S=9, Sk=70, D=64, Dv=64)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_backward_match_the_reference(dtype, shape, causal):
    q, k, v = inputs(dtype, grad=True, **shape)
    assert_matches(kdnn.flash_attention(q, k, v, causal=causal), reference(q, k, v, causal),
                   (q, k, v), **TOLERANCE[dtype])


def test_scale():
    q, k, v = inputs(torch.float64)
    torch.testing.assert_close(kdnn.flash_attention(q, k, v, scale=0.3),
                               reference(q, k, v, scale=0.3))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_attention(dtype, kv_heads, causal):
    # k and v with fewer heads (GQA; MQA with one): query head h reads
    # head h // (H // Hkv), as k and v repeated for each group.
    q = torch.randn(2, 4, 19, 32, dtype=dtype, requires_grad=True)
    k = torch.randn(2, kv_heads, 23, 32, dtype=dtype, requires_grad=True)
    v = torch.randn(2, kv_heads, 23, 16, dtype=dtype, requires_grad=True)
    group = 4 // kv_heads
    expected = reference(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1),
                         causal)
    assert_matches(kdnn.flash_attention(q, k, v, causal=causal), expected, (q, k, v),
                   **TOLERANCE[dtype])


def test_grouped_query_attention_gradcheck_and_errors():
    q = torch.randn(1, 4, 5, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 4, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: kdnn.flash_attention(q, k, v, causal=True, dropout_p=0.3, seed=4),
        (q, k, v))
    with pytest.raises(kdnn.Error, match="k has extent\\(1\\)=3, expected a number of key/value "
                                         "heads that divides H=4"):
        kdnn.flash_attention(q, torch.randn(1, 3, 4, 3, dtype=torch.float64),
                             torch.randn(1, 3, 4, 2, dtype=torch.float64))


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal):
    q, k, v = inputs(torch.float64, B=1, H=2, S=5, Sk=4, D=3, Dv=2, grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: kdnn.flash_attention(q, k, v, causal=causal),
                                    (q, k, v))


def test_dropout_is_kdnns_philox_mask():
    p, seed, offset = 0.25, 12345 + (7 << 32), 3
    q, k, v = inputs(torch.float64, S=12, Sk=10, grad=True)
    out = kdnn.flash_attention(q, k, v, dropout_p=p, seed=seed, offset=offset)
    keep = torch.from_numpy(philox.dropout_keep((2, 3, 12, 10), p, seed, offset))
    assert_matches(out, reference(q, k, v, keep=keep, p=p), (q, k, v))


def test_dropout_gradcheck_and_seed_from_torch():
    q, k, v = inputs(torch.float64, B=1, H=1, S=4, Sk=5, D=3, Dv=3, grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: kdnn.flash_attention(q, k, v, dropout_p=0.3, seed=5), (q, k, v))
    torch.manual_seed(1)
    a = kdnn.flash_attention(q, k, v, dropout_p=0.5)
    b = kdnn.flash_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(1)
    torch.testing.assert_close(kdnn.flash_attention(q, k, v, dropout_p=0.5), a)
    assert not torch.equal(a, b)  # a fresh mask per call


def test_empty_batch():
    q, k, v = inputs(torch.float32, B=0, grad=True)
    out = kdnn.flash_attention(q, k, v)
    out.sum().backward()
    assert out.shape == (0, 3, 17, 32) and q.grad.shape == q.shape


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_operands_equal_contiguous_copies(dtype):
    # Any strides with the last dimension contiguous are read in place; a
    # last dimension that is not contiguous is copied first. Either way the
    # results are bitwise those of contiguous copies, and the output and q's
    # gradient follow q's dimension order.
    x = torch.randn(2, 13, 3, 16, dtype=dtype)  # [B, S, H, D] memory
    kv = torch.randn(2, 9, 2, 3, 16, dtype=dtype)  # packed [B, Sk, 2, H, D]
    vt = torch.randn(2, 3, 16, 9, dtype=dtype)  # [B, H, D, Sk]: v's rows strided
    g = torch.randn(2, 3, 13, 16, dtype=dtype)
    strided = [x.transpose(1, 2), kv[:, :, 0].transpose(1, 2), vt.transpose(2, 3)]
    operands = [t.detach().requires_grad_() for t in strided]
    copies = [t.detach().contiguous().requires_grad_() for t in strided]
    outs = []
    for q, k, v in (operands, copies):
        out, lse = kdnn.flash_attention(q, k, v, causal=True, return_lse=True)
        out.backward(g)
        outs.append((out, lse, q.grad, k.grad, v.grad))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    out, _, dq, _, _ = outs[0]
    assert out.transpose(1, 2).is_contiguous() and dq.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("device",
                         [d for d in DEVICES if d == "cpu" or torch.cuda.is_available()])
def test_allow_tf32_stays_within_one_tf32_pass_and_is_a_bool(device):
    # One TF32 pass keeps about 10 mantissa bits of each product (a GPU
    # with tensor cores; elsewhere nothing changes); the default keeps
    # float32's.
    torch.manual_seed(3)
    q, k, v = (x.to(device) for x in inputs(torch.float32, S=70, Sk=90, D=64, Dv=64))
    expected = reference(q.double(), k.double(), v.double()).float()
    torch.testing.assert_close(kdnn.flash_attention(q, k, v, allow_tf32=True), expected,
                               rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(kdnn.flash_attention(q, k, v), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(kdnn.Error, match=r"flash_attention: allow_tf32=1, expected True or False"):
        kdnn.flash_attention(q, k, v, allow_tf32=1)


def windowed(q, k, v, lo, hi, causal=False):
    """Attention where query i sees keys lo[i] <= j < hi[i] (and j <= i when
    causal), a row that sees none being zero; and the rows' log-sum-exp."""
    S, Sk = q.shape[-2], k.shape[-2]
    j = torch.arange(Sk)
    seen = (j[None, :] >= torch.as_tensor(lo)[:, None]) & (j[None, :] < torch.as_tensor(hi)[:, None])
    if causal:
        seen &= j[None, :] <= torch.arange(S)[:, None]
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~seen, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    P = torch.softmax(s.masked_fill(~seen.any(-1, keepdim=True), 0.0), dim=-1) * seen
    return P @ v, lse


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_windows_and_the_log_sum_exp(dtype, causal):
    q, k, v = inputs(dtype, B=2, H=2, S=6, Sk=9, D=8, Dv=4, grad=True)
    lo, hi = [0, 3, 3, 8, 0, 2], [9, 3, 7, 9, 1, 6]  # row 1 sees no key
    out, lse = kdnn.flash_attention(q, k, v, causal=causal, window=(torch.tensor(lo), hi),
                                    return_lse=True)
    expected, expected_lse = windowed(q, k, v, lo, hi, causal)
    assert_matches(out, expected, (q, k, v), **TOLERANCE[dtype])
    torch.testing.assert_close(lse, expected_lse.detach(), **TOLERANCE[dtype])
    assert not lse.requires_grad and torch.all(out[:, :, 1] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softcap(dtype):
    q, k, v = inputs(dtype, S=13, Sk=21, grad=True)
    s = 2 * (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # scale 2/sqrt(D)
    expected = torch.softmax(1.5 * torch.tanh(s / 1.5), dim=-1) @ v
    out = kdnn.flash_attention(q, k, v, scale=2 / math.sqrt(q.shape[-1]), softcap=1.5)
    assert_matches(out, expected, (q, k, v), **TOLERANCE[dtype])
    qd, kd, vd = inputs(torch.float64, B=1, H=1, S=4, Sk=5, D=3, Dv=2, grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: kdnn.flash_attention(q, k, v, causal=True, scale=3.0, softcap=0.8),
        (qd, kd, vd))


@pytest.mark.parametrize("dtype", DTYPES)
def test_alibi(dtype):
    # Slopes [H] (every batch entry) and [B, H]; S < Sk: query i sits at key
    # i + Sk - S (flash-attn's alignment). The lse includes the bias.
    q, k, v = inputs(dtype, S=13, Sk=21, grad=True)
    i = torch.arange(13, dtype=dtype)[:, None] + (21 - 13)
    distance = (i - torch.arange(21, dtype=dtype)[None, :]).abs()
    for slopes in (torch.tensor([0.5, 0.0625, 1.0]), torch.linspace(-0.2, 0.9, 6).reshape(2, 3)):
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        s = s - slopes.to(dtype).reshape(-1, 3, 1, 1) * distance
        out, lse = kdnn.flash_attention(q, k, v, alibi_slopes=slopes, return_lse=True)
        assert_matches(out, torch.softmax(s, dim=-1) @ v, (q, k, v), **TOLERANCE[dtype])
        torch.testing.assert_close(lse, torch.logsumexp(s, dim=-1).detach(), **TOLERANCE[dtype])
    qd, kd, vd = inputs(torch.float64, B=2, H=2, S=4, Sk=5, D=3, Dv=2, grad=True)
    slopes = torch.tensor([[0.3, 1.2], [0.7, -0.4]], dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda q, k, v: kdnn.flash_attention(q, k, v, causal=True, softcap=0.8,
                                             alibi_slopes=slopes), (qd, kd, vd))


def test_alibi_errors_and_copy():
    q, k, v = inputs(torch.float64, B=2, H=3, S=4, Sk=5, D=3, Dv=2)
    with pytest.raises(kdnn.Error, match=r"alibi_slopes has shape \[2, 2\], expected \[H\] = "
                                         r"\[3\] or \[B, H\] = \[2, 3\]"):
        kdnn.flash_attention(q, k, v, alibi_slopes=torch.ones(2, 2))
    with pytest.raises(kdnn.Error, match="alibi_slopes is a tensor that requires grad"):
        kdnn.flash_attention(q, k, v, alibi_slopes=torch.ones(3, requires_grad=True))
    with pytest.raises(kdnn.Error, match="alibi_slopes has dtype torch.complex64"):
        kdnn.flash_attention(q, k, v, alibi_slopes=torch.ones(3, dtype=torch.complex64))
    with pytest.raises(kdnn.Error, match=r"mask.alibi_slopes\(0, 1\)=nan, expected a finite slope"):
        kdnn.flash_attention(q, k, v, alibi_slopes=[1.0, math.nan, 1.0])
    with pytest.raises(kdnn.Error, match=r"mask.alibi_slopes\(0, 2\)=1e\+38"):
        kdnn.flash_attention(q, k, v, alibi_slopes=[1.0, 1.0, 1e38])
    # Read at the call and kept for the backward: editing the caller's
    # slopes after the forward changes nothing.
    q, k, v = inputs(torch.float64, B=1, H=3, S=4, Sk=5, D=3, Dv=2, grad=True)
    slopes = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    out = kdnn.flash_attention(q, k, v, alibi_slopes=slopes)
    want = torch.autograd.grad(kdnn.flash_attention(q, k, v, alibi_slopes=slopes.clone()).sum(), q)
    slopes.fill_(9.0)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), q), want)


@pytest.mark.parametrize("S,Sk", [(6, 6), (4, 9), (9, 4)])
def test_band_is_the_window_around_the_bottom_right_diagonal(S, Sk):
    q, k, v = inputs(torch.float64, B=2, H=2, S=S, Sk=Sk, D=3, Dv=2, grad=True)
    d = torch.arange(S) + Sk - S
    for left, right in ((-1, 0), (2, 1), (0, -1), (-1, -1)):
        lo = (d - left).clamp(0, Sk) if left >= 0 else torch.zeros(S, dtype=torch.int64)
        hi = (d + right + 1).clamp(0, Sk) if right >= 0 else torch.full((S,), Sk)
        window = (torch.minimum(lo, hi), hi)
        torch.testing.assert_close(kdnn.flash_attention(q, k, v, band=(left, right)),
                                   kdnn.flash_attention(q, k, v, window=window), rtol=0, atol=0)
        assert torch.autograd.gradcheck(
            lambda q, k, v: kdnn.flash_attention(q, k, v, band=(left, right)), (q, k, v))
    with pytest.raises(kdnn.Error, match=r"band\[0\]=-2, expected an integer in \[-1, "):
        kdnn.flash_attention(q, k, v, band=(-2, 0))
    with pytest.raises(kdnn.Error, match=r"band\[1\]=True, expected an integer"):
        kdnn.flash_attention(q, k, v, band=(0, True))
    with pytest.raises(kdnn.Error, match=r"band is a int, expected \(left, right\)"):
        kdnn.flash_attention(q, k, v, band=3)
    with pytest.raises(kdnn.Error, match=r"band\[0\]=4294967296, expected an integer in"):
        kdnn.flash_attention(q, k, v, band=(2**32, 0))


def test_windows_gradcheck_and_errors():
    q, k, v = inputs(torch.float64, B=1, H=2, S=4, Sk=5, D=3, Dv=2, grad=True)
    window = ([0, 1, 2, 0], [2, 5, 4, 1])
    assert torch.autograd.gradcheck(lambda q, k, v: kdnn.flash_attention(q, k, v, window=window),
                                    (q, k, v))
    with pytest.raises(kdnn.Error, match=r"flash_attention: window\[1\] has shape \[3\], "
                                         r"expected \[4\]"):
        kdnn.flash_attention(q, k, v, window=([0] * 4, [1] * 3))
    with pytest.raises(kdnn.Error, match=r"flash_attention: window is a int, expected \(lo, hi\)"):
        kdnn.flash_attention(q, k, v, window=3)
    with pytest.raises(kdnn.Error, match=r"flash_attention: window\[0\] holds values in "):
        kdnn.flash_attention(q, k, v, window=([2**40] * 4, [1] * 4))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask", [dict(), dict(causal=True), dict(band=(3, 0), softcap=0.7),
                                  dict(alibi_slopes=[[0.5, 0.25], [0.1, 1.0], [2.0, 0.0]])])
def test_varlen_equals_each_sequence_alone(dtype, mask):
    # Lengths 0, 1 and longer than one block of the host form (128).
    lengths_q, lengths_k = [0, 1, 150], [4, 3, 140]
    cu_q, cu_k = torch.tensor([0, 0, 1, 151]), torch.tensor([0, 4, 7, 147])
    kw = dict(dtype=dtype, requires_grad=True)
    q, k, v = (torch.randn(n, h, 16, **kw) for n, h in ((151, 2), (147, 1), (147, 1)))
    out, lse = kdnn.flash_attention_varlen(q, k, v, cu_q, cu_k, return_lse=True, **mask)
    assert out.shape == (151, 2, 16) and lse.shape == (2, 151)
    outs, lses = [], []
    for n in range(3):
        rows_q = slice(int(cu_q[n]), int(cu_q[n + 1]))
        rows_k = slice(int(cu_k[n]), int(cu_k[n + 1]))
        each = dict(mask)
        if "alibi_slopes" in each:
            each["alibi_slopes"] = each["alibi_slopes"][n]
        o, l = kdnn.flash_attention(q[rows_q].transpose(0, 1)[None], k[rows_k].transpose(0, 1)[None],
                                    v[rows_k].transpose(0, 1)[None], return_lse=True, **each)
        outs.append(o[0].transpose(0, 1))
        lses.append(l[0])
    assert_matches(out, torch.cat(outs), (q, k, v), **TOLERANCE[dtype])
    torch.testing.assert_close(lse, torch.cat(lses, dim=1), **TOLERANCE[dtype])


def test_varlen_gradcheck_dropout_and_errors():
    kw = dict(dtype=torch.float64, requires_grad=True)
    q, k, v = torch.randn(7, 2, 3, **kw), torch.randn(6, 2, 3, **kw), torch.randn(6, 2, 2, **kw)
    cu_q, cu_k = torch.tensor([0, 4, 7], dtype=torch.int32), torch.tensor([0, 2, 6])

    def f(q, k, v):
        return kdnn.flash_attention_varlen(q, k, v, cu_q, cu_k, causal=True, dropout_p=0.3,
                                           seed=5, offset=2)
    assert torch.autograd.gradcheck(f, (q, k, v))
    assert not torch.equal(f(q, k, v), kdnn.flash_attention_varlen(q, k, v, cu_q, cu_k,
                                                                   causal=True))
    with pytest.raises(kdnn.Error, match="cu_seqlens_q has dtype torch.float32, expected integers"):
        kdnn.flash_attention_varlen(q, k, v, cu_q.float(), cu_k)
    with pytest.raises(kdnn.Error, match=r"cu_seqlens_k has shape \[1, 3\], expected \[S \+ 1\]"):
        kdnn.flash_attention_varlen(q, k, v, cu_q, cu_k[None])
    with pytest.raises(kdnn.Error, match=r"cu_seqlens_k\[2\]=6 < seqs.cu_seqlens_k\[1\]=7"):
        kdnn.flash_attention_varlen(q, k, v, cu_q, torch.tensor([0, 7, 6]))
    with pytest.raises(kdnn.Error, match=r"alibi_slopes has shape \[3, 2\], expected \[H\] = \[2\] "
                                         r"or \[B, H\] = \[2, 2\]"):
        kdnn.flash_attention_varlen(q, k, v, cu_q, cu_k, alibi_slopes=torch.ones(3, 2))
    with pytest.raises(kdnn.Error, match=r"q has shape \[1, 7, 2, 3\], expected 3 dimensions"):
        kdnn.flash_attention_varlen(q[None], k, v, cu_q, cu_k)
    with pytest.raises(TypeError):
        kdnn.flash_attention_varlen(q, k, v, cu_q, cu_k, True)  # options are keywords


def reference_with_sinks(q, k, v, sinks, causal=False, scale=None):
    """Attention whose rows' softmax takes one more logit per head, the
    sink, in a column of its own that has no value (gpt-oss's sinks)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q @ k.transpose(-1, -2)
    if causal:
        S, Sk = s.shape[-2:]
        s = s.masked_fill(~torch.ones(S, Sk, dtype=torch.bool).tril(), -math.inf)
    column = sinks.reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)
    P = torch.softmax(torch.cat([s, column], dim=-1), dim=-1)[..., :-1]
    return P @ v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_sinks_match_a_softmax_with_the_sink_appended(dtype, causal):
    q, k, v = inputs(dtype, B=2, H=3, S=20, Sk=20, D=16, Dv=8, grad=True)
    sinks = torch.tensor([0.5, -1.0, 2.0], dtype=dtype, requires_grad=True)
    assert_matches(kdnn.flash_attention(q, k, v, causal=causal, sinks=sinks),
                   reference_with_sinks(q, k, v, sinks, causal), (q, k, v, sinks),
                   **TOLERANCE[dtype])


def test_sinks_gradcheck_minus_infinity_and_errors():
    q, k, v = inputs(torch.float64, B=1, H=2, S=5, Sk=4, D=3, Dv=2, grad=True)
    sinks = torch.tensor([0.3, -0.7], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, s: kdnn.flash_attention(q, k, v, causal=True, sinks=s, dropout_p=0.2,
                                                seed=3), (q, k, v, sinks))
    # A sink of -inf is none, bitwise; a row that sees no key gets lse = sink.
    none = kdnn.flash_attention(q, k, v, causal=True, return_lse=True)
    minus_inf = torch.full((2,), -math.inf, dtype=torch.float64)
    assert all(torch.equal(a, b) for a, b in zip(
        kdnn.flash_attention(q, k, v, causal=True, return_lse=True, sinks=minus_inf), none))
    _, lse = kdnn.flash_attention(q, k, v, window=([0] * 5, [0] * 5), sinks=sinks,
                                  return_lse=True)
    torch.testing.assert_close(lse, sinks.detach().reshape(1, 2, 1).expand(1, 2, 5))
    with pytest.raises(kdnn.Error, match=r"sinks has shape \[3\], expected \[H\] = \[2\]"):
        kdnn.flash_attention(q, k, v, sinks=torch.zeros(3, dtype=torch.float64))
    with pytest.raises(kdnn.Error, match="sinks has dtype torch.float32, expected torch.float64"):
        kdnn.flash_attention(q, k, v, sinks=torch.zeros(2))


def test_sinks_of_packed_sequences_and_the_compat_entry_points():
    from kdnn.compat.flash_attn import flash_attn_func, flash_attn_varlen_func
    kw = dict(dtype=torch.float64, requires_grad=True)
    q, k, v = torch.randn(9, 2, 4, **kw), torch.randn(7, 1, 4, **kw), torch.randn(7, 1, 3, **kw)
    sinks = torch.tensor([0.2, -0.5], **kw)
    cu_q, cu_k = torch.tensor([0, 4, 9]), torch.tensor([0, 3, 7])
    out = kdnn.flash_attention_varlen(q, k, v, cu_q, cu_k, causal=True, sinks=sinks)
    outs = []
    for n in range(2):
        rows_q, rows_k = slice(int(cu_q[n]), int(cu_q[n + 1])), slice(int(cu_k[n]), int(cu_k[n + 1]))
        o = kdnn.flash_attention(q[rows_q].transpose(0, 1)[None], k[rows_k].transpose(0, 1)[None],
                                 v[rows_k].transpose(0, 1)[None], causal=True, sinks=sinks)
        outs.append(o[0].transpose(0, 1))
    assert_matches(out, torch.cat(outs), (q, k, v, sinks), **TOLERANCE[torch.float64])
    # flash-attn's causal mask is bottom-right aligned: kdnn's band (-1, 0).
    torch.testing.assert_close(
        flash_attn_varlen_func(q, k, v, cu_q.int(), cu_k.int(), 5, 4, causal=True, sinks=sinks),
        kdnn.flash_attention_varlen(q, k, v, cu_q, cu_k, band=(-1, 0), sinks=sinks))
    qb, kb, vb = (t[:4][None] for t in (q, k, v))  # (batch, seqlen, nheads, headdim)
    torch.testing.assert_close(
        flash_attn_func(qb, kb, vb, sinks=sinks),
        kdnn.flash_attention(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2),
                             sinks=sinks).transpose(1, 2))
