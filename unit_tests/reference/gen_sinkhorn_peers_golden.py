#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Generate golden data for Sinkhorn with the semantics of two mHC kernels.

The peers (formulations in kdnn_reference/mhc_peers.py beside this script):
    te: NVIDIA TransformerEngine's log-domain reference, 20 iterations
        (kdnn: iters=20, order=rows_first, eps=0)
    tk: DeepSeek TileKernels' reference, repeat=10, eps=1e-6
        (kdnn: iters=10, order=rows_first, eps=1e-6)
Backward: given G = dL/dR, dX = d/dX sum(R * G) by PyTorch autograd through
the peer's forward.

Cases, for both peers: n in (4, 8) x batch in (1, 64) in f64 and f32, plus
batch 4096 for n = 4 in f32 only; and te n = 8, batch 64 with X scaled by 3
(suffix _s3), where 20 iterations are far from converged, so that the order
of the normalisations matters. X ~ scale * N(0, 1), G ~ N(0, 1).

X and G are sampled once per case in float64 with a fixed seed; the float32
inputs are the float64 inputs rounded to float32, and every computation is
done in the file's dtype.  For each case and dtype it writes, into
../data/sinkhorn relative to this script (C order, little-endian .npy):
    peers_{peer}_n{n}_b{batch}[_s3]_{dt}_x.npy   input X        [batch, n, n]
    peers_{peer}_n{n}_b{batch}[_s3]_{dt}_g.npy   input G        [batch, n, n]
    peers_{peer}_n{n}_b{batch}[_s3]_{dt}_r.npy   forward R      [batch, n, n]
    peers_{peer}_n{n}_b{batch}[_s3]_{dt}_dx.npy  gradient dX    [batch, n, n]

Run from the repository root:
    python3 unit_tests/reference/gen_sinkhorn_peers_golden.py
"""
import torch

import golden_io  # this script's directory is on sys.path
from kdnn_reference import mhc_peers

SEED = 20250301
PEERS = {  # name: (forward, its arguments)
    "te": (mhc_peers.te_forward, {"iterations": mhc_peers.TE_ITERATIONS}),
    "tk": (mhc_peers.tk_forward, {"repeat": mhc_peers.TK_REPEAT, "eps": mhc_peers.TK_EPS}),
}
DTYPES = {"f64": (torch.float64, "<f8"), "f32": (torch.float32, "<f4")}
CASES = (  # (peer, n, batch, scale of X, dtypes)
    [(p, n, b, 1.0, ("f64", "f32")) for p in PEERS for n in (4, 8) for b in (1, 64)]
    + [(p, 4, 4096, 1.0, ("f32",)) for p in PEERS]
    + [("te", 8, 64, 3.0, ("f64", "f32"))])


def main():
    for ci, (peer, n, batch, scale, dts) in enumerate(CASES):
        forward, kwargs = PEERS[peer]
        gen = torch.Generator().manual_seed(SEED + ci)
        x64 = torch.randn((batch, n, n), generator=gen, dtype=torch.float64) * scale
        g64 = torch.randn((batch, n, n), generator=gen, dtype=torch.float64)
        case = f"peers_{peer}_n{n}_b{batch}" + ("" if scale == 1.0 else f"_s{scale:g}")
        for dt in dts:
            tdtype, np_dtype = DTYPES[dt]
            x = x64.to(tdtype, copy=True)
            g = g64.to(tdtype, copy=True)
            r, dx = mhc_peers.autograd_backward(forward, x, g, **kwargs)
            golden_io.write_case(f"{case}_{dt}", x, g, r, dx, np_dtype)
    print(f"wrote golden files to {golden_io.OUT_DIR}")


if __name__ == "__main__":
    main()
