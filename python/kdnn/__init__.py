# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn: Kokkos training operators as PyTorch autograd functions.

    kdnn.sinkhorn(x, *, iters, order, eps, backward)          mHC Sinkhorn-Knopp
    kdnn.flash_attention(q, k, v, *, causal, scale, ...)      fused attention
    kdnn.flash_attention_varlen(q, k, v, cu_q, cu_k, *, ...)  ... of packed sequences
    kdnn.multi_head_attention(q, k, v, w_q, ..., *, heads)    the attention layer
    kdnn.causal_conv1d(x, weight, bias, *, activation, ...)   Mamba's conv1d
    kdnn.causal_conv1d_update(x, conv_state, weight, ...)     its decoding step
    kdnn.dt_softplus(dt, dt_bias, *, dt_limit)                Mamba-2's step sizes
    kdnn.ssd(x, dt, A, B, C, D, *, chunk_size, ...)           Mamba-2's SSD scan
    kdnn.nn                                                   modules
    kdnn.cp                                                   context parallel (MPI)
    kdnn.compat                                               the peers' interfaces

Tensors are float32 or float64, on the CPU (and on CUDA GPUs with a CUDA
build); contiguous ones are used in place, without a copy. Tensors are
positional, options keyword-only. Bad input raises kdnn.Error (a
ValueError) naming the argument. See docs/python.md.
"""
import atexit

try:
    import torch  # noqa: F401  (kdnn's operators are torch autograd functions)
except ImportError as e:  # pragma: no cover
    raise ImportError("kdnn needs PyTorch: install torch first") from e

from . import _kdnn
from ._tensors import Error
from .attention import flash_attention, flash_attention_varlen
from .mamba2 import causal_conv1d, causal_conv1d_update, dt_softplus, ssd
from .mha import multi_head_attention
from .sinkhorn import sinkhorn
from . import compat, cp, nn

__version__ = _kdnn.version
backend = _kdnn.backend()
atexit.register(_kdnn.finalize)

__all__ = ["Error", "sinkhorn", "flash_attention", "flash_attention_varlen", "multi_head_attention",
           "causal_conv1d", "causal_conv1d_update", "dt_softplus", "ssd", "cp", "compat", "nn",
           "backend"]
