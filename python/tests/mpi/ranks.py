# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""What the context-parallel tests share: the ranks of MPI.COMM_WORLD, a
sum over them, and fresh leaves of autograd."""
import pytest

MPI = pytest.importorskip("mpi4py.MPI")
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def summed(t):
    """t summed over the ranks (parameter gradients are partial sums)."""
    out = t.detach().clone().contiguous()
    comm.Allreduce(MPI.IN_PLACE, out.numpy(), op=MPI.SUM)
    return out


def leaves(*ts):
    """Copies of ts that require grad (None stays None)."""
    return [None if t is None else t.detach().clone().requires_grad_(True) for t in ts]
