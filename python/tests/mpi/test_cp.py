# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.cp on any number of ranks: each rank's steps of the outputs and of
the input gradients equal the single-rank operators' on the whole sequence,
and the parameter gradients summed over the ranks equal theirs, for even,
uneven and empty-rank splits; a bad argument on one rank is the same
kdnn.Error on every rank."""
import pytest
import torch
import torch.nn.functional as F

import kdnn

MPI = pytest.importorskip("mpi4py.MPI")
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def split(L, pattern):
    """(first, count) of this rank's steps: "even", "uneven" (rank r holds
    about r + 1 shares) or "empty" (the last rank holds nothing)."""
    if pattern == "even":
        counts = [L // size + (r < L % size) for r in range(size)]
    elif pattern == "uneven":
        weights = [r + 1 for r in range(size)]
        counts = [L * w // sum(weights) for w in weights]
        counts[-1] += L - sum(counts)
    else:
        counts = [L // max(size - 1, 1) for _ in range(size)]
        counts[-1] = 0
        counts[0] += L - sum(counts)
    first = sum(counts[:rank])
    return first, counts[rank]


def summed(t):
    """t summed over the ranks (parameter gradients are partial sums)."""
    out = t.detach().clone().contiguous()
    comm.Allreduce(MPI.IN_PLACE, out.numpy(), op=MPI.SUM)
    return out


def leaves(*ts):
    return [None if t is None else t.detach().clone().requires_grad_(True) for t in ts]


PATTERNS = ["even", "uneven", "empty"]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("K", [1, 4])
def test_conv_dt_equals_the_single_rank_operators(pattern, K):
    torch.manual_seed(0)  # the same inputs on every rank
    B, L, C, H = 2, 23, 5, 3
    x, dt = torch.randn(B, L, C, dtype=torch.float64), torch.randn(B, L, H, dtype=torch.float64)
    w, bias = torch.randn(C, K, dtype=torch.float64), torch.randn(C, dtype=torch.float64)
    dt_bias = torch.randn(H, dtype=torch.float64)
    gy, gd = torch.randn(B, L, C, dtype=torch.float64), torch.randn(B, L, H, dtype=torch.float64)
    first, n = split(L, pattern)
    mine = slice(first, first + n)

    xs, ws, bs, ds, dbs = leaves(x, w, bias, dt, dt_bias)
    y = kdnn.causal_conv1d(xs, ws, bs, "silu")
    dto = kdnn.dt_softplus(ds, dbs)
    ((y * gy).sum() + (dto * gd).sum()).backward()

    xp, wp, bp, dp, dbp = leaves(x[:, mine], w, bias, dt[:, mine], dt_bias)
    yp, dtop = kdnn.cp.conv_dt(xp, wp, dp, dbp, comm, bias=bp)
    ((yp * gy[:, mine]).sum() + (dtop * gd[:, mine]).sum()).backward()

    torch.testing.assert_close(yp, y[:, mine])
    torch.testing.assert_close(dtop, dto[:, mine])
    torch.testing.assert_close(xp.grad, xs.grad[:, mine])
    torch.testing.assert_close(dp.grad, ds.grad[:, mine])
    for part, whole in ((wp, ws), (bp, bs), (dbp, dbs)):
        torch.testing.assert_close(summed(part.grad), whole.grad)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("chunk", [4, 64])
def test_ssd_equals_the_single_rank_scan(pattern, chunk):
    torch.manual_seed(1)
    b, L, h, p, g, n = 2, 21, 4, 3, 2, 5
    f64 = dict(dtype=torch.float64)
    x, dt = torch.randn(b, L, h, p, **f64), F.softplus(torch.randn(b, L, h, **f64))
    A, D = -torch.rand(h, **f64) - 0.1, torch.randn(h, **f64)
    B, C = torch.randn(b, L, g, n, **f64), torch.randn(b, L, g, n, **f64)
    s0, gy = torch.randn(b, h, p, n, **f64), torch.randn(b, L, h, p, **f64)
    gfin = torch.randn(b, h, p, n, **f64)
    first, count = split(L, pattern)
    mine = slice(first, first + count)
    last = rank == size - 1

    whole = leaves(x, dt, A, B, C, D, s0)
    y, fin = kdnn.ssd(*whole[:5], chunk, D=whole[5], initial_states=whole[6],
                      return_final_states=True)
    ((y * gy).sum() + (fin * gfin).sum()).backward()

    part = leaves(x[:, mine], dt[:, mine], A, B[:, mine], C[:, mine], D, s0 if rank == 0 else None)
    yp, finp = kdnn.cp.ssd(*part[:5], chunk, comm, D=part[5], initial_states=part[6],
                           return_final_states=True)
    # The sequence's final state is the last rank's.
    ((yp * gy[:, mine]).sum() + ((finp * gfin).sum() if last else 0)).backward()

    torch.testing.assert_close(yp, y[:, mine])
    if last:
        torch.testing.assert_close(finp, fin)
    for i in (0, 1, 3, 4):  # x, dt, B, C: this rank's steps
        torch.testing.assert_close(part[i].grad, whole[i].grad[:, mine])
    for i in (2, 5):  # A, D: partial sums
        torch.testing.assert_close(summed(part[i].grad), whole[i].grad)
    if rank == 0:
        torch.testing.assert_close(part[6].grad, whole[6].grad)


def test_a_bad_dt_on_one_rank_is_an_error_on_every_rank():
    x, dt = torch.randn(1, 4, 2, 3), torch.full((1, 4, 2), 0.5)
    if rank == 0:
        dt[0, 2, 1] = -1.0
    with pytest.raises(kdnn.Error, match=r"dt\[0, 2, 1\]=-1"):
        kdnn.cp.ssd(x, dt, -torch.ones(2), torch.randn(1, 4, 1, 2), torch.randn(1, 4, 1, 2), 4, comm)


def test_comm_must_be_a_communicator():
    with pytest.raises(kdnn.Error, match="comm is a int, expected an mpi4py communicator"):
        kdnn.cp.ssd(torch.randn(1, 4, 2, 3), torch.ones(1, 4, 2), -torch.ones(2),
                    torch.randn(1, 4, 1, 2), torch.randn(1, 4, 1, 2), 4, 0)


@pytest.mark.skipif(size != 1, reason="a rank's Jacobian is its own only on one rank")
def test_gradcheck_on_one_rank():
    # On more ranks a rank's input gradients include the other ranks'
    # losses, so gradcheck's per-rank Jacobian does not apply; the tests
    # above compare with the single-rank operators, which pass gradcheck.
    f64 = dict(dtype=torch.float64, requires_grad=True)
    x, w, b = torch.randn(2, 7, 3, **f64), torch.randn(3, 4, **f64), torch.randn(3, **f64)
    dt, dtb = torch.randn(2, 7, 2, **f64), torch.randn(2, **f64)
    assert torch.autograd.gradcheck(lambda *a: kdnn.cp.conv_dt(*a[:4], comm, bias=a[4]),
                                    (x, w, dt, dtb, b))
    xs = torch.randn(1, 6, 2, 2, **f64)
    dts = F.softplus(torch.randn(1, 6, 2, dtype=torch.float64)).requires_grad_(True)
    A = (-torch.rand(2, dtype=torch.float64) - 0.1).requires_grad_(True)
    B, C = torch.randn(1, 6, 1, 3, **f64), torch.randn(1, 6, 1, 3, **f64)
    D, s0 = torch.randn(2, **f64), torch.randn(1, 2, 2, 3, **f64)
    assert torch.autograd.gradcheck(
        lambda *a: kdnn.cp.ssd(*a[:5], 4, comm, D=a[5], initial_states=a[6],
                               return_final_states=True), (xs, dts, A, B, C, D, s0))
