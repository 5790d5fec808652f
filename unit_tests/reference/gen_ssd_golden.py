#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Generate golden data for Mamba-2's SSD (ssm/ssd.hpp) from the chunked
PyTorch formulation kdnn_reference.ssd.ssd_chunked, differentiated by
autograd in float64:

    y, final = ssd_chunked(x, dt, A, B, C, chunk, D, init)
    loss = sum(y * dy) + sum(final * dfinal)

expected y, final and the gradients dx, ddt, dA, dB, dC (and dD, dinit
where D and init are given). Before anything is written each case is
cross-checked against the definition run one step at a time in NumPy float64
(h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t), and the
smallest case's gradients with torch.autograd.gradcheck.

Cases (CASES): "basic" (two groups of two heads, D, an initial state and a
final-state gradient, Q divides L), "ragged" (Q = 8 does not divide L = 19,
one group, nothing optional), "per_head" (G = H, initial state and
final-state gradient, no D) and "long" (L = 300 with dt·A down to -30 per
step: decays that underflow).

Inputs are drawn in float64 with a fixed seed per case and rounded to
float32 (x, B, C, init, dy, dfinal ~ N(0, 1); dt ~ U(0.05, 0.6); A ~
U(-1.5, -0.2); D ~ U(-1, 1)); the expected values are computed in float64
from the rounded inputs. It writes into ../data/ssm relative to this script
(C order, little-endian .npy), with P = ssd_{case}_:
    P{x,dt,a,b,c,dy}.npy inputs and P{d,init,dfinal}.npy optional inputs,
    float32 (the names `kdnn ssd --in` reads); P{y,final,dx,ddt,da,db,dc}.npy
    and P{dd,dinit}.npy expected, float64; Pmeta.json {"chunk", "d", "init",
    "dfinal"} (the last three: whether that optional input exists).

Run from the repository root:
    python3 unit_tests/reference/gen_ssd_golden.py
"""
import json
import os

import numpy as np
import torch

import golden_io  # this script's directory is on sys.path
from kdnn_reference.ssd import ssd_chunked

SEED = 20251123
OUT_DIR = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "ssm"))
CASES = [
    dict(name="basic", B=2, L=24, H=4, P=4, G=2, N=3, chunk=8, d=True, init=True, dfinal=True),
    dict(name="ragged", B=1, L=19, H=2, P=3, G=1, N=4, chunk=8, d=False, init=False, dfinal=False),
    dict(name="per_head", B=1, L=16, H=3, P=2, G=3, N=2, chunk=4, d=False, init=True, dfinal=True),
    dict(name="long", B=1, L=300, H=2, P=3, G=1, N=2, chunk=32, d=True, init=True, dfinal=True,
         a_lo=-60.0, a_hi=-10.0),
]
F32, F64 = "<f4", "<f8"


def rounded(t):
    return t.to(torch.float32).to(torch.float64)


def recurrence(t, c):
    """y and the final state, one step at a time (NumPy float64)."""
    x, dt, A, B, C = (t[k].numpy() for k in ("x", "dt", "a", "b", "c"))
    Bn, L, H, P = x.shape
    per = H // c["G"]
    h = t["init"].numpy().copy() if t.get("init") is not None else np.zeros((Bn, H, P, c["N"]))
    y = np.zeros_like(x)
    for s in range(L):
        for hh in range(H):
            g = hh // per
            h[:, hh] = (np.exp(dt[:, s, hh] * A[hh])[:, None, None] * h[:, hh] +
                        (dt[:, s, hh, None] * x[:, s, hh])[:, :, None] * B[:, s, g, None, :])
            y[:, s, hh] = np.einsum("bpn,bn->bp", h[:, hh], C[:, s, g])
    if t.get("d") is not None:
        y += t["d"].numpy()[None, None, :, None] * x
    return y, h


def run(t, c):
    return ssd_chunked(t["x"], t["dt"], t["a"], t["b"], t["c"], c["chunk"], t.get("d"),
                       t.get("init"))


def ssd_case(c, gen):
    B, L, H, P, G, N = (c[k] for k in ("B", "L", "H", "P", "G", "N"))

    def normal(*shape):
        return rounded(torch.randn(shape, generator=gen, dtype=torch.float64))

    def uniform(lo, hi, *shape):
        return rounded(lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64))

    t = {"x": normal(B, L, H, P), "dt": uniform(0.05, 0.6, B, L, H),
         "a": uniform(c.get("a_lo", -1.5), c.get("a_hi", -0.2), H),
         "b": normal(B, L, G, N), "c": normal(B, L, G, N),
         "d": uniform(-1, 1, H) if c["d"] else None,
         "init": normal(B, H, P, N) if c["init"] else None}
    t = {k: v for k, v in t.items() if v is not None}
    dy = normal(B, L, H, P)
    dfinal = normal(B, H, P, N) if c["dfinal"] else None

    leaves = {k: v.clone().requires_grad_() for k, v in t.items()}
    y, final = run(leaves, c)
    want_y, want_final = recurrence(t, c)
    for name, a, e in (("y", y, want_y), ("final", final, want_final)):
        err = np.abs(a.detach().numpy() - e).max()
        assert err < 1e-11, f"ssd_{c['name']}: {name} differs from the recurrence by {err}"
    loss = (y * dy).sum()
    if dfinal is not None:
        loss = loss + (final * dfinal).sum()
    grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
    for g in grads.values():
        assert torch.isfinite(g).all(), c["name"]
    if c["name"] == "per_head":
        names = list(leaves)

        def as_tuple(*vals):
            return run(dict(zip(names, vals)), c)

        assert torch.autograd.gradcheck(as_tuple, tuple(leaves.values())), c["name"]
    return t, dy, dfinal, y.detach(), final.detach(), grads


def write_meta(prefix, meta):
    with open(os.path.join(OUT_DIR, prefix + "meta.json"), "w") as f:
        f.write(json.dumps(meta, sort_keys=True) + "\n")


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    for ci, c in enumerate(CASES):
        gen = torch.Generator().manual_seed(SEED + ci)
        t, dy, dfinal, y, final, grads = ssd_case(c, gen)
        prefix = f"ssd_{c['name']}_"
        for n, x in t.items():
            golden_io.save(prefix + n, x, F32, OUT_DIR)
        golden_io.save(prefix + "dy", dy, F32, OUT_DIR)
        if dfinal is not None:
            golden_io.save(prefix + "dfinal", dfinal, F32, OUT_DIR)
        golden_io.save(prefix + "y", y, F64, OUT_DIR)
        golden_io.save(prefix + "final", final, F64, OUT_DIR)
        for n, g in grads.items():
            golden_io.save(prefix + "d" + n, g, F64, OUT_DIR)
        write_meta(prefix, {"chunk": c["chunk"], "d": c["d"], "init": c["init"],
                            "dfinal": c["dfinal"]})
        print(f"{prefix[:-1]}: y {tuple(y.shape)} Q={c['chunk']} ||y||={y.norm().item():.6e} "
              f"||dx||={grads['x'].norm().item():.6e} ||dA||={grads['a'].norm().item():.6e}")
    print(f"wrote golden files to {OUT_DIR}")


if __name__ == "__main__":
    main()
