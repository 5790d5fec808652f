# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""torch.nn modules around kdnn's operators."""
import math

import torch

from .mamba2 import causal_conv1d
from .sinkhorn import sinkhorn


class CausalConv1d(torch.nn.Module):
    """Mamba's depthwise causal conv1d on channel-last [B, L, C] input, with
    weight [C, K] and bias [C] initialised as torch.nn.Conv1d's."""

    def __init__(self, channels, kernel_size=4, bias=True, activation="silu", dtype=None,
                 device=None):
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        self.activation = activation
        self.weight = torch.nn.Parameter(torch.empty(channels, kernel_size, **kw))
        self.bias = torch.nn.Parameter(torch.empty(channels, **kw)) if bias else None
        bound = 1.0 / math.sqrt(kernel_size)  # Conv1d's fan_in with groups = channels
        torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x, initial_state=None):
        return causal_conv1d(x, self.weight, self.bias, self.activation, initial_state)


class Sinkhorn(torch.nn.Module):
    """x [..., n, n] -> the doubly stochastic Sinkhorn(exp(x)) (mHC's
    residual mixing), with kdnn.sinkhorn's options."""

    def __init__(self, iters=20, order="columns_first", eps=0.0, backward="implicit"):
        super().__init__()
        self.iters, self.order, self.eps, self.backward = iters, order, eps, backward

    def forward(self, x):
        return sinkhorn(x, self.iters, self.order, self.eps, self.backward)
