# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.compat's mHC Sinkhorn entry points against their peers' semantics,
written here in PyTorch from the peers' documentation: TileKernels'
sinkhorn_normalize (row softmax + eps, then column/row divisions by
sum + eps) and TransformerEngine's mhc_fused_sinkhorn (row then column
normalisation in the log domain); forward and gradients (autograd through
the iterations as run), any n."""
import pytest
import torch
from common import DTYPES, TOLERANCE, assert_matches

import kdnn
from kdnn.compat.tile_kernels import sinkhorn_normalize
from kdnn.compat.transformer_engine import mhc_fused_sinkhorn


def tile_kernels_ref(x, repeat=10, eps=1e-6):
    x = x.softmax(-1) + eps
    x = x / (x.sum(-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        x = x / (x.sum(-1, keepdim=True) + eps)
        x = x / (x.sum(-2, keepdim=True) + eps)
    return x


def transformer_engine_ref(x, iters=20):
    f = torch.zeros_like(x[..., :, :1])  # row potentials
    g = torch.zeros_like(x[..., :1, :])  # column potentials
    for _ in range(iters):
        f = -torch.logsumexp(x + g, dim=-1, keepdim=True)
        g = -torch.logsumexp(x + f, dim=-2, keepdim=True)
    return torch.exp(f + x + g)


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
