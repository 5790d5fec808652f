# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Sinkhorn-Knopp (mHC reference) in PyTorch, on batches X of shape [B, n, n].

Forward:  P = exp(X); R = P; `iters` times divide by the column sums (dim -2),
then by the row sums (dim -1).
Backward: G = dL/dR; the loss whose gradient it is, L = sum(R * G).
  autograd_backward:    reverse mode through the unrolled iterations.
  implicit_cg_backward: implicit differentiation of the fixed point,
      s_r = (G*R)1, s_c = (G*R)^T 1, solve (I - R^T R) v = s_c - R^T s_r by
      n steps of CG with the product Sp = p - R^T (R p) (R^T R never formed),
      u = s_r - R v, dX = (G - u1^T - 1v^T) * R.
      The reference's "rank-0" method: the system is singular with null
      vector 1, and the EPS guards keep CG from dividing by zero.
Every function computes in the dtype and on the device of its inputs.
"""
import torch

EPS = 1e-11  # the reference's CG guard (added to p^T S p and to the old r^T r)


def forward(x, iters):
    """R after `iters` column-then-row normalisations of exp(x)."""
    r = torch.exp(x)
    for _ in range(iters):
        r = r / r.sum(-2, keepdim=True)
        r = r / r.sum(-1, keepdim=True)
    return r


def loss(x, g, iters):
    """(R, L) with L = sum(R * G), so that dL/dR = G; x may require grad."""
    r = forward(x, iters)
    return r, (r * g).sum()


def autograd_backward(x, g, iters):
    """(R, dX) with dX = dL/dX by autograd through the unrolled forward."""
    x = x.detach().requires_grad_(True)
    r, l = loss(x, g, iters)
    l.backward()
    return r.detach(), x.grad


def implicit_cg_backward(r, g, eps=EPS):
    """dX from R and G = dL/dR via CG on (I - R^T R) v = s_c - R^T s_r."""
    rg = r * g
    s_r = rg.sum(-1)  # [B, n]
    s_c = rg.sum(-2)  # [B, n]
    rt = r.transpose(-2, -1)

    def mv(m, v):  # batched matrix-vector product
        return torch.bmm(m, v.unsqueeze(-1)).squeeze(-1)

    def matvec_s(p):  # (I - R^T R) p without forming R^T R
        return p - mv(rt, mv(r, p))

    b = s_c - mv(rt, s_r)
    v = torch.zeros_like(b)
    res = b.clone()
    p = res.clone()
    rr = (res * res).sum(-1, keepdim=True)
    for _ in range(r.shape[-1]):
        sp = matvec_s(p)
        alpha = rr / ((p * sp).sum(-1, keepdim=True) + eps)
        v = v + alpha * p
        res = res - alpha * sp
        rr_new = (res * res).sum(-1, keepdim=True)
        p = res + (rr_new / (rr + eps)) * p
        rr = rr_new
    u = s_r - mv(r, v)
    return (g - u[:, :, None] - v[:, None, :]) * r
