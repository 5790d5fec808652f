# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The Sinkhorn semantics of two production mHC kernels, in PyTorch.

Written here from their published semantics (not copied), on batches X of
shape [..., n, n]; every function computes in the dtype and on the device of
its inputs. Both divide by the row sums first (kdnn's Order::rows_first).

te_forward(h, iterations=20): NVIDIA TransformerEngine's reference
    (mhc_sinkhorn_ref), in log space with two potentials f, g of shape [..., n]:
        f = g = 0
        `iterations` times:
            f = -logsumexp(h + g[..., None, :], dim=-1)   # row normalisation
            g = -logsumexp(h + f[..., :, None], dim=-2)   # column normalisation
        R = exp(f[..., :, None] + h + g[..., None, :])
    Mathematically `iterations` rows-first Sinkhorn iterations on exp(h):
    kdnn's ForwardOptions{iters=iterations, order=rows_first, eps=0}.

tk_forward(x, repeat=10, eps=1e-6): DeepSeek TileKernels' reference
    (sinkhorn_normalize_ref):
        x = softmax(x, -1) + eps
        x = x / (x.sum(-2, keepdim=True) + eps)
        repeat - 1 times:
            x = x / (x.sum(-1, keepdim=True) + eps)
            x = x / (x.sum(-2, keepdim=True) + eps)
    kdnn's ForwardOptions{iters=repeat, order=rows_first, eps=eps}.

autograd_backward(forward, x, g, **kw): (R, dX) with dX = dL/dX for
L = sum(R * G), by autograd through the forward as written (the gradient both
projects' tests check against).
"""
import torch

TE_ITERATIONS = 20  # TransformerEngine's default and test setting
TK_REPEAT = 10      # TileKernels' defaults
TK_EPS = 1e-6


def te_forward(h, iterations=TE_ITERATIONS):
    """TransformerEngine's log-domain Sinkhorn (rows, then columns)."""
    f = torch.zeros(h.shape[:-1], dtype=h.dtype, device=h.device)  # row potential
    g = torch.zeros_like(f)                                         # column potential
    for _ in range(iterations):
        f = -torch.logsumexp(h + g[..., None, :], dim=-1)
        g = -torch.logsumexp(h + f[..., :, None], dim=-2)
    return torch.exp(f[..., :, None] + h + g[..., None, :])


def tk_forward(x, repeat=TK_REPEAT, eps=TK_EPS):
    """TileKernels' Sinkhorn: row softmax + eps, then divisions by (sum + eps)."""
    x = x.softmax(-1) + eps
    x = x / (x.sum(-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        x = x / (x.sum(-1, keepdim=True) + eps)
        x = x / (x.sum(-2, keepdim=True) + eps)
    return x


def autograd_backward(forward, x, g, **kwargs):
    """(R, dX): R = forward(x, **kwargs), dX = d sum(R * g) / dx by autograd."""
    x = x.detach().requires_grad_(True)
    r = forward(x, **kwargs)
    (r * g).sum().backward()
    return r.detach(), x.grad
