# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The interfaces of the libraries kdnn's users come from, on kdnn's kernels:
changing an import is all a user does.

    from kdnn.compat.flash_attn import flash_attn_func, flash_attn_varlen_func
    from kdnn.compat.causal_conv1d import causal_conv1d_fn, causal_conv1d_update
    from kdnn.compat.mamba_ssm import mamba_chunk_scan_combined
    from kdnn.compat.transformer_engine import mhc_fused_sinkhorn
    from kdnn.compat.tile_kernels import sinkhorn_normalize

Each function has its peer's name, arguments (positional as the peer's),
defaults, layouts and return values; an option kdnn does not have raises
kdnn.Error naming it. docs/python.md has a table per peer.
"""
from . import causal_conv1d, flash_attn, mamba_ssm, tile_kernels, transformer_engine

__all__ = ["causal_conv1d", "flash_attn", "mamba_ssm", "tile_kernels", "transformer_engine"]
