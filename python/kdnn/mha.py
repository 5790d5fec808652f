# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.multi_head_attention: the whole multi-head attention layer (the
eigenMHA / cuDNN scope) as one autograd function, and kdnn.nn.MultiheadAttention."""
import math

import torch

from . import _kdnn
from ._options import Options
from ._tensors import (Operands, dropout_options, first_order, flag, int32_vector, integer, number,
                       offsets, require, stream_of, windows)

ALGOS = ("fused", "unfused")
_ALGO_OF = {name: getattr(_kdnn.AttentionAlgo, name) for name in ALGOS}  # as C++ names them
PARAMS = {"w_q": "[H*D, Eq]", "w_k": "[Hkv*D, Ek]", "w_v": "[Hkv*Dv, Ev]", "w_o": "[Eo, H*Dv]",
          "b_q": "[H*D]", "b_k": "[Hkv*D]", "b_v": "[Hkv*Dv]", "b_o": "[Eo]"}


class _MultiHeadAttention(torch.autograd.Function):
    """options: the MhaOptions record; mask: the AttentionMask record
    (windows and lengths, int32 copies); cu_q, cu_k: the packed sequences'
    offsets, or None; sizes: the MhaBufferSizes record (elements of the
    reserve and of the workspace)."""

    @staticmethod
    def forward(ctx, options, mask, cu_q, cu_k, sizes, q, k, v, residual, *params):
        reserve = q.new_empty(sizes.reserve)  # kept for the backward
        out = q.new_empty(q.shape[0], q.shape[1], params[3].shape[0])
        _kdnn.mha_forward(q, k, v, residual, _kdnn.MhaParams(*params), out, reserve,
                          q.new_empty(sizes.workspace), cu_q, cu_k, options.bound(), mask.bound(),
                          stream_of(q))
        ctx.save_for_backward(q, k, v, reserve, cu_q, cu_k, *params)
        ctx.options, ctx.mask, ctx.sizes = options, mask, sizes
        ctx.has_residual = residual is not None
        return out

    @staticmethod
    @first_order("multi_head_attention")
    def backward(ctx, dout):
        q, k, v, reserve, cu_q, cu_k, *params = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dres = torch.empty_like(dout) if ctx.has_residual else None
        grads = [None if p is None else torch.empty_like(p) for p in params]
        _kdnn.mha_backward(dout.contiguous(), dq, dk, dv, dres, q, k, v, _kdnn.MhaParams(*params),
                           _kdnn.MhaParams(*grads), reserve, q.new_empty(ctx.sizes.workspace),
                           cu_q, cu_k, ctx.options.bound(), ctx.mask.bound(), stream_of(q))
        return (None, None, None, None, None, dq, dk, dv, dres, *grads)


def multi_head_attention(query, key, value, w_q, w_k, w_v, w_o, b_q=None, b_k=None, b_v=None,
                         b_o=None, *, heads, kv_heads=None, residual=None, causal=False,
                         window=None, seq_lengths=None, cu_seqlens=None, scale=None,
                         dropout_p=0.0, seed=None, offset=0, algo="fused", check_finite=False):
    """The multi-head attention layer, batch first:

        Q = query w_q^T + b_q,  K = key w_k^T + b_k,  V = value w_v^T + b_v
        head h: softmax(scale Q_h K_g^T, masked) V_g, heads side by side
        out = A w_o^T + b_o (+ residual)

    query [B, S, Eq], key [B, Sk, Ek], value [B, Sk, Ev]; weights as
    nn.Linear's: w_q [H*D, Eq], w_k [Hkv*D, Ek], w_v [Hkv*Dv, Ev],
    w_o [Eo, H*Dv], biases [H*D], [Hkv*D], [Hkv*Dv], [Eo] (each optional).
    kv_heads = Hkv, dividing heads = H (default H): grouped-query attention,
    query head h reading key/value head g = h // (H // Hkv) (Hugging Face's
    num_key_value_heads; 1 is multi-query attention). Masks: causal (key
    j <= query i), window = (lo, hi) integer vectors [S] (query i sees keys
    lo[i] <= j < hi[i], cuDNN's windows), seq_lengths = (seq_q, seq_k)
    integer vectors [B] (queries i >= seq_q[b] are padding: their output and
    gradients are zero; keys j >= seq_k[b] are not seen). A query that sees
    no key outputs b_o (+ residual). cu_seqlens = (cu_seqlens_q,
    cu_seqlens_k), integer vectors [N + 1] each: packed sequences
    (flash-attn's varlen layout) along S and Sk of the one batch entry
    (B = 1, algo "fused"): sequence n's queries are rows cu_seqlens_q[n] to
    cu_seqlens_q[n + 1] - 1 and see only its keys, those of cu_seqlens_k
    (kdnn.flash_attention_varlen's semantics); the offsets are copied to the
    host and checked. scale: default 1/sqrt(D). Dropout on the
    probabilities as kdnn.flash_attention's. algo: "fused" (flash attention,
    O(S) memory) or "unfused" (keeps the probabilities [B, H, S, Sk]).
    check_finite: refuse a NaN or an infinity in the inputs, the weights
    and the incoming gradient, naming the first (the layer's names: q, k,
    v for query, key, value); without it they propagate, as in PyTorch.
    Returns out [B, S, Eo].
    """
    check = Operands("multi_head_attention")
    query = check(query, "query", 3, "[B, S, Eq]")
    key = check(key, "key", 3, "[B, Sk, Ek]")
    value = check(value, "value", 3, "[B, Sk, Ev]")
    residual = check(residual, "residual", 3, "[B, S, Eo]", optional=True)
    params = [check(p, name, 2 if name.startswith("w") else 1, layout,
                    optional=name.startswith("b"))
              for p, (name, layout) in zip((w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o), PARAMS.items())]
    heads = integer("multi_head_attention", "heads", heads, 1, 2**31 - 1)
    kv_heads = heads if kv_heads is None else integer("multi_head_attention", "kv_heads",
                                                      kv_heads, 1, heads)
    require(heads % kv_heads == 0,
            f"multi_head_attention: kv_heads={kv_heads}, expected a divisor of heads={heads}")
    causal = flag("multi_head_attention", "causal", causal)
    require(algo in ALGOS, f"multi_head_attention: algo={algo!r}, expected one of {ALGOS}")
    dropout = dropout_options("multi_head_attention", dropout_p, seed, offset)
    scale = None if scale is None else number("multi_head_attention", "scale", scale)
    require(scale is None or math.isfinite(scale),
            f"multi_head_attention: scale={scale!r}, expected a finite number or None")
    B, S, _ = query.shape
    Sk = key.shape[1]
    wq, wk, wv, wo = params[:4]
    require(wq.shape[0] % heads == 0 and wv.shape[0] % kv_heads == 0,
            f"multi_head_attention: w_q has {wq.shape[0]} rows and w_v {wv.shape[0]}, expected "
            f"multiples of heads={heads} and kv_heads={kv_heads}")
    options = Options("MhaOptions", heads=heads, kv_heads=kv_heads, sm_scaler=scale,
                      dropout=dropout, algo=_ALGO_OF[algo],
                      check_finite=flag("multi_head_attention", "check_finite", check_finite))
    lo_win, hi_win = windows("multi_head_attention", window, S, query.device)
    seq_q = seq_k = None
    if seq_lengths is not None:
        seq_q = int32_vector("multi_head_attention", "seq_lengths[0]", seq_lengths[0], B,
                             query.device)
        seq_k = int32_vector("multi_head_attention", "seq_lengths[1]", seq_lengths[1], B,
                             query.device)
    mask = Options("AttentionMask", causal=causal, lo_win=lo_win, hi_win=hi_win, seq_q=seq_q,
                   seq_k=seq_k)
    cu_q = cu_k = None
    if cu_seqlens is not None:
        require(isinstance(cu_seqlens, (tuple, list)) and len(cu_seqlens) == 2,
                f"multi_head_attention: cu_seqlens is a {type(cu_seqlens).__name__}, expected "
                "(cu_seqlens_q, cu_seqlens_k)")
        cu_q = offsets("multi_head_attention", "cu_seqlens[0]", cu_seqlens[0], query.device)
        cu_k = offsets("multi_head_attention", "cu_seqlens[1]", cu_seqlens[1], query.device)
    shape = Options("MhaShape", batch=B, seq_q=S, seq_k=Sk, q_size=query.shape[2],
                    k_size=key.shape[2], v_size=value.shape[2], heads=heads, kv_heads=kv_heads,
                    head_dim=wq.shape[0] // heads, v_head_dim=wv.shape[0] // kv_heads,
                    o_size=wo.shape[0], algo=_ALGO_OF[algo])
    found = _kdnn.mha_buffer_sizes(shape.bound())
    sizes = Options("MhaBufferSizes", reserve=found.reserve, workspace=found.workspace)
    return _MultiHeadAttention.apply(options, mask, cu_q, cu_k, sizes, query, key, value, residual,
                                     *params)
