# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.flash_attention: fused attention with O(S) memory, differentiable;
kdnn.flash_attention_varlen: the same over packed variable-length
sequences."""
import math

import torch

from . import _kdnn
from ._options import Options
from ._tensors import (Error, Operands, dropout_options, empty_in_order_of, first_order, flag,
                       integer, number, offsets, require, rows_contiguous, stream_of, windows)


class _FlashAttention(torch.autograd.Function):
    """sinks: [H] or None; options: the FusedAttentionOptions record; mask:
    the AttentionMask record (its windows and slopes: copies, not
    differentiated)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, options, mask):
        B, H, S, _ = q.shape
        o = empty_in_order_of(q, (B, H, S, v.shape[-1]))  # q's memory order: no copy for a peer
        lse = q.new_empty(B, H, S)  # the rows' log-sum-exp, for the backward
        _kdnn.flash_attention_forward(q, k, v, o, lse, sinks, _forward_options(options),
                                      mask.bound(), stream_of(q))
        ctx.save_for_backward(q, k, v, o, lse, sinks)
        ctx.options, ctx.mask = options, mask
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @first_order("flash_attention")
    def backward(ctx, do, _):
        q, k, v, o, lse, sinks = ctx.saved_tensors
        dq, dk, dv = (empty_in_order_of(t, t.shape) for t in (q, k, v))
        dsinks = torch.empty_like(sinks) if ctx.needs_input_grad[3] else None
        _kdnn.flash_attention_backward(q, k, v, o, lse, rows_contiguous(do), dq, dk, dv, sinks,
                                       dsinks, ctx.options.bound(), ctx.mask.bound(), stream_of(q))
        return dq, dk, dv, dsinks, None, None


def _forward_options(options):
    """The bound options of a forward, which also refuses a scale with which
    scores could pass the dtype's range (an error, not NaN; the backward
    takes the same q, k and scale, so the forward's check covers it)."""
    bound = options.bound()
    bound.check_scores = True
    return bound


def _options(scale, softcap, dropout, allow_tf32, check_finite):
    """The FusedAttentionOptions record of checked values (dropout: the
    DropoutOptions record)."""
    return Options("FusedAttentionOptions", scale=scale, softcap=softcap, dropout=dropout,
                   launch=Options("Launch", allow_tf32=allow_tf32), check_finite=check_finite)


def _sinks(check, sinks, heads):
    """The attention sinks [H] (None: none), of the call's dtype and device
    (`check`, the call's Operands), contiguous."""
    sinks = check(sinks, "sinks", 1, "[H]", optional=True)
    require(sinks is None or sinks.shape[0] == heads,
            f"{check.op}: sinks has shape {list(getattr(sinks, 'shape', []))}, expected [H] = "
            f"[{heads}]")
    return sinks


def _band(op, band):
    """band = (left, right) as two int32 values >= -1; None as (-1, -1)."""
    if band is None:
        return -1, -1
    require(isinstance(band, (tuple, list)) and len(band) == 2,
            f"{op}: band is a {type(band).__name__}, expected (left, right)")
    return (integer(op, "band[0]", band[0], -1, 2**31 - 1),
            integer(op, "band[1]", band[1], -1, 2**31 - 1))


def _alibi_slopes(op, slopes, batch, heads, device):
    """ALiBi's slopes [H] or [B, H] (a real tensor or a sequence) as the
    float64 [1 or B, H] tensor kdnn reads on `device`: a copy (editing the
    caller's tensor after the forward changes nothing); kdnn does not
    differentiate them."""
    if slopes is None:
        return None
    if isinstance(slopes, torch.Tensor):
        require(not slopes.requires_grad,
                f"{op}: alibi_slopes is a tensor that requires grad; kdnn does not differentiate "
                "alibi_slopes: pass alibi_slopes.detach()")
        require(slopes.layout == torch.strided,
                f"{op}: alibi_slopes has layout {slopes.layout}, expected a dense tensor")
        slopes = slopes.resolve_neg()
    try:
        t = torch.as_tensor(slopes, device=device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise Error(f"{op}: alibi_slopes is a {type(slopes).__name__}, expected a real tensor "
                    f"[H] or [B, H] ({e})") from None
    require(not (t.is_complex() or t.dtype == torch.bool),
            f"{op}: alibi_slopes has dtype {t.dtype}, expected real numbers")
    shapes = ([heads], [1, heads], [batch, heads])
    require(list(t.shape) in shapes,
            f"{op}: alibi_slopes has shape {list(t.shape)}, expected [H] = [{heads}] or [B, H] = "
            f"[{batch}, {heads}]")
    return t.reshape(-1, heads).to(torch.float64, copy=True).contiguous()


def _score_options(op, scale, softcap, head_dim):
    """The scores' scale (None: 1/sqrt(D)) and cap, each checked finite (the
    cap >= 0; 0: none)."""
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    scale = number(op, "scale", scale)
    require(math.isfinite(scale), f"{op}: scale={scale!r}, expected a finite number")
    softcap = number(op, "softcap", softcap)
    require(math.isfinite(softcap) and softcap >= 0,
            f"{op}: softcap={softcap!r}, expected a finite number >= 0 (0: none)")
    return scale, softcap


def flash_attention(q, k, v, *, causal=False, window=None, band=None, scale=None, softcap=0.0,
                    alibi_slopes=None, sinks=None, dropout_p=0.0, seed=None, offset=0,
                    allow_tf32=False, return_lse=False, check_finite=False):
    """softmax(scale * q k^T, masked) v, fused: the scores never reach memory
    (O(S) memory), as F.scaled_dot_product_attention.

    q [B, H, S, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv], float32 or
    float64; returns [B, H, S, Dv]. Any strides whose last dimension is
    contiguous are read in place (e.g. x.transpose(1, 2) of a [B, S, H, D]
    tensor, or a slice of a packed one), and the output and the gradients
    are laid out in the dimension order of q (of k, of v). Hkv divides H: query head h reads
    key/value head h // (H // Hkv) (grouped-query attention; Hkv = 1:
    multi-query), and the gradients of k and v sum over each group.
    causal: query i sees keys j <= i (top-left aligned, as PyTorch's
    is_causal). window = (lo, hi), integer vectors [S]: query i sees keys
    lo[i] <= j < hi[i] (with causal, both apply; a query that sees no key
    outputs zeros). band = (left, right), integers >= -1: query i sees keys
    d - left <= j <= d + right around its diagonal key d = i + Sk - S
    (bottom-right aligned, as flash-attn's window_size; -1: no bound on that
    side; (-1, 0) is flash-attn's causal mask); all masks given apply
    together. scale: default 1/sqrt(D). softcap > 0: each scaled
    score s is used as softcap * tanh(s / softcap) (Gemma 2's and flash-attn's
    softcap; 0: none). alibi_slopes [H] or [B, H] (real; not
    differentiated): ALiBi, -slope * |i + Sk - S - j| added to each (capped)
    score of query i and key j (flash-attn's alignment: plain |i - j| for
    S = Sk). sinks [H] (q's dtype and device; differentiable): attention
    sinks, as gpt-oss's: query head h's logit joins every row's softmax
    denominator as a key without a value, so that a row's probabilities sum
    to less than 1 (a row that sees no key outputs zeros and its lse is the
    sink; -inf: none). dropout_p: on the
    probabilities, scaled by 1/(1 - p); the mask is a counter-based function
    of (seed, offset, element), so the backward needs no stored mask.
    seed=None draws one from PyTorch's generator (torch.manual_seed makes it
    reproducible); pass seed and a fresh offset per call to choose.
    allow_tf32: on a GPU with tensor cores, float32 products in one TF32 pass
    (about 10 mantissa bits, as torch.backends.cuda.matmul.allow_tf32)
    instead of three (float32 accuracy, the default); nothing changes
    elsewhere or in float64. return_lse: also return the rows' log-sum-exp
    of their visible scaled scores, [B, H, S] (-inf for a row that sees no
    key; not differentiable). check_finite: refuse a NaN or an infinity in
    q, k, v (and in the incoming gradient), naming the first; without it
    they propagate to the outputs that depend on them, as in PyTorch
    (docs/api.md).
    """
    op = "flash_attention"
    check = Operands(op)
    q = check(q, "q", 4, "[B, H, S, D]", strides="rows")
    k = check(k, "k", 4, "[B, Hkv, Sk, D]", strides="rows")
    v = check(v, "v", 4, "[B, Hkv, Sk, Dv]", strides="rows")
    causal = flag(op, "causal", causal)
    lo_win, hi_win = windows(op, window, q.shape[2], q.device)
    band = _band(op, band)
    scale, softcap = _score_options(op, scale, softcap, q.shape[-1])
    dropout = dropout_options(op, dropout_p, seed, offset)
    allow_tf32 = flag(op, "allow_tf32", allow_tf32)
    return_lse = flag(op, "return_lse", return_lse)
    slopes = _alibi_slopes(op, alibi_slopes, q.shape[0], q.shape[1], q.device)
    check_finite = flag(op, "check_finite", check_finite)
    sinks = _sinks(check, sinks, q.shape[1])
    mask = Options("AttentionMask", causal=causal, lo_win=lo_win, hi_win=hi_win,
                   band_left=band[0], band_right=band[1], alibi_slopes=slopes)
    o, lse = _FlashAttention.apply(q, k, v, sinks, _options(scale, softcap, dropout, allow_tf32,
                                                            check_finite), mask)
    return (o, lse) if return_lse else o


class _FlashAttentionVarlen(torch.autograd.Function):
    """_FlashAttention's over packed sequences: cu_q, cu_k their offsets."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, sinks, options, mask):
        T, H, _ = q.shape
        o = empty_in_order_of(q, (T, H, v.shape[-1]))
        lse = q.new_empty(H, T)  # flash-attn's varlen layout
        _kdnn.flash_attention_varlen_forward(q, k, v, o, lse, cu_q, cu_k, sinks,
                                             _forward_options(options), mask.bound(), stream_of(q))
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k, sinks)
        ctx.options, ctx.mask = options, mask
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @first_order("flash_attention_varlen")
    def backward(ctx, do, _):
        q, k, v, o, lse, cu_q, cu_k, sinks = ctx.saved_tensors
        dq, dk, dv = (empty_in_order_of(t, t.shape) for t in (q, k, v))
        dsinks = torch.empty_like(sinks) if ctx.needs_input_grad[5] else None
        _kdnn.flash_attention_varlen_backward(q, k, v, o, lse, rows_contiguous(do), dq, dk, dv,
                                              cu_q, cu_k, sinks, dsinks, ctx.options.bound(),
                                              ctx.mask.bound(), stream_of(q))
        return dq, dk, dv, None, None, dsinks, None, None


def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, band=None,
                           scale=None, softcap=0.0, alibi_slopes=None, sinks=None, dropout_p=0.0,
                           seed=None, offset=0, allow_tf32=False, return_lse=False,
                           check_finite=False):
    """flash_attention over packed variable-length sequences (flash-attn's
    varlen layout), differentiable.

    q [Tq, H, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv]: N sequences packed along
    the first dimension; cu_seqlens_q and cu_seqlens_k, integer vectors
    [N + 1] (0 first, never decreasing, Tq and Tk last): sequence n's
    queries are rows cu_seqlens_q[n] to cu_seqlens_q[n + 1] - 1 of q, its
    keys those of cu_seqlens_k in k and v, and a query sees only its own
    sequence's keys. Returns [Tq, H, Dv]. Each sequence is attended as one
    batch entry of flash_attention with the sequence's own lengths: causal
    (top-left aligned), band (bottom-right aligned per sequence, as
    flash-attn's window_size), scale, softcap, sinks, dropout, allow_tf32 and
    check_finite as there; alibi_slopes [H] or [N, H]. Hkv divides H (GQA). The lengths may
    be anything, 0 included: the kernels work on each sequence's own blocks.
    Dropout draws element (n, h, i, j) of the sequences padded to the
    longest. return_lse: also return lse [H, Tq] (-inf for a query that sees
    no key; not differentiable). The offsets are copied to the host and
    checked (a synchronisation).
    """
    op = "flash_attention_varlen"
    check = Operands(op)
    q = check(q, "q", 3, "[Tq, H, D]", strides="rows")
    k = check(k, "k", 3, "[Tk, Hkv, D]", strides="rows")
    v = check(v, "v", 3, "[Tk, Hkv, Dv]", strides="rows")
    cu_q = offsets(op, "cu_seqlens_q", cu_seqlens_q, q.device)
    cu_k = offsets(op, "cu_seqlens_k", cu_seqlens_k, q.device)
    causal = flag(op, "causal", causal)
    band = _band(op, band)
    scale, softcap = _score_options(op, scale, softcap, q.shape[-1])
    dropout = dropout_options(op, dropout_p, seed, offset)
    allow_tf32 = flag(op, "allow_tf32", allow_tf32)
    return_lse = flag(op, "return_lse", return_lse)
    slopes = _alibi_slopes(op, alibi_slopes, max(cu_q.shape[0] - 1, 0), q.shape[1], q.device)
    check_finite = flag(op, "check_finite", check_finite)
    sinks = _sinks(check, sinks, q.shape[1])
    mask = Options("AttentionMask", causal=causal, band_left=band[0], band_right=band[1],
                   alibi_slopes=slopes)
    o, lse = _FlashAttentionVarlen.apply(q, k, v, cu_q, cu_k, sinks,
                                         _options(scale, softcap, dropout, allow_tf32,
                                                  check_finite), mask)
    return (o, lse) if return_lse else o
