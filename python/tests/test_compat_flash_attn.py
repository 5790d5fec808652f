# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.compat.flash_attn against flash-attn's semantics: its reference
attention (bottom-right aligned causal mask and windows, GQA, the
(batch, seqlen, nheads, headdim) layout), written here in PyTorch from the
peer's documentation; the log-sum-exp it returns, the packed forms, and
the options kdnn does not have; the varlen forms against the reference
on each sequence alone."""
import math

import pytest
import torch
from common import DTYPES, TOLERANCE, assert_matches

import kdnn
from kdnn.compat.flash_attn import (flash_attn_func, flash_attn_kvpacked_func,
                                    flash_attn_qkvpacked_func, flash_attn_varlen_func,
                                    flash_attn_varlen_kvpacked_func,
                                    flash_attn_varlen_qkvpacked_func)


def window(Sk, causal, window_size):
    """flash-attn's window as its kernels take it: a bound of seqlen_k or
    more is none (-1), as mha_fwd sets it before the kernel (what its
    documentation's formula leaves out: for seqlen_q > seqlen_k a right
    bound of seqlen_k still hides keys from the first queries), and causal
    is a right bound of 0."""
    left, right = (-1 if w >= Sk else w for w in window_size)
    return left, 0 if causal else right


def visible(S, Sk, causal, window_size):
    """[S, Sk]: query i sees key j (bottom-right aligned)."""
    left, right = window(Sk, causal, window_size)
    i = torch.arange(S)[:, None] + Sk - S
    j = torch.arange(Sk)[None, :]
    seen = torch.ones(S, Sk, dtype=torch.bool)
    if left >= 0:
        seen &= j >= i - left
    if right >= 0:
        seen &= j <= i + right
    return seen


def alibi_bias(slopes, S, Sk, causal, window_size, dtype):
    """flash-attn's ALiBi bias [1 or batch, nheads, S, Sk] as its kernel adds
    it: slope·j under its causal form (right bound 0, no left bound), else
    -slope·|i + Sk - S - j|."""
    slopes = torch.as_tensor(slopes, dtype=dtype).reshape(-1, slopes.shape[-1], 1, 1)
    i = torch.arange(S, dtype=dtype)[:, None] + Sk - S
    j = torch.arange(Sk, dtype=dtype)[None, :]
    if window(Sk, causal, window_size) == (-1, 0):
        return slopes * j
    return -slopes * (i - j).abs()


def attention_ref(q, k, v, causal=False, window_size=(-1, -1), scale=None, softcap=0.0,
                  alibi_slopes=None):
    """flash-attn's semantics: out (batch, seqlen, nheads, headdim_v) and the
    rows' log-sum-exp (+inf where a row sees no key, whose output is 0)."""
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes, q.shape[1], k.shape[1], causal, window_size, s.dtype)
    seen = visible(q.shape[1], k.shape[1], causal, window_size)
    s = s.masked_fill(~seen, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s.masked_fill(~seen.any(-1, keepdim=True), 0.0), dim=-1) * seen
    return torch.einsum("bhij,bjhd->bihd", p, v), torch.where(lse == -math.inf, math.inf, lse)


CASES = [dict(S=17, Sk=17), dict(S=9, Sk=30), dict(S=30, Sk=9), dict(S=1, Sk=12)]
MASKS = [dict(causal=False, window_size=(-1, -1)), dict(causal=True, window_size=(-1, -1)),
         dict(causal=False, window_size=(3, 1)), dict(causal=True, window_size=(4, -1)),
         dict(causal=False, window_size=(-1, 0)), dict(causal=True, window_size=(-1, -1), softcap=0.5),
         dict(causal=False, window_size=(-1, -1),
              alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 1.0])),
         dict(causal=True, window_size=(5, -1), softcap=0.5,
              alibi_slopes=torch.linspace(0.1, 0.8, 8).reshape(2, 4)),
         dict(causal=False, window_size=(2, 12)),  # 12 >= seqlen_k = 9: no right bound
         dict(causal=False, window_size=(9, 9), alibi_slopes=torch.tensor([0.5, 0.25, 0.1, 1.0]))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("heads_k", [4, 2, 1])
def test_matches_the_reference(dtype, case, mask, heads_k):
    kw = dict(dtype=dtype, requires_grad=True)
    q = torch.randn(2, case["S"], 4, 16, **kw)
    k = torch.randn(2, case["Sk"], heads_k, 16, **kw)
    v = torch.randn(2, case["Sk"], heads_k, 8, **kw)
    out = flash_attn_func(q, k, v, **mask)
    assert out.shape == (2, case["S"], 4, 8) and out.is_contiguous()
    assert_matches(out, attention_ref(q, k, v, **mask)[0], (q, k, v), **TOLERANCE[dtype])


def test_log_sum_exp_scale_and_packed_forms():
    q, k, v = (torch.randn(2, 12, 2, 8, dtype=torch.float64) for _ in range(3))
    out, lse, probs = flash_attn_func(q, k[:, :5], v[:, :5], softmax_scale=0.3, causal=True,
                                      return_attn_probs=True)
    want, want_lse = attention_ref(q, k[:, :5], v[:, :5], causal=True, scale=0.3)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(lse, want_lse)  # +inf for the rows that see no key
    assert probs is None and torch.isinf(lse[:, :, 0]).all()
    kv = torch.stack([k, v], dim=2)
    torch.testing.assert_close(flash_attn_kvpacked_func(q, kv, causal=True),
                               flash_attn_func(q, k, v, causal=True))
    qkv = torch.stack([q, k, v], dim=2)
    torch.testing.assert_close(flash_attn_qkvpacked_func(qkv, window_size=(2, 2)),
                               flash_attn_func(q, k, v, window_size=(2, 2)))


@pytest.mark.parametrize("mask", [dict(causal=True), dict(causal=False, window_size=(-1, 0)),
                                  dict(causal=True, window_size=(3, -1)), dict(causal=False)])
def test_log_sum_exp_with_alibi_is_flash_attns(mask):
    # flash-attn's causal form of the bias (slope·j) shifts each row's lse by
    # a constant against kdnn's; the entry point returns flash-attn's.
    q, k, v = (torch.randn(2, 7, 3, 8, dtype=torch.float64) for _ in range(3))
    slopes = torch.tensor([[0.5, 0.3, 2.0], [0.1, 1.0, 0.7]])
    for Sk in (7, 4, 11):
        kk, vv = (torch.randn(2, Sk, 3, 8, dtype=torch.float64) for _ in range(2))
        out, lse, _ = flash_attn_func(q, kk, vv, alibi_slopes=slopes, return_attn_probs=True,
                                      **mask)
        want, want_lse = attention_ref(q, kk, vv, alibi_slopes=slopes, **mask)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(lse, want_lse)


def test_gradcheck_with_dropout():
    kw = dict(dtype=torch.float64, requires_grad=True)
    q, k, v = torch.randn(1, 5, 2, 3, **kw), torch.randn(1, 6, 1, 3, **kw), torch.randn(1, 6, 1, 2, **kw)
    torch.manual_seed(7)
    seed_state = torch.get_rng_state()

    def f(q, k, v):
        torch.set_rng_state(seed_state)  # the same dropout mask at every evaluation
        return flash_attn_func(q, k, v, 0.2, None, True)
    assert torch.autograd.gradcheck(f, (q, k, v))


def test_options_kdnn_does_not_have():
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(kdnn.Error, match=r"softcap=-1.0, expected a finite number >= 0"):
        flash_attn_func(q, q, q, softcap=-1.0)
    with pytest.raises(kdnn.Error, match=r"alibi_slopes has shape \[3\], expected \[H\] = \[2\]"):
        flash_attn_func(q, q, q, alibi_slopes=torch.ones(3))
    with pytest.raises(kdnn.Error, match=r"q has shape \[4, 2, 8\], expected \(batch, seqlen"):
        flash_attn_func(q[0], q, q)
    with pytest.raises(kdnn.Error, match="window_size=3, expected"):
        flash_attn_func(q, q, q, window_size=3)
    with pytest.raises(kdnn.Error, match="causal=0.1, expected True or False"):
        flash_attn_func(q, q, q, 0.0, None, 0.1)


@pytest.mark.parametrize("heads_k", [4, 2])
def test_peer_layouts_are_read_and_written_in_place(copies, heads_k):
    # flash-attn's (batch, seqlen, nheads, headdim) tensors and the packed
    # forms' slices: read through their strides, the output and the
    # gradients written in flash-attn's layout, no copy either way.
    kw = dict(dtype=torch.float64, requires_grad=True)
    q = torch.randn(2, 11, 4, 8, **kw)
    k, v = torch.randn(2, 13, heads_k, 8, **kw), torch.randn(2, 13, heads_k, 8, **kw)
    g = torch.randn(2, 11, 4, 8, dtype=torch.float64)
    out = flash_attn_func(q, k, v, causal=True, dropout_p=0.0)
    out.backward(g)
    assert copies == []
    assert out.is_contiguous() and q.grad.is_contiguous() and k.grad.is_contiguous()
    want = attention_ref(q, k, v, causal=True)[0]
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(torch.autograd.grad(want, (q, k, v), g), (q.grad, k.grad, v.grad))

    qkv = torch.stack([q, q, q], dim=2).detach().requires_grad_()
    kv = torch.stack([k, v], dim=2).detach().requires_grad_()
    packed = flash_attn_qkvpacked_func(qkv, window_size=(3, 2))
    packed.backward(g)
    kv_out = flash_attn_kvpacked_func(q.detach(), kv, causal=True)
    kv_out.backward(g)
    assert copies == []
    qs = [qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3)]
    want = flash_attn_func(*qs, window_size=(3, 2))
    torch.testing.assert_close(packed, want)
    torch.testing.assert_close(qkv.grad, torch.stack(torch.autograd.grad(want, qs, g), dim=2))
    torch.testing.assert_close(kv_out, out)
    torch.testing.assert_close(kv.grad, torch.stack([k.grad, v.grad], dim=2))


def test_gradcheck_of_the_packed_forms_through_their_strides():
    qkv = torch.randn(1, 6, 3, 2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: flash_attn_qkvpacked_func(t, causal=True), (qkv,))
    q = torch.randn(1, 5, 2, 4, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(1, 7, 2, 1, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b: flash_attn_kvpacked_func(a, b, window_size=(2, 1)), (q, kv))


VARLEN_MASKS = [dict(causal=False), dict(causal=True), dict(causal=False, window_size=(3, 1)),
                dict(causal=True, window_size=(4, -1), softcap=0.5),
                dict(causal=False, alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 1.0])),
                dict(causal=True, alibi_slopes=torch.linspace(0.1, 1.6, 16).reshape(4, 4))]


def varlen_ref(q, k, v, lengths_q, lengths_k, alibi_slopes=None, **mask):
    """flash-attn's varlen semantics: each sequence attended alone
    (attention_ref with batch 1), out and lse concatenated; lse (nheads,
    total_q)."""
    outs, lses = [], []
    i = j = 0
    for n, (sq, sk) in enumerate(zip(lengths_q, lengths_k)):
        slopes = alibi_slopes
        if slopes is not None and slopes.dim() == 2:
            slopes = slopes[n]
        out, lse = attention_ref(q[None, i:i + sq], k[None, j:j + sk], v[None, j:j + sk],
                                 alibi_slopes=slopes, **mask)
        outs.append(out[0])
        lses.append(lse[0])
        i, j = i + sq, j + sk
    return torch.cat(outs), torch.cat(lses, dim=1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask", VARLEN_MASKS)
@pytest.mark.parametrize("heads_k", [4, 2])
def test_varlen_matches_each_sequence_alone(dtype, mask, heads_k):
    lengths_q, lengths_k = [0, 5, 1, 17], [3, 5, 4, 9]
    cu_q = torch.tensor([0] + lengths_q, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu_k = torch.tensor([0] + lengths_k, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    kw = dict(dtype=dtype, requires_grad=True)
    q = torch.randn(sum(lengths_q), 4, 16, **kw)
    k = torch.randn(sum(lengths_k), heads_k, 16, **kw)
    v = torch.randn(sum(lengths_k), heads_k, 8, **kw)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), **mask)
    assert out.shape == (sum(lengths_q), 4, 8)
    want, want_lse = varlen_ref(q, k, v, lengths_q, lengths_k, **mask)
    assert_matches(out, want, (q, k, v), **TOLERANCE[dtype])
    _, lse, probs = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                           return_attn_probs=True, **mask)
    assert probs is None
    torch.testing.assert_close(lse, want_lse.to(lse.dtype), **TOLERANCE[dtype])


def test_varlen_packed_forms_gradcheck_and_errors():
    lengths = [3, 0, 6]
    cu = torch.tensor([0, 3, 3, 9], dtype=torch.int32)
    kw = dict(dtype=torch.float64, requires_grad=True)
    qkv = torch.randn(9, 3, 2, 4, **kw)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    torch.testing.assert_close(
        flash_attn_varlen_qkvpacked_func(qkv, cu, 6, causal=True),
        flash_attn_varlen_func(q, k, v, cu, cu, 6, 6, causal=True))
    torch.testing.assert_close(
        flash_attn_varlen_kvpacked_func(q, qkv[:, 1:], cu, cu, 6, 6, window_size=(1, 1)),
        varlen_ref(q, k, v, lengths, lengths, window_size=(1, 1))[0])
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attn_varlen_func(q, k, v, cu, cu, 6, 6, causal=True),
        (q.detach().requires_grad_(), k.detach().requires_grad_(), v.detach().requires_grad_()))
    with pytest.raises(kdnn.Error, match="block_table is given"):
        flash_attn_varlen_func(q, k, v, cu, cu, 6, 6, block_table=torch.zeros(1, 1))
    with pytest.raises(kdnn.Error, match="max_seqlen_k=-1"):
        flash_attn_varlen_func(q, k, v, cu, cu, 6, -1)
    with pytest.raises(kdnn.Error, match=r"cu_seqlens_q\[3\]=8, expected 9"):
        flash_attn_varlen_func(q, k, v, torch.tensor([0, 3, 3, 8]), cu, 6, 6)
    with pytest.raises(kdnn.Error, match="expected \\(total, nheads, headdim\\)"):
        flash_attn_varlen_func(q[None], k, v, cu, cu, 6, 6)
