# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.flash_attention: fused attention with O(S) memory, differentiable."""
import math

import torch

from . import _kdnn
from ._tensors import (Operands, dropout_options, first_order, flag, number, require, stream_of,
                       windows)


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lo_win, hi_win, config):
        scale, softcap, causal, dropout_p, seed, offset, allow_tf32 = config
        B, H, S, _ = q.shape
        o = q.new_empty(B, H, S, v.shape[-1])
        lse = q.new_empty(B, H, S)  # the rows' log-sum-exp, for the backward
        args = (scale, softcap, causal, lo_win, hi_win, dropout_p, seed, offset, allow_tf32)
        _kdnn.flash_attention_forward(q, k, v, o, lse, *args, stream_of(q))
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = args
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @first_order("flash_attention")
    def backward(ctx, do, _):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _kdnn.flash_attention_backward(q, k, v, o, lse, do.contiguous(), dq, dk, dv, *ctx.args,
                                       stream_of(q))
        return dq, dk, dv, None, None, None


def flash_attention(q, k, v, *, causal=False, window=None, scale=None, softcap=0.0, dropout_p=0.0,
                    seed=None, offset=0, allow_tf32=False, return_lse=False):
    """softmax(scale * q k^T, masked) v, fused: the scores never reach memory
    (O(S) memory), as F.scaled_dot_product_attention.

    q [B, H, S, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv], float32 or
    float64; returns [B, H, S, Dv]. Hkv divides H: query head h reads
    key/value head h // (H // Hkv) (grouped-query attention; Hkv = 1:
    multi-query), and the gradients of k and v sum over each group.
    causal: query i sees keys j <= i (top-left aligned, as PyTorch's
    is_causal). window = (lo, hi), integer vectors [S]: query i sees keys
    lo[i] <= j < hi[i] (with causal, both apply; a query that sees no key
    outputs zeros). scale: default 1/sqrt(D). softcap > 0: each scaled
    score s is used as softcap * tanh(s / softcap) (Gemma 2's and flash-attn's
    softcap; 0: none). dropout_p: on the
    probabilities, scaled by 1/(1 - p); the mask is a counter-based function
    of (seed, offset, element), so the backward needs no stored mask.
    seed=None draws one from PyTorch's generator (torch.manual_seed makes it
    reproducible); pass seed and a fresh offset per call to choose.
    allow_tf32: on a GPU with tensor cores, float32 products in one TF32 pass
    (about 10 mantissa bits, as torch.backends.cuda.matmul.allow_tf32)
    instead of three (float32 accuracy, the default); nothing changes
    elsewhere or in float64. return_lse: also return the rows' log-sum-exp
    of their visible scaled scores, [B, H, S] (-inf for a row that sees no
    key; not differentiable).
    """
    op = "flash_attention"
    check = Operands(op)
    q = check(q, "q", 4, "[B, H, S, D]")
    k = check(k, "k", 4, "[B, Hkv, Sk, D]")
    v = check(v, "v", 4, "[B, Hkv, Sk, Dv]")
    causal = flag(op, "causal", causal)
    lo_win, hi_win = windows(op, window, q.shape[2], q.device)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] > 0 else 1.0
    scale = number(op, "scale", scale)
    require(math.isfinite(scale), f"{op}: scale={scale!r}, expected a finite number")
    softcap = number(op, "softcap", softcap)
    require(math.isfinite(softcap) and softcap >= 0,
            f"{op}: softcap={softcap!r}, expected a finite number >= 0 (0: none)")
    dropout = dropout_options(op, dropout_p, seed, offset)
    allow_tf32 = flag(op, "allow_tf32", allow_tf32)
    return_lse = flag(op, "return_lse", return_lse)
    o, lse = _FlashAttention.apply(q, k, v, lo_win, hi_win,
                                   (scale, softcap, causal, *dropout, allow_tf32))
    return (o, lse) if return_lse else o
