#!/usr/bin/env python3
"""Generate golden data for the Sinkhorn-Knopp operator (mHC reference).

Forward (X is [B, n, n]):
    P = exp(X); R = P
    repeat `iters` times:
        R = R / R.sum(-2, keepdim=True)   # divide by column sums
        R = R / R.sum(-1, keepdim=True)   # divide by row sums
Backward: given G = dL/dR, dX = d/dX sum(R * G), computed with PyTorch
autograd through the unrolled iterations.  Both formulations are those of
kdnn_reference/sinkhorn.py beside this script (forward, autograd_backward).

Cases (name: n, iters, B), X ~ Uniform(0, 4), G ~ N(0, 1):
    n4_it48:   n=4,  iters=48,  B=32
    n16_it100: n=16, iters=100, B=24

X and G are sampled once per case in float64 with a fixed seed; the float32
inputs are the float64 inputs rounded to float32, and every computation is
done in the file's dtype.  For each case and dt in (f64, f32) it writes, into
../data/sinkhorn relative to this script (C order, little-endian .npy):
    {case}_{dt}_x.npy   input X        [B, n, n]
    {case}_{dt}_g.npy   input G        [B, n, n]
    {case}_{dt}_r.npy   forward R      [B, n, n]
    {case}_{dt}_dx.npy  gradient dX    [B, n, n]

Run from the repository root:
    python3 unit_tests/reference/gen_sinkhorn_golden.py
"""
import os

import numpy as np
import torch

from kdnn_reference import sinkhorn  # this script's directory is on sys.path

SEED = 20240607
CASES = [  # (name, n, iters, batch)
    ("n4_it48", 4, 48, 32),
    ("n16_it100", 16, 100, 24),
]
DTYPES = [("f64", torch.float64, "<f8"), ("f32", torch.float32, "<f4")]
OUT_DIR = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "sinkhorn"))


def save(name, t, np_dtype):
    a = np.ascontiguousarray(t.detach().cpu().numpy().astype(np_dtype))
    np.save(os.path.join(OUT_DIR, name + ".npy"), a)
    return a


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    for ci, (case, n, iters, batch) in enumerate(CASES):
        gen = torch.Generator().manual_seed(SEED + ci)
        x64 = torch.rand((batch, n, n), generator=gen, dtype=torch.float64) * 4.0
        g64 = torch.randn((batch, n, n), generator=gen, dtype=torch.float64)
        for dt, tdtype, np_dtype in DTYPES:
            x = x64.to(tdtype, copy=True)
            g = g64.to(tdtype, copy=True)
            r, dx = sinkhorn.autograd_backward(x, g, iters)
            prefix = f"{case}_{dt}"
            save(prefix + "_x", x, np_dtype)
            save(prefix + "_g", g, np_dtype)
            r_np = save(prefix + "_r", r, np_dtype)
            dx_np = save(prefix + "_dx", dx, np_dtype)
            r_d = r_np.astype(np.float64)
            row_err = np.abs(r_d.sum(-1) - 1.0).max()
            col_err = np.abs(r_d.sum(-2) - 1.0).max()
            dx_norm = np.linalg.norm(dx_np.astype(np.float64))
            print(f"{prefix}: shape={r_np.shape} max|rowsum-1|={row_err:.3e} "
                  f"max|colsum-1|={col_err:.3e} ||dx||={dx_norm:.6e}")
    print(f"wrote golden files to {OUT_DIR}")


if __name__ == "__main__":
    main()
