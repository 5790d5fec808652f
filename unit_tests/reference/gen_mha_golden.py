#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Generate golden data for the multi-head attention layer (attention/mha.hpp).

The layer is the PyTorch formulation of kdnn_reference/mha.py beside this
script (torch.nn.functional: F.linear, matmul, a masked softmax, dropout by
an explicit keep mask), computed in float64 with autograd:
    q [B, S, Eq], k [B, Sk, Ek], v [B, Sk, Ev]; w_q [H*D, Eq], w_k [H*D, Ek],
    w_v [H*Dv, Ev], w_o [Eo, H*Dv] (nn.Linear: y = x W^T + b), head h uses
    rows h*D..(h+1)*D-1; scores scaled by sm_scaler (default 1/sqrt(D));
    query i of entry b sees key j iff j < seq_k[b], i < seq_q[b],
    lo[i] <= j < hi[i] and (causal) j <= i; a fully masked row has zero
    probabilities; rows i >= seq_q[b] of out are zero (no bias, no residual);
    out = A w_o^T + b_o + residual.
Dropout's keep mask is kdnn's, generated here by the NumPy Philox-4x32-10 of
kdnn_reference/philox.py (checked against Random123's known answers before
anything is written), not stored: the dropout case cross-checks kdnn's
generator. Backward: every gradient of L = sum(dout * out). Where a case is
within torch.nn.MultiheadAttention's scope (eigenmha), its out is checked
against that module's too.

Cases (see CASES): plain (all biases, S != Sk, Eo != E, D != Dv, H = 2);
causal_residual (no biases, causal, residual, sm_scaler 0.4); masks (windows
with a fully masked row, a padded query, an entry with seq_k = 0, residual);
dropout (p = 0.25, seed and offset with nonzero high words); eigenmha
(B = 2, S = Sk = 16, E = 32, H = 4, D = Dv = 8, all biases).

Inputs are drawn in float64 with a fixed seed per case (q, k, v, residual,
biases, dout ~ N(0, 1); weights ~ N(0, 1) / sqrt(fan-in)) and rounded to
float32; the expected values are computed in float64 from the rounded inputs.
For each case it writes, into ../data/attention relative to this script
(C order, little-endian .npy), with P = mha_{case}_:
    P{q,k,v,w_q,w_k,w_v,w_o,dout}.npy       inputs, float32
    P{b_q,b_k,b_v,b_o,residual}.npy         optional inputs, float32
    P{lo_win,hi_win,seq_q,seq_k}.npy        optional mask vectors, int32
    P{out,dq,dk,dv,dw_q,dw_k,dw_v,dw_o}.npy expected, float64
    P{db_q,db_k,db_v,db_o,dresidual}.npy    expected, one per optional input
    Pmeta.json   {"H", "sm_scaler" (absent: 1/sqrt(D)), "causal", "p", "seed", "offset"}
An optional file exists iff the case has that input.

Run from the repository root:
    python3 unit_tests/reference/gen_mha_golden.py
"""
import json
import os

import torch

import golden_io  # this script's directory is on sys.path
from kdnn_reference import mha, philox

SEED = 20250815
OUT_DIR = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "attention"))
CASES = [  # sizes, biases among "qkvo", and the options (the rest default)
    dict(name="plain", B=2, S=3, Sk=5, Eq=6, Ek=5, Ev=4, H=2, D=3, Dv=2, Eo=7, biases="qkvo"),
    dict(name="causal_residual", B=2, S=5, Sk=5, Eq=4, Ek=3, Ev=5, H=2, D=2, Dv=3, Eo=4,
         biases="", causal=True, residual=True, sm_scaler=0.4),
    dict(name="masks", B=3, S=4, Sk=5, Eq=5, Ek=4, Ev=3, H=2, D=3, Dv=2, Eo=4, biases="qkvo",
         residual=True, lo=[0, 1, 3, 2], hi=[3, 4, 3, 5],  # query 2 sees no key
         seq_q=[4, 2, 3], seq_k=[5, 3, 0]),  # entry 1: queries 2, 3 padded; entry 2: no keys
    dict(name="dropout", B=2, S=4, Sk=6, Eq=5, Ek=5, Ev=4, H=3, D=2, Dv=3, Eo=5, biases="qkvo",
         p=0.25, seed=0x0123456789ABCDEF, offset=(3 << 32) + 11),
    dict(name="eigenmha", B=2, S=16, Sk=16, Eq=32, Ek=32, Ev=32, H=4, D=8, Dv=8, Eo=32,
         biases="qkvo"),
]
F32, F64, I32 = "<f4", "<f8", "<i4"


def draw(c, gen):
    """The case's inputs in float64, rounded to float32 (None where absent)."""
    HD, HDv = c["H"] * c["D"], c["H"] * c["Dv"]

    def normal(*shape):
        return torch.randn(shape, generator=gen, dtype=torch.float64)

    def weight(rows, cols):
        return normal(rows, cols) / cols**0.5

    t = {"q": normal(c["B"], c["S"], c["Eq"]), "k": normal(c["B"], c["Sk"], c["Ek"]),
         "v": normal(c["B"], c["Sk"], c["Ev"]),
         "residual": normal(c["B"], c["S"], c["Eo"]) if c.get("residual") else None,
         "w_q": weight(HD, c["Eq"]), "w_k": weight(HD, c["Ek"]), "w_v": weight(HDv, c["Ev"]),
         "w_o": weight(c["Eo"], HDv)}
    for b, size in zip("qkvo", (HD, HD, HDv, c["Eo"])):
        t["b_" + b] = normal(size) if b in c["biases"] else None
    dout = normal(c["B"], c["S"], c["Eo"])
    rounded = {n: (x.to(torch.float32).to(torch.float64) if x is not None else None)
               for n, x in t.items()}
    return rounded, dout.to(torch.float32).to(torch.float64)


def check_against_torch_mha(c, t, out):
    """Where the case is within torch.nn.MultiheadAttention's scope (one
    feature size, D = Dv, all biases, default scaler, no mask, residual or
    dropout), asserts that it gives the same out."""
    if (len({c["Eq"], c["Ek"], c["Ev"], c["Eo"]}) > 1 or c["D"] != c["Dv"]
            or c["biases"] != "qkvo" or t["residual"] is not None
            or any(n in c for n in ("sm_scaler", "causal", "lo", "hi", "seq_q", "seq_k", "p"))):
        return
    m = torch.nn.MultiheadAttention(c["Eq"], c["H"], batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        m.in_proj_weight.copy_(torch.cat([t["w_q"], t["w_k"], t["w_v"]]))
        m.in_proj_bias.copy_(torch.cat([t["b_q"], t["b_k"], t["b_v"]]))
        m.out_proj.weight.copy_(t["w_o"])
        m.out_proj.bias.copy_(t["b_o"])
        expected, _ = m(t["q"], t["k"], t["v"], need_weights=False)
    err = (out - expected).abs().max().item()
    assert err < 1e-12, f"{c['name']}: nn.MultiheadAttention differs by {err}"
    print(f"mha_{c['name']}: nn.MultiheadAttention agrees (max |diff| {err:.1e})")


def write(prefix, name, x, np_dtype):
    if x is not None:
        golden_io.save(prefix + name, x, np_dtype, OUT_DIR)


def main():
    philox.check_known_answers()
    os.makedirs(OUT_DIR, exist_ok=True)
    for ci, c in enumerate(CASES):
        gen = torch.Generator().manual_seed(SEED + ci)
        t, dout = draw(c, gen)
        p, seed, offset = c.get("p", 0.0), c.get("seed", 0), c.get("offset", 0)
        keep = None
        if p > 0:
            keep = torch.from_numpy(
                philox.dropout_keep((c["B"], c["H"], c["S"], c["Sk"]), p, seed, offset))
        mask = mha.visible(c["B"], c["S"], c["Sk"], c.get("causal", False), c.get("lo"),
                           c.get("hi"), c.get("seq_q"), c.get("seq_k"))
        out, grads = mha.autograd_backward(t, dout, heads=c["H"], mask=mask,
                                           sm_scaler=c.get("sm_scaler"), keep=keep, p=p,
                                           lens_q=c.get("seq_q"))
        check_against_torch_mha(c, t, out)
        prefix = f"mha_{c['name']}_"
        for n, x in t.items():
            write(prefix, n, x, F32)
        write(prefix, "dout", dout, F32)
        for n in ("lo", "hi"):
            write(prefix, n + "_win", c.get(n), I32)
        for n in ("seq_q", "seq_k"):
            write(prefix, n, c.get(n), I32)
        write(prefix, "out", out, F64)
        for n, g in grads.items():
            write(prefix, "d" + n, g, F64)
        meta = {"H": c["H"], "causal": c.get("causal", False), "p": p, "seed": seed,
                "offset": offset}
        if "sm_scaler" in c:
            meta["sm_scaler"] = c["sm_scaler"]
        with open(os.path.join(OUT_DIR, prefix + "meta.json"), "w") as f:
            f.write(json.dumps(meta, sort_keys=True) + "\n")
        kept = f" kept={keep.double().mean().item():.3f}" if keep is not None else ""
        print(f"{prefix[:-1]}: out {tuple(out.shape)} ||out||={out.norm().item():.6e} "
              f"||dq||={grads['q'].norm().item():.6e}{kept}")
    print(f"wrote golden files to {OUT_DIR}")


if __name__ == "__main__":
    main()
