# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""torch.nn modules around kdnn's operators."""
import math

import torch

from ._tensors import integer, require
from .mamba2 import causal_conv1d
from .mha import multi_head_attention
from .sinkhorn import sinkhorn


class CausalConv1d(torch.nn.Module):
    """Mamba's depthwise causal conv1d on channel-last [B, L, C] input, with
    weight [C, K] and bias [C] initialised as torch.nn.Conv1d's."""

    def __init__(self, channels, kernel_size=4, bias=True, activation="silu", dtype=None,
                 device=None):
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        channels = integer("nn.CausalConv1d", "channels", channels, 1, 2**31 - 1)
        kernel_size = integer("nn.CausalConv1d", "kernel_size", kernel_size, 1, 2**31 - 1)
        self.activation = activation
        self.weight = torch.nn.Parameter(torch.empty(channels, kernel_size, **kw))
        self.bias = torch.nn.Parameter(torch.empty(channels, **kw)) if bias else None
        bound = 1.0 / math.sqrt(kernel_size)  # Conv1d's fan_in with groups = channels
        torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x, initial_state=None):
        return causal_conv1d(x, self.weight, self.bias, initial_state, activation=self.activation)


class Sinkhorn(torch.nn.Module):
    """x [..., n, n] -> the doubly stochastic Sinkhorn(exp(x)) (mHC's
    residual mixing), with kdnn.sinkhorn's options."""

    def __init__(self, iters=20, order="columns_first", eps=0.0, backward="implicit"):
        super().__init__()
        self.iters, self.order, self.eps, self.backward = iters, order, eps, backward

    def forward(self, x):
        return sinkhorn(x, iters=self.iters, order=self.order, eps=self.eps, backward=self.backward)


class MultiheadAttention(torch.nn.Module):
    """Multi-head attention, batch first, computed by kdnn's layer
    (kdnn.multi_head_attention): projections of query, key and value to
    num_heads heads of embed_dim // num_heads, attention, and an output
    projection to embed_dim; weights initialised as
    torch.nn.MultiheadAttention's. kv_heads (kdnn's addition, default
    num_heads) sets grouped-query attention: w_k and w_v project to
    kv_heads heads of embed_dim // num_heads each. forward(query, key=None,
    value=None, *, causal=False, window=None, seq_lengths=None,
    residual=None) returns the output [B, S, embed_dim] only (no attention
    weights: the fused layer never forms them). Dropout applies in training
    mode."""

    def __init__(self, embed_dim, num_heads, bias=True, kdim=None, vdim=None, dropout=0.0,
                 algo="fused", dtype=None, device=None, *, kv_heads=None):
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        kdim, vdim = kdim or embed_dim, vdim or embed_dim
        op = "MultiheadAttention"
        embed_dim = integer(op, "embed_dim", embed_dim, 1, 2**31 - 1)
        num_heads = integer(op, "num_heads", num_heads, 1, embed_dim)
        require(embed_dim % num_heads == 0,
                f"{op}: num_heads={num_heads}, expected a divisor of embed_dim={embed_dim}")
        kv_heads = num_heads if kv_heads is None else integer(op, "kv_heads", kv_heads, 1,
                                                              num_heads)
        require(num_heads % kv_heads == 0,
                f"{op}: kv_heads={kv_heads}, expected a divisor of num_heads={num_heads}")
        self.num_heads, self.kv_heads, self.dropout, self.algo = num_heads, kv_heads, dropout, algo
        kv_dim = kv_heads * (embed_dim // num_heads)
        self.w_q = torch.nn.Parameter(torch.empty(embed_dim, embed_dim, **kw))
        self.w_k = torch.nn.Parameter(torch.empty(kv_dim, kdim, **kw))
        self.w_v = torch.nn.Parameter(torch.empty(kv_dim, vdim, **kw))
        self.w_o = torch.nn.Parameter(torch.empty(embed_dim, embed_dim, **kw))
        for w in (self.w_q, self.w_k, self.w_v):
            torch.nn.init.xavier_uniform_(w)
        torch.nn.init.kaiming_uniform_(self.w_o, a=math.sqrt(5))  # nn.Linear's
        sizes = {"b_q": embed_dim, "b_k": kv_dim, "b_v": kv_dim, "b_o": embed_dim}
        for name, size in sizes.items():
            self.register_parameter(
                name, torch.nn.Parameter(torch.zeros(size, **kw)) if bias else None)

    def forward(self, query, key=None, value=None, *, causal=False, window=None,
                seq_lengths=None, residual=None):
        key = query if key is None else key
        value = key if value is None else value
        return multi_head_attention(
            query, key, value, self.w_q, self.w_k, self.w_v, self.w_o, self.b_q, self.b_k,
            self.b_v, self.b_o, heads=self.num_heads, kv_heads=self.kv_heads, residual=residual,
            causal=causal, window=window, seq_lengths=seq_lengths,
            dropout_p=self.dropout if self.training else 0.0, algo=self.algo)
