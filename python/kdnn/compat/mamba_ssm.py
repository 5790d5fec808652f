# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mamba_ssm's mamba_chunk_scan_combined (mamba_ssm.ops.triton.ssd_combined)
on kdnn's SSD scan: x (batch, seqlen, nheads, headdim), dt (batch, seqlen,
nheads), A (nheads), B and C (batch, seqlen, ngroups, dstate), the layouts
kdnn takes without a copy.

D of shape (nheads,) or (nheads, headdim), dt_bias, dt_softplus, dt_limit
and the gate z are kdnn.ssd's own: the step-size transform and the gate run
inside the call, as in mamba.
"""
import torch

from .. import mamba2
from .._tensors import Error, require


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                              initial_states=None, seq_idx=None, cu_seqlens=None,
                              dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False):
    """mamba's mamba_chunk_scan_combined: returns out (batch, seqlen,
    nheads, headdim), y·SiLU(z) when z is given, and with
    return_final_states also the final states (batch, nheads, headdim,
    dstate). dt (after dt_bias, softplus and dt_limit) must be >= 0, A
    finite and <= 0, D and dt_bias finite (kdnn.Error otherwise, naming the
    first bad value); a NaN in the data propagates, as in PyTorch.
    seq_idx (batch, seqlen), integers: packed sequences, the state reset
    where the id changes, as mamba's; as there, the initial states belong
    to sequence id 0 (a row whose first id is not 0 starts from zeros).
    With return_varlen_states (batch 1, cu_seqlens (num_sequences + 1) and
    seq_idx given), also each sequence's final state (num_sequences,
    nheads, headdim, dstate), returned last, without a gradient, as mamba's;
    cu_seqlens is ignored otherwise, as there."""
    op = "compat.mamba_ssm.mamba_chunk_scan_combined"
    for name, value in (("dt_softplus", dt_softplus), ("return_final_states", return_final_states),
                        ("return_varlen_states", return_varlen_states)):
        if not isinstance(value, bool):
            raise Error(f"{op}: {name}={value!r}, expected True or False")
    require(isinstance(dt, torch.Tensor) and dt.dim() == 3,
            f"{op}: dt has shape {list(getattr(dt, 'shape', []))}, expected (batch, seqlen, "
            "nheads)")
    # mamba always clamps dt to dt_limit (a negative dt without softplus
    # becomes 0 by default); a zero bias asks kdnn for the transform.
    if dt_bias is None:
        dt_bias = dt.new_zeros(dt.shape[-1])
    if seq_idx is not None and isinstance(initial_states, torch.Tensor):
        first = torch.as_tensor(seq_idx, device=initial_states.device)
        if first.dim() == 2 and first.shape[1] > 0:  # else kdnn.ssd names the bad shape
            keep = (first[:, 0] == 0).to(initial_states.dtype)
            initial_states = initial_states * keep.reshape(-1, *([1] * (initial_states.dim() - 1)))
    return mamba2.ssd(
        x, dt, A, B, C, D, initial_states, z, dt_bias, chunk_size=chunk_size,
        dt_softplus=dt_softplus, dt_limit=dt_limit, return_final_states=return_final_states,
        seq_idx=seq_idx, cu_seqlens=cu_seqlens if return_varlen_states else None,
        return_varlen_states=return_varlen_states)
