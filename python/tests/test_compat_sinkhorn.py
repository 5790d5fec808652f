# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.compat's mHC Sinkhorn entry points against their peers' semantics
(kdnn_reference.mhc_peers: TileKernels' sinkhorn_normalize and
TransformerEngine's log-domain mhc_fused_sinkhorn); forward and gradients
(autograd through the iterations as run), any n."""
import pytest
import torch
from common import DTYPES, TOLERANCE, assert_matches
from kdnn_reference.mhc_peers import te_forward as transformer_engine_ref
from kdnn_reference.mhc_peers import tk_forward as tile_kernels_ref

import kdnn
from kdnn.compat.tile_kernels import sinkhorn_normalize
from kdnn.compat.transformer_engine import mhc_fused_sinkhorn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [4, 7])
def test_tile_kernels(dtype, n):
    x = torch.randn(3, 5, n, n, dtype=dtype, requires_grad=True)
    assert_matches(sinkhorn_normalize(x), tile_kernels_ref(x), (x,), **TOLERANCE[dtype])
    assert_matches(sinkhorn_normalize(x, 3, 0.1), tile_kernels_ref(x, 3, 0.1), (x,),
                   **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [4, 6])
def test_transformer_engine(dtype, n):
    x = torch.randn(8, 2, n, n, dtype=dtype, requires_grad=True)
    assert_matches(mhc_fused_sinkhorn(x, n), transformer_engine_ref(x), (x,), **TOLERANCE[dtype])
    assert_matches(mhc_fused_sinkhorn(x, n, False, 5), transformer_engine_ref(x, 5), (x,),
                   **TOLERANCE[dtype])


def test_transformer_engine_checks_n():
    with pytest.raises(kdnn.Error, match=r"H_res has shape \[2, 3, 3\], expected \(..., n, n\) "
                                         r"with n=4"):
        mhc_fused_sinkhorn(torch.zeros(2, 3, 3))
