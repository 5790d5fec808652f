# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""TileKernels' mHC Sinkhorn (tile_kernels.mhc.sinkhorn_normalize) on
kdnn.sinkhorn: a row softmax plus eps, then `repeat` column and row
normalisations dividing by sum + eps, differentiated through the
iterations as run (kdnn's unrolled backward). Any n (the peer's kernels
take n = 4), float32 and float64.
"""
from ..sinkhorn import sinkhorn as _sinkhorn
from .._tensors import integer


def sinkhorn_normalize(x, repeat=10, eps=1e-6):
    """x [..., n, n] -> the normalised matrices, as TileKernels'."""
    repeat = integer("compat.tile_kernels.sinkhorn_normalize", "repeat", repeat, 1, 2**31 - 1)
    return _sinkhorn(x, iters=repeat, order="rows_first", eps=eps, backward="unrolled")
