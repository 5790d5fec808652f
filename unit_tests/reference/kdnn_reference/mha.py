# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Multi-head attention (kdnn's attention/mha.hpp layer) in PyTorch.

Written with torch.nn.functional, independently of kdnn's kernels, for
q [B, S, Eq], k [B, Sk, Ek], v [B, Sk, Ev] and nn.Linear parameters
w_q [H*D, Eq], w_k [Hkv*D, Ek], w_v [Hkv*Dv, Ev], w_o [Eo, H*Dv] (y = x W^T + b;
every bias optional; Hkv = kv_heads divides H, default H):
    Q = F.linear(q, w_q, b_q), K = ..., V = ...   head h: columns h*D..(h+1)*D-1
    K and V repeated per query head (repeat_interleave by H / Hkv: query head
        h reads key/value head h // (H / Hkv), as Hugging Face's repeat_kv)
    scores = s * Q_h K_h^T   [B, H, S, Sk]         s = sm_scaler, default 1/sqrt(D)
    P = softmax over the visible keys: masked scores filled with -inf; a row
        with no visible key is all zeros (its scores are set finite before the
        softmax and its probabilities zeroed after, so no NaN reaches autograd)
    A_h = (P * keep / (1 - p)) V_h, heads side by side   [B, S, H*Dv]
    out = F.linear(A, w_o, b_o) + residual, then rows i >= seq_q[b] zeroed
The mask (visible): query i of entry b sees key j iff j < seq_k[b],
i < seq_q[b], lo[i] <= j < hi[i] and, if causal, j <= i.

Every function computes in the dtype of its inputs.
"""
import math

import torch
import torch.nn.functional as F

INPUTS = ("q", "k", "v", "residual")
PARAMS = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")


def visible(batch, seq_q, seq_k, causal=False, lo=None, hi=None, lens_q=None, lens_k=None):
    """The mask [B, S, Sk] (bool): which keys each query sees."""
    i = torch.arange(seq_q)[:, None]
    j = torch.arange(seq_k)[None, :]
    m = torch.ones(batch, seq_q, seq_k, dtype=torch.bool)
    if lo is not None:
        m &= j >= torch.as_tensor(lo)[:, None]
    if hi is not None:
        m &= j < torch.as_tensor(hi)[:, None]
    if causal:
        m &= j <= i
    if lens_q is not None:
        m &= (i < torch.as_tensor(lens_q)[:, None, None])
    if lens_k is not None:
        m &= (j < torch.as_tensor(lens_k)[:, None, None])
    return m


def forward(t, heads, mask, sm_scaler=None, keep=None, p=0.0, lens_q=None, kv_heads=None):
    """out [B, S, Eo] for tensors t (a dict with INPUTS and PARAMS, None where
    absent), the mask [B, S, Sk] from visible(), the keep mask [B, H, S, Sk]
    (None: no dropout), the query lengths [B] (None: no padded query) and
    the key/value heads (None: heads)."""
    B, S, _ = t["q"].shape
    Sk = t["k"].shape[1]
    H = heads
    Hkv = kv_heads or heads

    def split(x, rows, n):  # [B, rows, n*d] -> [B, n, rows, d] -> [B, H, rows, d]
        return x.reshape(B, rows, n, -1).transpose(1, 2).repeat_interleave(H // n, dim=1)

    Q = split(F.linear(t["q"], t["w_q"], t["b_q"]), S, H)
    K = split(F.linear(t["k"], t["w_k"], t["b_k"]), Sk, Hkv)
    V = split(F.linear(t["v"], t["w_v"], t["b_v"]), Sk, Hkv)
    s = sm_scaler if sm_scaler is not None else 1.0 / math.sqrt(Q.shape[-1])
    scores = s * torch.matmul(Q, K.transpose(-1, -2))
    seen = mask[:, None]  # [B, 1, S, Sk]
    empty = ~seen.any(-1, keepdim=True)  # rows with no visible key
    scores = scores.masked_fill(~seen, -math.inf).masked_fill(empty, 0.0)
    P = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)
    if keep is not None:
        P = P * keep.to(P.dtype) / (1.0 - p)
    A = torch.matmul(P, V).transpose(1, 2).reshape(B, S, -1)
    out = F.linear(A, t["w_o"], t["b_o"])
    if t["residual"] is not None:
        out = out + t["residual"]
    if lens_q is not None:
        padded = torch.arange(S)[None, :] >= torch.as_tensor(lens_q)[:, None]
        out = out.masked_fill(padded[..., None], 0.0)
    return out


def autograd_backward(t, dout, **kw):
    """(out, grads) with grads[name] = dL/d t[name] for every tensor given in
    t, L = sum(dout * out), by autograd through forward(t, **kw)."""
    leaves = {n: (x.detach().requires_grad_(True) if x is not None else None)
              for n, x in t.items()}
    out = forward(leaves, **kw)
    (dout * out).sum().backward()
    return out.detach(), {n: x.grad for n, x in leaves.items() if x is not None}
