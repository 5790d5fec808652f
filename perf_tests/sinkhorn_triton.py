#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Triton version of the implicit Sinkhorn backward, after the reference
document's kernel: each program takes a tile of TILE matrices, forms
s_r = (G∘R)1, s_c = (G∘R)ᵀ1, runs n CG iterations on (I − RᵀR) v = s_c − Rᵀ s_r
with the matrix-free product Sp = p − Rᵀ(Rp) and the reference's EPS guards,
and writes dX = (G − u1ᵀ − 1vᵀ)∘R with u = s_r − Rv. Products are written as
broadcast multiply + reduction (valid for any power-of-two n; the reference's
tl.dot with a single right-hand-side column needs a newer Triton). TILE and
num_warps are autotuned as in the reference.

Used by compare_sinkhorn.py; run alone it checks itself against PyTorch
autograd (kdnn_reference.sinkhorn.autograd_backward) and exits 1 if the
relative error ||dX - dX_autograd||_F / ||dX_autograd||_F exceeds TOLERANCE at
any size (scripts/gpu-check.sh counts that as a failure):
  python3 perf_tests/sinkhorn_triton.py
With TRITON_INTERPRET=1 the check runs on the CPU in Triton's interpreter.
"""
import os
import sys

import torch
import triton
import triton.language as tl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "unit_tests", "reference"))
from kdnn_reference import sinkhorn  # noqa: E402

EPS = 1e-10
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# float32 kernel vs float32 autograd through the unrolled forward. Measured on
# these sizes: ~3e-7 for the torch implicit-CG formulation (CPU), 6.5e-7 and
# 4.6e-7 for this kernel in the interpreter. 1e-4 leaves room for reduction
# order on a GPU, while one wrong matrix among ~1000 gives ~1e-2 or more.
TOLERANCE = 1e-4
SIZES = ((1000, 16, 100), (1001, 4, 48))  # (B, n, iters)


@triton.jit
def _r_times(R, x):
    """(R x)_i = Σ_j R_ij x_j for a tile: R [TILE, N, N], x [TILE, N]."""
    return tl.sum(R * x[:, None, :], axis=2)


@triton.jit
def _rt_times(R, x):
    """(Rᵀ x)_j = Σ_i R_ij x_i."""
    return tl.sum(R * x[:, :, None], axis=1)


# The interpreter has no device to time configs on: one config (whose tiles do
# not divide B = 1001, so the tail mask is exercised) means no autotuning.
@triton.autotune(
    configs=[triton.Config({"TILE": 16}, num_warps=1, num_stages=1)] if INTERPRET else
    [triton.Config({"TILE": t}, num_warps=w, num_stages=1)
     for t in (1, 2, 4, 8, 16, 32, 64) for w in (1, 2, 4, 8)],
    key=["N"],
)
@triton.jit
def _implicit_backward_kernel(r_ptr, g_ptr, dx_ptr, batch, N: tl.constexpr, TILE: tl.constexpr,
                              EPS_: tl.constexpr):
    b = tl.program_id(0) * TILE + tl.arange(0, TILE)
    k = tl.arange(0, N)
    offs = b[:, None, None] * (N * N) + k[None, :, None] * N + k[None, None, :]
    mask = (b < batch)[:, None, None]
    R = tl.load(r_ptr + offs, mask=mask, other=0.0)
    G = tl.load(g_ptr + offs, mask=mask, other=0.0)
    W = R * G
    s_r = tl.sum(W, axis=2)
    s_c = tl.sum(W, axis=1)

    rhs = s_c - _rt_times(R, s_r)
    x = tl.zeros((TILE, N), dtype=tl.float32)
    res = rhs
    p = res
    rr = tl.sum(res * res, axis=1)
    for _ in range(N):
        sp = p - _rt_times(R, _r_times(R, p))
        alpha = rr / (tl.sum(p * sp, axis=1) + EPS_)
        x += alpha[:, None] * p
        res -= alpha[:, None] * sp
        rr_new = tl.sum(res * res, axis=1)
        p = res + (rr_new / (rr + EPS_))[:, None] * p
        rr = rr_new

    u = s_r - _r_times(R, x)
    dx = (G - u[:, :, None] - x[:, None, :]) * R
    tl.store(dx_ptr + offs, dx, mask=mask)


def implicit_backward(r, g):
    """dX for R, G of shape [B, n, n] (float32, contiguous, n a power of two)."""
    assert (r.is_cuda or INTERPRET) and r.dtype == torch.float32 and r.shape == g.shape
    batch, n, _ = r.shape
    r, g = r.contiguous(), g.contiguous()
    dx = torch.empty_like(r)
    grid = lambda meta: (triton.cdiv(batch, meta["TILE"]),)
    _implicit_backward_kernel[grid](r, g, dx, batch, N=n, EPS_=EPS)
    return dx


def _self_check():
    """0 if dX matches autograd within TOLERANCE at every size in SIZES, else 1."""
    device = "cpu" if INTERPRET else "cuda"
    torch.manual_seed(0)
    failed = []
    for batch, n, iters in SIZES:
        x = torch.rand(batch, n, n, device=device) * 4
        g = torch.randn(batch, n, n, device=device)
        r, dx_ref = sinkhorn.autograd_backward(x, g, iters)
        dx = implicit_backward(r, g)
        err = ((dx - dx_ref).norm() / dx_ref.norm()).item()
        ok = err <= TOLERANCE  # also False for NaN
        print(f"triton implicit backward B={batch} n={n} iters={iters}: relative error vs "
              f"autograd {err:.2e} (tolerance {TOLERANCE:.0e}) {'ok' if ok else 'FAILED'}")
        if not ok:
            failed.append(f"B={batch} n={n} iters={iters}: {err:.2e}")
    if failed:
        print(f"triton self-check FAILED (relative error > {TOLERANCE:.0e}): " + "; ".join(failed),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_self_check())
