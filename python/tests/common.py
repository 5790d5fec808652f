# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""What the operator tests share: the dtypes every operator is tested in, the
agreement expected with a reference (float32: a few thousand ulps over the
sums involved; float64: round-off), and the comparison of outputs and
gradients with a reference's."""
import torch

DTYPES = [torch.float32, torch.float64]
TOLERANCE = {torch.float32: dict(rtol=2e-4, atol=2e-5), torch.float64: dict(rtol=1e-10, atol=1e-11)}


def assert_matches(outputs, wanted, leaves, wanted_leaves=None, **tolerance):
    """kdnn's outputs (a tensor or a tuple) agree with the reference's
    `wanted` (compared in the outputs' dtype), and so do their gradients with
    respect to `leaves` (the reference's own `wanted_leaves`, by default the
    same) for one random gradient of the outputs."""
    outs = outputs if isinstance(outputs, tuple) else (outputs,)
    wants = wanted if isinstance(wanted, tuple) else (wanted,)
    for out, want in zip(outs, wants):
        torch.testing.assert_close(out, want.to(out.dtype), **tolerance)
    grads = [torch.randn_like(out) for out in outs]
    got = torch.autograd.grad(outs, leaves, grads)
    expected = torch.autograd.grad(wants, wanted_leaves or leaves,
                                   [g.to(want.dtype) for g, want in zip(grads, wants)])
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b.to(a.dtype), **tolerance)
