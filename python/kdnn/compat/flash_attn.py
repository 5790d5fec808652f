# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""flash-attn's flash_attn_func (and its packed forms) on kdnn's fused
attention: q (batch, seqlen, nheads, headdim), k and v (batch, seqlen_k,
nheads_k, headdim), nheads_k dividing nheads (GQA, MQA); and
flash_attn_varlen_func (and its packed forms) on
kdnn.flash_attention_varlen: q (total_q, nheads, headdim), k and v
(total_k, nheads_k, headdim), sequences at the offsets cu_seqlens_q and
cu_seqlens_k, each masked, aligned and biased with its own lengths.

flash-attn's causal mask and windows are aligned to the bottom right: query
i sees key j when i + seqlen_k - seqlen_q - window_size[0] <= j <=
i + seqlen_k - seqlen_q + window_size[1] (-1, or seqlen_k or more: no
bound; causal: right bound 0); kdnn takes them as its band (no per-query
vectors, no copy to the host). The (batch, seqlen, nheads, headdim)
tensors, and the packed forms' slices, are read in place through their
strides as kdnn's (batch, nheads, seqlen, headdim), and the output and the
gradients are written in flash-attn's layout: no copy. float32 and float64
(flash-attn's fp16 and bf16 are not kdnn's types).
"""
import math
import numbers
import operator

import torch

from .. import attention
from .._tensors import Error, require


def _band(Sk, causal, window_size):
    """flash-attn's mask as kdnn's band (left, right) around each query's
    bottom-right diagonal, as flash-attn takes it: a negative bound, or one
    of seqlen_k or more, is none (-1; flash-attn's mha_fwd sets it so, which
    for seqlen_q > seqlen_k is not the same as the bound), and causal's
    right bound is 0."""
    left, right = (-1 if w < 0 or w >= Sk else w for w in window_size)
    return left, 0 if causal else right


def _integer(value):
    """value as a Python int when it is an integer (Python's, NumPy's, any
    numbers.Integral but bool), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return operator.index(value)


def _window(op, window_size):
    """window_size as (left, right) Python integers (NumPy's accepted)."""
    pair = tuple(window_size) if isinstance(window_size, (tuple, list)) else ()
    bounds = tuple(_integer(w) for w in pair)
    require(len(bounds) == 2 and None not in bounds,
            f"{op}: window_size={window_size!r}, expected (left, right) integers (-1: no bound)")
    return bounds


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, sinks=None):
    """flash-attn's flash_attn_func. Returns out (batch, seqlen, nheads,
    headdim_v); with return_attn_probs, (out, softmax_lse (batch, nheads,
    seqlen), None): kdnn does not return the attention probabilities, and
    softmax_lse is +inf for a query that sees no key, as flash-attn's.
    deterministic is accepted and has no effect: kdnn's backward always is.
    softcap > 0 caps the scaled scores as flash-attn's (softcap·tanh(s /
    softcap)). alibi_slopes (nheads,) or (batch, nheads): -slope·|i +
    seqlen_k - seqlen_q - j| added to the scores, as flash-attn's; under
    its causal mask (no left window) flash-attn adds slope·j instead, which
    differs by a constant of each row: the same output, and softmax_lse is
    returned as flash-attn's. sinks (nheads,): attention sinks (gpt-oss's,
    flash-attn 3's learnable sink), differentiable: each head's logit joins
    every row's softmax denominator, and softmax_lse includes it."""
    op = "compat.flash_attn.flash_attn_func"
    for name, t in (("q", q), ("k", k), ("v", v)):
        require(isinstance(t, torch.Tensor) and t.dim() == 4,
                f"{op}: {name} has shape {list(getattr(t, 'shape', []))}, expected (batch, seqlen, "
                "nheads, headdim)")
    window_size = _window(op, window_size)
    if not isinstance(causal, bool):
        raise Error(f"{op}: causal={causal!r}, expected True or False")
    S, Sk = q.shape[1], k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    band = _band(Sk, causal, window_size)
    out, lse = attention.flash_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), band=band, scale=scale,
        softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks, dropout_p=dropout_p,
        return_lse=True)
    out = out.transpose(1, 2)  # (batch, seqlen, nheads, headdim_v) memory, as flash-attn's
    if not return_attn_probs:
        return out
    if alibi_slopes is not None and band == (-1, 0):
        # flash-attn's causal form (right bound 0, no left bound) adds the
        # bias slope·j, kdnn's −slope·(i + Sk − S − j) plus slope·(i + Sk −
        # S): its lse is kdnn's plus that.
        slopes = torch.as_tensor(alibi_slopes, device=lse.device, dtype=lse.dtype)
        diagonal = torch.arange(S, device=lse.device, dtype=lse.dtype) + (Sk - S)
        lse = lse + slopes.reshape(-1, q.shape[2], 1) * diagonal
    return out, torch.where(lse == -math.inf, math.inf, lse), None


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """flash_attn_func with kv (batch, seqlen_k, 2, nheads_k, headdim)."""
    require(isinstance(kv, torch.Tensor) and kv.dim() == 5 and kv.shape[2] == 2,
            f"compat.flash_attn.flash_attn_kvpacked_func: kv has shape "
            f"{list(getattr(kv, 'shape', []))}, expected (batch, seqlen_k, 2, nheads_k, headdim)")
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """flash_attn_func with qkv (batch, seqlen, 3, nheads, headdim)."""
    require(isinstance(qkv, torch.Tensor) and qkv.dim() == 5 and qkv.shape[2] == 3,
            f"compat.flash_attn.flash_attn_qkvpacked_func: qkv has shape "
            f"{list(getattr(qkv, 'shape', []))}, expected (batch, seqlen, 3, nheads, headdim)")
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale,
                           causal, window_size, softcap, alibi_slopes, deterministic,
                           return_attn_probs)


def _longest(cu_seqlens):
    """The longest length of packed sequences' offsets, or None when they
    are not a vector of integers (flash_attention_varlen says why)."""
    if not isinstance(cu_seqlens, torch.Tensor):
        try:
            cu_seqlens = torch.as_tensor(cu_seqlens)
        except (TypeError, ValueError, RuntimeError):
            return None
    if (cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.is_floating_point()
            or cu_seqlens.is_complex() or cu_seqlens.device.type == "meta"):
        return None
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())


def _varlen_alibi_lse(lse, alibi_slopes, cu_q, cu_k):
    """flash-attn's lse under its causal form with ALiBi (see
    flash_attn_func): kdnn's plus slope·d, d = i + seqlen_k - seqlen_q the
    diagonal of query i of its sequence."""
    heads, total = lse.shape
    cu_q = torch.as_tensor(cu_q, device=lse.device, dtype=torch.int64)
    cu_k = torch.as_tensor(cu_k, device=lse.device, dtype=torch.int64)
    lengths_q, lengths_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    seq = torch.repeat_interleave(torch.arange(lengths_q.shape[0], device=lse.device), lengths_q,
                                  output_size=total)
    diagonal = (torch.arange(total, device=lse.device) - cu_q[seq] + (lengths_k - lengths_q)[seq])
    slopes = torch.as_tensor(alibi_slopes, device=lse.device, dtype=lse.dtype)
    if slopes.dim() == 2 and slopes.shape[0] == 1:  # [1, nheads]: every sequence's
        slopes = slopes[0]
    per_token = slopes.reshape(heads, 1) if slopes.dim() == 1 else slopes[seq].transpose(0, 1)
    return lse + per_token * diagonal.to(lse.dtype)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, sinks=None):
    """flash-attn's flash_attn_varlen_func. Returns out (total_q, nheads,
    headdim_v); with return_attn_probs, (out, softmax_lse (nheads,
    total_q), None), as flash_attn_func's. The lengths are read from
    cu_seqlens_q and cu_seqlens_k (kdnn copies them to the host and checks
    them); max_seqlen_k bounds the window as flash-attn's (a bound of
    max_seqlen_k or more is none), max_seqlen_q is accepted. alibi_slopes
    (nheads,) or (batch, nheads), batch the number of sequences. sinks
    (nheads,): as flash_attn_func's. block_table (a paged KV cache) is not
    supported."""
    op = "compat.flash_attn.flash_attn_varlen_func"
    for name, t in (("q", q), ("k", k), ("v", v)):
        require(isinstance(t, torch.Tensor) and t.dim() == 3,
                f"{op}: {name} has shape {list(getattr(t, 'shape', []))}, expected (total, nheads, "
                "headdim)")
    require(block_table is None,
            f"{op}: block_table is given, expected None (kdnn has no paged KV cache)")
    window_size = _window(op, window_size)
    if not isinstance(causal, bool):
        raise Error(f"{op}: causal={causal!r}, expected True or False")
    for name, m, cu in (("max_seqlen_q", max_seqlen_q, cu_seqlens_q),
                        ("max_seqlen_k", max_seqlen_k, cu_seqlens_k)):
        require(_integer(m) is not None and m >= 0,
                f"{op}: {name}={m!r}, expected an integer >= 0")
        # flash-attn sizes its grid by them: a shorter bound would drop rows
        # or keys, which kdnn refuses rather than reproduce.
        longest = _longest(cu)
        require(longest is None or m >= longest,
                f"{op}: {name}={m!r}, expected at least the longest sequence's length "
                f"({longest}, from cu_seqlens_{name[-1]})")
    max_seqlen_k = _integer(max_seqlen_k)
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    band = _band(max_seqlen_k, causal, window_size)
    out, lse = attention.flash_attention_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, band=band, scale=scale, softcap=softcap,
        alibi_slopes=alibi_slopes, sinks=sinks, dropout_p=dropout_p, return_lse=True)
    if not return_attn_probs:
        return out
    if alibi_slopes is not None and band == (-1, 0):
        lse = _varlen_alibi_lse(lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k)
    return out, torch.where(lse == -math.inf, math.inf, lse), None


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None, causal=False,
                                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                    deterministic=False, return_attn_probs=False):
    """flash_attn_varlen_func with kv (total_k, 2, nheads_k, headdim)."""
    require(isinstance(kv, torch.Tensor) and kv.dim() == 4 and kv.shape[1] == 2,
            f"compat.flash_attn.flash_attn_varlen_kvpacked_func: kv has shape "
            f"{list(getattr(kv, 'shape', []))}, expected (total_k, 2, nheads_k, headdim)")
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn_varlen_func with qkv (total, 3, nheads, headdim), the
    queries' and keys' offsets both cu_seqlens."""
    require(isinstance(qkv, torch.Tensor) and qkv.dim() == 4 and qkv.shape[1] == 3,
            f"compat.flash_attn.flash_attn_varlen_qkvpacked_func: qkv has shape "
            f"{list(getattr(qkv, 'shape', []))}, expected (total, 3, nheads, headdim)")
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens,
                                  max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)
