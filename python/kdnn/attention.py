# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.flash_attention: fused attention with O(S) memory, differentiable."""
import math

import torch

from . import _kdnn
from ._tensors import Operands, dropout_options, first_order, flag, number, require, stream_of


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, dropout_p, seed, offset, allow_tf32):
        B, H, S, _ = q.shape
        o = q.new_empty(B, H, S, v.shape[-1])
        lse = q.new_empty(B, H, S)  # the rows' log-sum-exp, for the backward
        config = (scale, causal, dropout_p, seed, offset, allow_tf32)
        _kdnn.flash_attention_forward(q, k, v, o, lse, *config, stream_of(q))
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.config = config
        return o

    @staticmethod
    @first_order("flash_attention")
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _kdnn.flash_attention_backward(q, k, v, o, lse, do.contiguous(), dq, dk, dv, *ctx.config,
                                       stream_of(q))
        return dq, dk, dv, None, None, None, None, None, None


def flash_attention(q, k, v, *, causal=False, scale=None, dropout_p=0.0, seed=None, offset=0,
                    allow_tf32=False):
    """softmax(scale * q k^T, masked) v, fused: the scores never reach memory
    (O(S) memory), as F.scaled_dot_product_attention.

    q [B, H, S, D], k [B, H, Sk, D], v [B, H, Sk, Dv], float32 or float64;
    returns [B, H, S, Dv]. causal: query i sees keys j <= i (top-left
    aligned, as PyTorch's is_causal). scale: default 1/sqrt(D). dropout_p: on
    the probabilities, scaled by 1/(1 - p); the mask is a counter-based
    function of (seed, offset, element), so the backward needs no stored
    mask. seed=None draws one from PyTorch's generator (torch.manual_seed
    makes it reproducible); pass seed and a fresh offset per call to choose.
    allow_tf32: on a GPU with tensor cores, float32 products in one TF32 pass
    (about 10 mantissa bits, as torch.backends.cuda.matmul.allow_tf32)
    instead of three (float32 accuracy, the default); nothing changes
    elsewhere or in float64.
    """
    check = Operands("flash_attention")
    q = check(q, "q", 4, "[B, H, S, D]")
    k = check(k, "k", 4, "[B, H, Sk, D]")
    v = check(v, "v", 4, "[B, H, Sk, Dv]")
    causal = flag("flash_attention", "causal", causal)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] > 0 else 1.0
    scale = number("flash_attention", "scale", scale)
    require(math.isfinite(scale), f"flash_attention: scale={scale!r}, expected a finite number")
    dropout = dropout_options("flash_attention", dropout_p, seed, offset)
    allow_tf32 = flag("flash_attention", "allow_tf32", allow_tf32)
    return _FlashAttention.apply(q, k, v, causal, scale, *dropout, allow_tf32)
