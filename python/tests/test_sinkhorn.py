# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.sinkhorn against the PyTorch formulations of kdnn_reference (plain,
TransformerEngine's and TileKernels' semantics) and finite differences."""
import pytest
import torch
from common import DTYPES, TOLERANCE
from kdnn_reference import mhc_peers, sinkhorn as reference

import kdnn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 4, 8])
def test_forward_matches_the_reference(dtype, n):
    x = torch.randn(5, n, n, dtype=dtype)
    torch.testing.assert_close(kdnn.sinkhorn(x, iters=20), reference.forward(x, 20), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_first_is_transformer_engines_sinkhorn(dtype):
    x = torch.randn(6, 4, 4, dtype=dtype)
    got = kdnn.sinkhorn(x, iters=20, order="rows_first")
    torch.testing.assert_close(got, mhc_peers.te_forward(x, 20), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_eps_is_tilekernels_sinkhorn_and_its_unrolled_gradient(dtype):
    x, g = torch.randn(6, 4, 4, dtype=dtype), torch.randn(6, 4, 4, dtype=dtype)
    want, dwant = mhc_peers.autograd_backward(mhc_peers.tk_forward, x, g, repeat=10, eps=1e-6)
    x.requires_grad_(True)
    r = kdnn.sinkhorn(x, iters=10, order="rows_first", eps=1e-6, backward="unrolled")
    (r * g).sum().backward()
    torch.testing.assert_close(r.detach(), want, **TOLERANCE[dtype])
    torch.testing.assert_close(x.grad, dwant, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_unrolled_backward_is_autograds_gradient(dtype):
    x, g = torch.randn(4, 8, 8, dtype=dtype), torch.randn(4, 8, 8, dtype=dtype)
    _, dwant = reference.autograd_backward(x, g, 6)
    x.requires_grad_(True)
    (kdnn.sinkhorn(x, iters=6, backward="unrolled") * g).sum().backward()
    torch.testing.assert_close(x.grad, dwant, **TOLERANCE[dtype])


@pytest.mark.parametrize("backward", ["implicit", "block"])
def test_implicit_backwards_are_the_converged_gradient(backward):
    x, g = torch.randn(4, 6, 6, dtype=torch.float64), torch.randn(4, 6, 6, dtype=torch.float64)
    _, dwant = reference.autograd_backward(x, g, 300)  # converged
    x.requires_grad_(True)
    (kdnn.sinkhorn(x, iters=300, backward=backward) * g).sum().backward()
    torch.testing.assert_close(x.grad, dwant, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("backward,iters", [("implicit", 200), ("block", 200), ("unrolled", 3)])
@pytest.mark.parametrize("order", ["columns_first", "rows_first"])
def test_gradcheck(backward, iters, order):
    x = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x: kdnn.sinkhorn(x, iters=iters, order=order, backward=backward), (x,))


def test_leading_dimensions_and_a_single_matrix_keep_their_shape():
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    r = kdnn.sinkhorn(x, iters=20)
    assert r.shape == x.shape
    torch.testing.assert_close(r, reference.forward(x, 20))
    torch.testing.assert_close(kdnn.sinkhorn(x[0, 1], iters=20), r[0, 1])


def test_empty_batch():
    x = torch.randn(0, 4, 4, requires_grad=True)
    r = kdnn.sinkhorn(x)
    r.sum().backward()
    assert r.shape == (0, 4, 4) and x.grad.shape == (0, 4, 4)


def test_module():
    m = kdnn.nn.Sinkhorn(iters=20, order="rows_first")
    x = torch.randn(3, 4, 4)
    torch.testing.assert_close(m(x), kdnn.sinkhorn(x, iters=20, order="rows_first"))
