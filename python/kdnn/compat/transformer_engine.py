# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""TransformerEngine's mHC Sinkhorn (mhc_fused_sinkhorn, its Triton mHC
kernels) on kdnn.sinkhorn: `iters` row-then-column normalisations of
exp(H_res) (TransformerEngine works in the log domain; the result is the
same), differentiated through the iterations as run (kdnn's unrolled
backward). Any n (the peer's kernels take n = 4), float32 and float64.
"""
from ..sinkhorn import sinkhorn as _sinkhorn
from .._tensors import Error, integer


def mhc_fused_sinkhorn(H_res, n=4, recompute_hist=True, iters=20):
    """H_res (s, b, n, n) -> the doubly stochastic matrices, as
    TransformerEngine's. recompute_hist is accepted and has no effect: kdnn's
    backward replays the iterations from H_res whatever it says."""
    op = "compat.transformer_engine.mhc_fused_sinkhorn"
    shape = list(getattr(H_res, "shape", []))
    if len(shape) < 2 or shape[-1] != n or shape[-2] != n:
        raise Error(f"{op}: H_res has shape {shape}, expected (..., n, n) with n={n!r}")
    if not isinstance(recompute_hist, bool):
        raise Error(f"{op}: recompute_hist={recompute_hist!r}, expected True or False")
    iters = integer(op, "iters", iters, 1, 2**31 - 1)
    return _sinkhorn(H_res, iters=iters, order="rows_first", eps=0.0,
                              backward="unrolled")
