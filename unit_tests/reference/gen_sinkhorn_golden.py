#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
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
import torch

import golden_io  # this script's directory is on sys.path
from kdnn_reference import sinkhorn

SEED = 20240607
CASES = [  # (name, n, iters, batch)
    ("n4_it48", 4, 48, 32),
    ("n16_it100", 16, 100, 24),
]
DTYPES = [("f64", torch.float64, "<f8"), ("f32", torch.float32, "<f4")]


def main():
    for ci, (case, n, iters, batch) in enumerate(CASES):
        gen = torch.Generator().manual_seed(SEED + ci)
        x64 = torch.rand((batch, n, n), generator=gen, dtype=torch.float64) * 4.0
        g64 = torch.randn((batch, n, n), generator=gen, dtype=torch.float64)
        for dt, tdtype, np_dtype in DTYPES:
            x = x64.to(tdtype, copy=True)
            g = g64.to(tdtype, copy=True)
            r, dx = sinkhorn.autograd_backward(x, g, iters)
            golden_io.write_case(f"{case}_{dt}", x, g, r, dx, np_dtype)
    print(f"wrote golden files to {golden_io.OUT_DIR}")


if __name__ == "__main__":
    main()
