# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.sinkhorn: batched Sinkhorn-Knopp normalisation (mHC), differentiable."""
import math

import torch

from . import _kdnn
from ._options import Options
from ._tensors import Operands, first_order, flag, integer, number, require, stream_of

ORDERS = ("columns_first", "rows_first")
BACKWARDS = ("implicit", "unrolled", "block")
# The C++ enums' values of order and of the backwards that are a method.
_ORDER_OF = {name: getattr(_kdnn.SinkhornOrder, name) for name in ORDERS}
_METHOD_OF = {"implicit": _kdnn.SinkhornMethod.implicit, "block": _kdnn.SinkhornMethod.block}


class _Sinkhorn(torch.autograd.Function):
    """options: the SinkhornForwardOptions record; method: the backward
    ("implicit", "unrolled" or "block")."""

    @staticmethod
    def forward(ctx, x, options, method):
        r = torch.empty_like(x)
        # An unrolled backward that cannot run fails here, before the forward.
        unrolled = method == "unrolled" and ctx.needs_input_grad[0]
        _kdnn.sinkhorn_forward(x, r, options.bound(), unrolled, stream_of(x))
        # The unrolled backward replays the forward from x; the implicit and
        # block ones need only the result.
        ctx.save_for_backward(x if method == "unrolled" else r)
        ctx.options, ctx.method = options, method
        return r

    @staticmethod
    @first_order("sinkhorn")
    def backward(ctx, g):
        (saved,) = ctx.saved_tensors
        g = g.contiguous()
        dx = torch.empty_like(saved)
        if ctx.method == "unrolled":
            _kdnn.sinkhorn_backward_unrolled(saved, g, dx, ctx.options.bound(), stream_of(g))
        else:
            options = Options("SinkhornBackwardOptions", method=_METHOD_OF[ctx.method],
                              check_finite=ctx.options.check_finite)
            _kdnn.sinkhorn_backward(saved, g, dx, options.bound(), stream_of(g))
        return dx, None, None


def sinkhorn(x, *, iters=20, order="columns_first", eps=0.0, backward="implicit",
             check_finite=False):
    """R = Sinkhorn(exp(x)): `iters` times, divide by the column sums and then
    by the row sums (order="rows_first": rows first, as TransformerEngine and
    TileKernels); eps > 0 is TileKernels' regulariser (a softmax first
    normalisation plus eps, then divisions by sum + eps).

    x: [..., n, n] (a matrix, or any leading dimensions as one batch),
    float32 or float64. Returns R of x's shape.

    backward: "implicit" (default: the gradient of the converged
    normalisation, by conjugate gradients; needs R converged), "unrolled"
    (exactly autograd's gradient through the `iters` iterations as run;
    use it with few iterations) or "block" (the implicit gradient on the
    2n x 2n system, for comparison).

    check_finite: refuse a NaN or an infinity in x (and in the incoming
    gradient), naming the first; without it they give NaN, as PyTorch's
    loop would (docs/api.md).
    """
    x = Operands("sinkhorn")(x, "x", -2, "[..., n, n]")
    require(x.shape[-1] == x.shape[-2],
            f"sinkhorn: x has shape {list(x.shape)}, expected square matrices [..., n, n]")
    iters = integer("sinkhorn", "iters", iters, 1, 2**31 - 1)
    require(order in ORDERS, f"sinkhorn: order={order!r}, expected one of {ORDERS}")
    require(backward in BACKWARDS, f"sinkhorn: backward={backward!r}, expected one of {BACKWARDS}")
    eps = number("sinkhorn", "eps", eps)
    require(math.isfinite(eps) and 0.0 <= eps <= 1.0, f"sinkhorn: eps={eps!r}, expected in [0, 1]")
    n = x.shape[-1]
    batch = x if x.dim() == 3 else x.reshape(-1, n, n)
    check_finite = flag("sinkhorn", "check_finite", check_finite)
    options = Options("SinkhornForwardOptions", iters=iters, order=_ORDER_OF[order], eps=eps,
                      check_finite=check_finite)
    r = _Sinkhorn.apply(batch, options, backward)
    return r if x.dim() == 3 else r.reshape(x.shape)
