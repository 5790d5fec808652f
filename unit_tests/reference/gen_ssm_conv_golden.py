#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Generate golden data for Mamba-2's causal depthwise conv1d (+ SiLU) and dt
softplus (ssm/causal_conv1d.hpp, ssm/dt_softplus.hpp).

Both are written in torch.nn.functional and differentiated by autograd in
float64:
  conv: x [B, L, C] (channel-last), w [C, K], bias [C], init [B, K-1, C];
      xbar = cat([init, x], 1), or x left-padded with K-1 zero steps (F.pad)
      when there is no initial state;
      y = silu(F.conv1d(xbar.transpose(1, 2), w.unsqueeze(1), bias,
                        groups=C)).transpose(1, 2)   (no silu when off);
      final = xbar[:, -(K-1):] (the last K-1 steps; it reaches into init
      when L < K-1);
      loss = sum(y * dy) + sum(final * dfinal); expected y, final and the
      gradients dx, dw, dbias, dinit.
  dt: dt [B, L, H], dt_bias [H];
      dt_out = clamp(F.softplus(dt + dt_bias), dt_min, dt_max) (softplus's
      default threshold 20: u itself above it), no clamp when dt_max is None;
      loss = sum(dt_out * ddt_out); expected dt_out, ddt, ddt_bias.
Before anything is written each case is cross-checked: the conv's y and final
state against a direct loop over the definition in kdnn's header
(y[b,t,c] = bias[c] + sum_k w[c,k] xbar[b, t-K+1+k, c], a cross-correlation),
its gradients with torch.autograd.gradcheck, and dt_out and its gradients
against NumPy formulas.

Cases (see CONV_CASES, DT_CASES): conv with K = 1, 2, 4, 7 (all optional
inputs where K > 1; K = 2 with a final-state gradient but no initial state),
"plain" (no bias, no initial state, no final-state gradient, SiLU off), and
"short" (L = 3 < K-1 = 6); dt with values spanning [-25, 25] around the
threshold (one u = 20 exactly, which is not above it, and one just above),
without a clamp and with dt_min = 0.01, dt_max = 3.

Inputs are drawn in float64 with a fixed seed per case and rounded to
float32 (x, init, dy, dfinal, ddt_out ~ N(0, 1); w ~ U(-0.6, 0.6), bias
~ U(-0.5, 0.5); dt ~ U(-25, 25), dt_bias ~ U(-2, 2)); the expected values are
computed in float64 from the rounded inputs. It writes, into ../data/ssm
relative to this script (C order, little-endian .npy), with P = conv_{case}_
or dt_{case}_:
    conv: P{x,w,dy}.npy inputs, P{bias,init,dfinal}.npy optional inputs,
          float32; P{y,dx,dw}.npy expected, P{final}.npy (K > 1),
          P{dbias}.npy (with bias), P{dinit}.npy (with init), float64;
          Pmeta.json {"K", "silu", "bias", "init", "dfinal"} (the last three:
          whether that optional input exists).
    dt:   P{dt,dt_bias,ddt_out}.npy inputs, float32; P{dt_out,ddt,
          ddt_bias}.npy expected, float64; Pmeta.json {"dt_min", "dt_max"}
          (dt_max null: no upper clamp).

Run from the repository root:
    python3 unit_tests/reference/gen_ssm_conv_golden.py
"""
import json
import os

import numpy as np
import torch
import torch.nn.functional as F

import golden_io  # this script's directory is on sys.path

SEED = 20250920
OUT_DIR = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "ssm"))
CONV_CASES = [  # sizes, the optional inputs among bias/init/dfinal, SiLU
    dict(name="k1", B=2, L=9, C=3, K=1, bias=True, init=False, dfinal=False, silu=True),
    dict(name="k2", B=2, L=11, C=4, K=2, bias=True, init=False, dfinal=True, silu=True),
    dict(name="k4", B=2, L=37, C=5, K=4, bias=True, init=True, dfinal=True, silu=True),
    dict(name="k7", B=1, L=40, C=6, K=7, bias=True, init=True, dfinal=True, silu=True),
    dict(name="plain", B=2, L=10, C=4, K=4, bias=False, init=False, dfinal=False, silu=False),
    dict(name="short", B=2, L=3, C=3, K=7, bias=True, init=True, dfinal=True, silu=True),
]
DT_CASES = [
    dict(name="noclamp", B=2, L=20, H=4, dt_min=0.0, dt_max=None),
    dict(name="clamp", B=2, L=17, H=3, dt_min=0.01, dt_max=3.0),
]
F32, F64 = "<f4", "<f8"


def rounded(t):
    """t rounded to float32, as float64."""
    return t.to(torch.float32).to(torch.float64)


def conv_forward(x, w, bias, init, K, silu):
    """y and the final state (None when K = 1) of the causal conv."""
    if init is not None:
        xbar = torch.cat([init, x], 1)
    else:
        xbar = F.pad(x, (0, 0, K - 1, 0))  # K-1 zero steps on the left of dim 1
    z = F.conv1d(xbar.transpose(1, 2), w.unsqueeze(1), bias, groups=x.shape[2])
    y = (F.silu(z) if silu else z).transpose(1, 2)
    final = xbar[:, xbar.shape[1] - (K - 1):] if K > 1 else None
    return y, final


def check_conv_by_loops(c, t, y, final):
    """y and final against a direct loop over the header's definition."""
    B, L, C, K = c["B"], c["L"], c["C"], c["K"]
    x, w = t["x"].numpy(), t["w"].numpy()
    init = t["init"].numpy() if t["init"] is not None else np.zeros((B, K - 1, C))
    xbar = np.concatenate([init, x], 1)  # xbar[:, s + K-1] is step s
    z = np.zeros((B, L, C)) + (t["bias"].numpy() if t["bias"] is not None else 0.0)
    for k in range(K):
        z += w[:, k] * xbar[:, k:k + L]  # step t - K+1 + k
    want = z / (1 + np.exp(-z)) if c["silu"] else z
    err = np.abs(want - y.detach().numpy()).max()
    assert err < 1e-13, f"conv_{c['name']}: y differs from the loops by {err}"
    if final is not None:
        assert np.array_equal(final.detach().numpy(), xbar[:, L:]), c["name"]


def conv_case(c, gen):
    B, L, C, K = c["B"], c["L"], c["C"], c["K"]

    def normal(*shape):
        return rounded(torch.randn(shape, generator=gen, dtype=torch.float64))

    def uniform(lo, hi, *shape):
        return rounded(lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64))

    t = {"x": normal(B, L, C), "w": uniform(-0.6, 0.6, C, K),
         "bias": uniform(-0.5, 0.5, C) if c["bias"] else None,
         "init": normal(B, K - 1, C) if c["init"] else None}
    dy = normal(B, L, C)
    dfinal = normal(B, K - 1, C) if c["dfinal"] else None
    leaves = {n: v.clone().requires_grad_() for n, v in t.items() if v is not None}

    def args(d):
        return d["x"], d["w"], d.get("bias"), d.get("init"), K, c["silu"]

    y, final = conv_forward(*args(leaves))
    check_conv_by_loops(c, t, y, final)
    loss = (y * dy).sum()
    if dfinal is not None:
        loss = loss + (final * dfinal).sum()
    grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))

    names = list(leaves)

    def as_tuple(*vals):
        y, final = conv_forward(*args(dict(zip(names, vals))))
        return (y,) if final is None else (y, final)

    assert torch.autograd.gradcheck(as_tuple, tuple(leaves.values())), c["name"]
    return t, dy, dfinal, y.detach(), final.detach() if final is not None else None, grads


def softplus_np(u):
    return np.where(u > 20, u, np.log1p(np.exp(np.minimum(u, 20))))


def dt_case(c, gen):
    B, L, H = c["B"], c["L"], c["H"]
    dt = rounded(-25 + 50 * torch.rand((B, L, H), generator=gen, dtype=torch.float64))
    dt_bias = rounded(-2 + 4 * torch.rand((H,), generator=gen, dtype=torch.float64))
    ddt_out = rounded(torch.randn((B, L, H), generator=gen, dtype=torch.float64))
    # u = 20 exactly (not above the threshold: log1p(e^u)) and just above it;
    # exact in float32 as well.
    dt_bias[0] = 0.5
    dt[0, 0, 0] = 19.5
    dt[0, 1, 0] = 19.5 + 2.0**-16
    lo, hi = c["dt_min"], c["dt_max"]
    d, b = dt.clone().requires_grad_(), dt_bias.clone().requires_grad_()
    out = torch.clamp(F.softplus(d + b), min=lo, max=hi)
    ddt, ddt_bias = torch.autograd.grad((out * ddt_out).sum(), [d, b])

    # NumPy cross-check: softplus' = sigmoid (1 above the threshold); the
    # clamp passes the gradient where lo <= softplus <= hi.
    u = dt.numpy() + dt_bias.numpy()
    sp = softplus_np(u)
    hi_np = np.inf if hi is None else hi
    want = np.clip(sp, lo, hi_np)
    dsp = np.where(u > 20, 1.0, 1 / (1 + np.exp(-u))) * ((sp >= lo) & (sp <= hi_np))
    want_ddt = ddt_out.numpy() * dsp
    for name, a, e in (("dt_out", out.detach(), want), ("ddt", ddt, want_ddt),
                       ("ddt_bias", ddt_bias, want_ddt.sum((0, 1)))):
        err = np.abs(a.numpy() - e).max()
        assert err < 1e-12, f"dt_{c['name']}: {name} differs from NumPy by {err}"
    passed = ((sp >= lo) & (sp <= hi_np)).mean()
    return dict(dt=dt, dt_bias=dt_bias, ddt_out=ddt_out), out.detach(), ddt, ddt_bias, passed


def write(prefix, name, x, np_dtype):
    if x is not None:
        golden_io.save(prefix + name, x, np_dtype, OUT_DIR)


def write_meta(prefix, meta):
    with open(os.path.join(OUT_DIR, prefix + "meta.json"), "w") as f:
        f.write(json.dumps(meta, sort_keys=True) + "\n")


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    for ci, c in enumerate(CONV_CASES):
        gen = torch.Generator().manual_seed(SEED + ci)
        t, dy, dfinal, y, final, grads = conv_case(c, gen)
        prefix = f"conv_{c['name']}_"
        for n, x in t.items():
            write(prefix, n, x, F32)
        write(prefix, "dy", dy, F32)
        write(prefix, "dfinal", dfinal, F32)
        write(prefix, "y", y, F64)
        write(prefix, "final", final, F64)
        for n, g in grads.items():
            write(prefix, "d" + n, g, F64)
        write_meta(prefix, {"K": c["K"], "silu": c["silu"], "bias": c["bias"],
                            "init": c["init"], "dfinal": c["dfinal"]})
        print(f"{prefix[:-1]}: y {tuple(y.shape)} K={c['K']} ||y||={y.norm().item():.6e} "
              f"||dx||={grads['x'].norm().item():.6e} ||dw||={grads['w'].norm().item():.6e}")
    for ci, c in enumerate(DT_CASES):
        gen = torch.Generator().manual_seed(SEED + 100 + ci)
        t, out, ddt, ddt_bias, passed = dt_case(c, gen)
        prefix = f"dt_{c['name']}_"
        for n, x in t.items():
            write(prefix, n, x, F32)
        write(prefix, "dt_out", out, F64)
        write(prefix, "ddt", ddt, F64)
        write(prefix, "ddt_bias", ddt_bias, F64)
        write_meta(prefix, {"dt_min": c["dt_min"], "dt_max": c["dt_max"]})
        u = t["dt"] + t["dt_bias"]
        print(f"{prefix[:-1]}: dt {tuple(out.shape)} u in [{u.min().item():.2f}, "
              f"{u.max().item():.2f}], {(u > 20).sum().item()} above the threshold, "
              f"gradient passes the clamp at {passed:.2f}")
    print(f"wrote golden files to {OUT_DIR}")


if __name__ == "__main__":
    main()
