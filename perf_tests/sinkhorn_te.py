# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""TransformerEngine's Triton Sinkhorn for mHC (mhc_fused_sinkhorn, from the
NVIDIA/TransformerEngine sources; never part of this repository) as a peer
for perf_tests/compare_sinkhorn.py.

TransformerEngine's kernels live in transformer_engine/common/triton/mhc.py,
which needs only Triton; load(root) imports that one file from a checkout
`root`, without the package (its compiled extensions). Its semantics, which
kdnn reproduces with kdnn.sinkhorn(x, iters=iters, order="rows_first", eps=0.0):
n = 4 only, float32, in the log domain, rows normalised first (f), then the
columns (g), for a fixed number of iterations, output exp(f + x + g). Its
backward differentiates the iterations as run (the history recomputed), so
kdnn's like-for-like backward is backward="unrolled".

    te = sinkhorn_te.load(root)
    r = sinkhorn_te.forward(te, x, iters)           # x: [M, 4, 4] float32
    dx = sinkhorn_te.backward(te, x, r, g, iters)
"""
import importlib.util
import os

import torch
import triton

N = 4  # the only n TransformerEngine's kernels take


def load(root):
    """The module of TransformerEngine's Triton mHC kernels in the checkout `root`."""
    path = os.path.join(os.path.abspath(root), "transformer_engine", "common", "triton", "mhc.py")
    if not os.path.isfile(path):
        raise SystemExit(f"--te-root={root}: expected a NVIDIA/TransformerEngine checkout (no {path})")
    spec = importlib.util.spec_from_file_location("te_triton_mhc", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _grid(m):
    return lambda meta: (triton.cdiv(m * N * N, meta["BLOCK_SIZE"]),)


def forward(te, x, iters):
    """R of x [M, 4, 4] (float32, contiguous) by the recomputing forward kernel."""
    m = x.shape[0]
    x2 = x.reshape(m, N * N)
    out = torch.empty_like(x2)
    te._mhc_sinkhorn_fwd_fused_recompute[_grid(m)](
        x_ptr=x2, output_ptr=out, stride_xm=N * N, stride_xn=1, stride_out_m=N * N,
        stride_out_n=1, M=m, n=N, iters=iters)
    return out.view(m, N, N)


def backward(te, x, r, g, iters):
    """dX of the iterations as run, from x, the forward's r and the output's gradient g,
    by the recomputing backward kernel (its f/g history in scratch)."""
    m = x.shape[0]
    hist_f = torch.empty((iters + 1, m, N), device=x.device, dtype=x.dtype)
    hist_g = torch.empty_like(hist_f)
    dx = torch.empty((m, N * N), device=x.device, dtype=x.dtype)
    te._mhc_sinkhorn_bwd_fused_recompute[_grid(m)](
        grad_out_ptr=g.reshape(m, N * N), output_ptr=r.reshape(m, N * N), grad_x_ptr=dx,
        x_ptr=x.reshape(m, N * N), hist_f_ptr=hist_f, hist_g_ptr=hist_g,
        stride_grad_out_m=N * N, stride_grad_out_n=1, stride_out_m=N * N, stride_out_n=1,
        stride_grad_xm=N * N, stride_grad_xn=1, stride_xm=N * N, stride_xn=1,
        M=m, n=N, iters=iters)
    return dx.view(m, N, N)
