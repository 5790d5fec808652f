# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.compat.mamba_ssm against mamba's semantics: the chunked SSD
reference with what mamba_chunk_scan_combined does around the scan (dt_bias,
dt_softplus, dt_limit, D per head or per (head, channel), z gating, initial
and final states), written here in PyTorch from the peer's code's
documented behaviour; gradients, and the options kdnn does not have."""
import math

import pytest
import torch
import torch.nn.functional as F
from common import DTYPES, TOLERANCE, assert_matches
from kdnn_reference import ssd as ssd_reference

import kdnn
from kdnn.compat.mamba_ssm import mamba_chunk_scan_combined


def reference(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
              dt_softplus=False, dt_limit=(0.0, math.inf)):
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = F.softplus(dt)  # linear above 20, as mamba's
    dt = dt.clamp(*dt_limit)
    y, final = ssd_reference.ssd_chunked(x, dt, A, B, C, chunk_size, init=initial_states)
    if D is not None:
        y = y + x * (D[:, None] if D.dim() == 1 else D)
    if z is not None:
        y = y * F.silu(z)
    return y, final


def inputs(dtype, b=2, L=19, h=4, p=3, g=2, n=5):
    kw = dict(dtype=dtype, requires_grad=True)
    return dict(x=torch.randn(b, L, h, p, **kw), dt=torch.randn(b, L, h, **kw),
                A=(-torch.rand(h, dtype=dtype) - 0.2).requires_grad_(),
                B=torch.randn(b, L, g, n, **kw), C=torch.randn(b, L, g, n, **kw),
                D=torch.randn(h, p, **kw), z=torch.randn(b, L, h, p, **kw),
                dt_bias=torch.randn(h, **kw), initial_states=torch.randn(b, h, p, n, **kw))


OPTIONS = [dict(dt_softplus=True), dict(dt_softplus=True, dt_limit=(0.05, 1.5), D="head"),
           dict(dt_softplus=True, z=True, D="channel", initial_states=True),
           dict(dt_softplus=False, dt_bias=True, z=True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("chunk_size", [4, 8])
def test_matches_the_reference(dtype, options, chunk_size):
    t = inputs(dtype)
    args = dict(dt_softplus=options["dt_softplus"], dt_limit=options.get("dt_limit", (0.0, math.inf)))
    if options["dt_softplus"] or options.get("dt_bias"):
        args["dt_bias"] = t["dt_bias"]
    if options.get("D") == "head":
        args["D"] = t["D"][:, 0].detach().clone().requires_grad_()
    elif options.get("D") == "channel":
        args["D"] = t["D"]
    for name in ("z", "initial_states"):
        if options.get(name):
            args[name] = t[name]
    core = [t[k] for k in ("x", "dt", "A", "B", "C")]
    got = mamba_chunk_scan_combined(*core, chunk_size, return_final_states=True, **args)
    want = reference(*core, chunk_size, **args)
    leaves = core + [v for k, v in args.items() if isinstance(v, torch.Tensor)]
    assert_matches(got, want, leaves, **TOLERANCE[dtype])


def test_positional_arguments_as_mamba():
    t = inputs(torch.float64)
    core = [t[k].detach() for k in ("x", "dt", "A", "B", "C")]
    D, z, bias = t["D"].detach(), t["z"].detach(), t["dt_bias"].detach()
    got = mamba_chunk_scan_combined(*core, 4, D, z, bias, None, None, None, True)
    torch.testing.assert_close(got, reference(*core, 4, D=D, z=z, dt_bias=bias, dt_softplus=True)[0])


def test_options_kdnn_does_not_have():
    t = {k: v.detach() for k, v in inputs(torch.float64).items()}
    core = [t[k] for k in ("x", "dt", "A", "B", "C")]
    with pytest.raises(kdnn.Error, match="seq_idx is not supported by kdnn yet"):
        mamba_chunk_scan_combined(*core, 4, seq_idx=torch.zeros(2, 19, dtype=torch.int32))
    with pytest.raises(kdnn.Error, match="cu_seqlens is not supported"):
        mamba_chunk_scan_combined(*core, 4, cu_seqlens=torch.tensor([0, 19]))
    with pytest.raises(kdnn.Error, match="return_varlen_states is not supported"):
        mamba_chunk_scan_combined(*core, 4, return_varlen_states=True)
    with pytest.raises(kdnn.Error, match=r"A\[0\]=.*expected A <= 0"):
        mamba_chunk_scan_combined(core[0], core[1], -core[2], *core[3:], 4, dt_softplus=True)
