# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Mamba-2's SSD as a chunked PyTorch formulation, after the minimal SSD of
the Mamba-2 paper (state-space duality, "ssd_minimal_discrete"), written for
kdnn's layouts: x [b, L, h, p], dt [b, L, h] (positive), A [h] (negative),
B and C [b, L, g, n] with head i reading group i // (h // g), D [h] or [h, p] and the
initial state [b, h, p, n] optional. It computes

    h_t = exp(dt_t A) h_{t-1} + dt_t x_t (outer) B_t,   y_t = h_t C_t + D x_t

by chunks of `chunk` steps (L is zero-padded to a multiple: padded steps have
dt = 0 and add nothing): the intra-chunk output Y_diag through the decay
matrix exp(segsum), the chunk states, the state passing between chunks (a
segsum over the chunks) and the off-diagonal output Y_off. Differentiable by
autograd; float32 or float64 as the inputs.
"""
import torch
import torch.nn.functional as F


def segsum(a):
    """s[..., i, j] = a[..., j+1] + ... + a[..., i] for j <= i, and -inf above
    the diagonal, so that exp(s) is the lower-triangular decay matrix. The
    sums are taken segment by segment (a masked cumulative sum), not as a
    difference of two cumulative sums, and masked before exp."""
    T = a.size(-1)
    a = a[..., None].expand(*a.shape, T)  # a[..., k, j] = a_k
    strictly_lower = torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device), -1)
    s = torch.cumsum(a.masked_fill(~strictly_lower, 0), dim=-2)
    lower = torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device), 0)
    return s.masked_fill(~lower, -torch.inf)


def ssd_chunked(x, dt, A, B, C, chunk, D=None, init=None):
    """y [b, L, h, p] and the final state [b, h, p, n]."""
    b, L, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    B = B.repeat_interleave(h // g, dim=2)  # [b, L, h, n]
    C = C.repeat_interleave(h // g, dim=2)
    X = x * dt[..., None]
    a = dt * A
    pad = (-L) % chunk
    if pad:
        X, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (X, B, C))
        a = F.pad(a, (0, 0, 0, pad))
    c = (L + pad) // chunk
    X = X.reshape(b, c, chunk, h, p)
    B = B.reshape(b, c, chunk, h, n)
    C = C.reshape(b, c, chunk, h, n)
    a = a.reshape(b, c, chunk, h).permute(0, 3, 1, 2)  # [b, h, c, l]
    a_cum = torch.cumsum(a, dim=-1)

    # Y_diag: within each chunk, from a zero state.
    decay = torch.exp(segsum(a))  # [b, h, c, l, s]
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, decay, X)

    # Each chunk's final state from a zero state.
    decay_to_end = torch.exp(a_cum[..., -1:] - a_cum)  # [b, h, c, l]
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_to_end, X)

    # State passing: the state entering each chunk, and the final state.
    if init is None:
        init = torch.zeros(b, h, p, n, dtype=x.dtype, device=x.device)
    states = torch.cat([init[:, None], states], dim=1)  # [b, c+1, h, p, n]
    chunk_decay = torch.exp(segsum(F.pad(a_cum[..., -1], (1, 0))))  # [b, h, c+1, c+1]
    states = torch.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)
    entering, final = states[:, :-1], states[:, -1]

    # Y_off: the entering state decayed to each step, read through C.
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, entering, torch.exp(a_cum))
    y = (y_diag + y_off).reshape(b, c * chunk, h, p)[:, :L]
    if D is not None:
        y = y + (D[:, None] if D.dim() == 1 else D) * x  # D [h] or [h, p]
    return y, final
