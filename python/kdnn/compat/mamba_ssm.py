# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mamba_ssm's mamba_chunk_scan_combined (mamba_ssm.ops.triton.ssd_combined)
on kdnn's SSD scan: x (batch, seqlen, nheads, headdim), dt (batch, seqlen,
nheads), A (nheads), B and C (batch, seqlen, ngroups, dstate), the layouts
kdnn takes without a copy.

D of shape (nheads,) or (nheads, headdim) is kdnn's own (per head or per
channel). What else mamba fuses around the scan runs here as kdnn's dt
kernel and PyTorch operations: dt_bias, dt_softplus and dt_limit as
kdnn.dt_softplus (with dt_softplus, else dt + dt_bias clamped), and z as
y·SiLU(z).
"""
import torch
import torch.nn.functional as F

from .. import mamba2
from .._tensors import Error, require


def _unsupported(op, **options):
    for name, value in options.items():
        if value is not None and value is not False:
            raise Error(f"{op}: {name} is not supported by kdnn yet (packed sequences)")


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                              initial_states=None, seq_idx=None, cu_seqlens=None,
                              dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False):
    """mamba's mamba_chunk_scan_combined: returns out (batch, seqlen,
    nheads, headdim), y·SiLU(z) when z is given, and with
    return_final_states also the final states (batch, nheads, headdim,
    dstate). dt (after dt_bias, softplus and dt_limit) must be finite and
    >= 0 and A <= 0 (kdnn.Error otherwise, naming the first bad value).
    seq_idx, cu_seqlens and return_varlen_states are not supported yet."""
    op = "compat.mamba_ssm.mamba_chunk_scan_combined"
    _unsupported(op, seq_idx=seq_idx, cu_seqlens=cu_seqlens,
                 return_varlen_states=return_varlen_states)
    for name, value in (("dt_softplus", dt_softplus), ("return_final_states", return_final_states)):
        if not isinstance(value, bool):
            raise Error(f"{op}: {name}={value!r}, expected True or False")
    limit = mamba2.dt_limits(op, dt_limit)
    require(isinstance(dt, torch.Tensor) and dt.dim() == 3,
            f"{op}: dt has shape {list(getattr(dt, 'shape', []))}, expected (batch, seqlen, "
            "nheads)")
    # As mamba: dt + dt_bias, softplus if asked, then always clamped to
    # dt_limit (so a negative dt without softplus becomes 0 by default).
    if dt_softplus:
        bias = dt_bias if dt_bias is not None else dt.new_zeros(dt.shape[-1])
        dt = mamba2.dt_softplus(dt, bias, dt_limit=limit)
    else:
        dt = (dt if dt_bias is None else dt + dt_bias).clamp(*limit)
    y, final = mamba2.ssd(x, dt, A, B, C, D, initial_states, chunk_size=chunk_size,
                          return_final_states=True)
    if z is not None:
        y = y * F.silu(z)
    return (y, final) if return_final_states else y
