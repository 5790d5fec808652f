# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.cp on any number of ranks: each rank's steps of the outputs and of
the input gradients equal the single-rank operators' on the whole sequence,
and the parameter gradients summed over the ranks equal theirs, for even,
uneven and empty-rank splits; gradcheck of the whole sequence's function
(every rank's steps gathered) on every rank at once; a bad argument on one
rank is the same kdnn.Error on every rank."""
import math

import pytest
import torch
import torch.nn.functional as F
from ranks import MPI, comm, leaves, rank, size, summed

import kdnn



def split(L, pattern, r=None):
    """(first, count) of rank r's steps (default: this rank's): "even",
    "uneven" (rank r holds about r + 1 shares) or "empty" (the last rank
    holds nothing)."""
    r = rank if r is None else r
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
    first = sum(counts[:r])
    return first, counts[r]


def packed_ids(B, L, pattern, starts):
    """seq_idx [B, L] whose sequences start at `starts` and, in row 0, also
    at every rank's first step (row 1: only at `starts`)."""
    edges = {split(L, pattern, r)[0] for r in range(size)}
    rows = []
    for b in range(B):
        cut = set(starts) | (edges if b == 0 else set())
        rows.append([sum(1 for c in cut if 0 < c <= t) for t in range(L)])
    return torch.tensor(rows, dtype=torch.int64)


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
    y = kdnn.causal_conv1d(xs, ws, bs, activation="silu")
    dto = kdnn.dt_softplus(ds, dbs)
    ((y * gy).sum() + (dto * gd).sum()).backward()

    xp, wp, bp, dp, dbp = leaves(x[:, mine], w, bias, dt[:, mine], dt_bias)
    yp, dtop = kdnn.cp.conv_dt(xp, wp, dp, dbp, bp, comm=comm)
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
    y, fin = kdnn.ssd(*whole, chunk_size=chunk, return_final_states=True)
    ((y * gy).sum() + (fin * gfin).sum()).backward()

    part = leaves(x[:, mine], dt[:, mine], A, B[:, mine], C[:, mine], D, s0 if rank == 0 else None)
    yp, finp = kdnn.cp.ssd(*part, chunk_size=chunk, comm=comm, return_final_states=True)
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


@pytest.mark.parametrize("pattern", PATTERNS)
def test_packed_sequences_equal_the_single_rank_operators(pattern):
    """seq_idx on every rank's steps: the conv's halo and the SSD's state
    stop at a sequence start, also where it is a rank's first step."""
    torch.manual_seed(3)
    b, L, h, p, g, n, K = 2, 22, 2, 3, 1, 4, 4
    f64 = dict(dtype=torch.float64)
    seq = packed_ids(b, L, pattern, [1, 5, 6, 13])
    first, count = split(L, pattern)
    mine = slice(first, first + count)

    xc, w, dtc = torch.randn(b, L, 5, **f64), torch.randn(5, K, **f64), torch.randn(b, L, h, **f64)
    dtb, gy = torch.randn(h, **f64), torch.randn(b, L, 5, **f64)
    xs, ws = leaves(xc, w)
    y = kdnn.causal_conv1d(xs, ws, activation="silu", seq_idx=seq)
    (y * gy).sum().backward()
    xp, wp = leaves(xc[:, mine], w)
    yp, _ = kdnn.cp.conv_dt(xp, wp, dtc[:, mine], dtb, comm=comm, seq_idx=seq[:, mine])
    (yp * gy[:, mine]).sum().backward()
    torch.testing.assert_close(yp, y[:, mine])
    torch.testing.assert_close(xp.grad, xs.grad[:, mine])
    torch.testing.assert_close(summed(wp.grad), ws.grad)

    x, dt = torch.randn(b, L, h, p, **f64), F.softplus(torch.randn(b, L, h, **f64))
    A, B, C = -torch.rand(h, **f64) - 0.1, torch.randn(b, L, g, n, **f64), torch.randn(b, L, g, n, **f64)
    s0, gs = torch.randn(b, h, p, n, **f64), torch.randn(b, L, h, p, **f64)
    whole = leaves(x, dt, A, B, C, s0)
    y = kdnn.ssd(*whole[:5], None, whole[5], chunk_size=4, seq_idx=seq)
    (y * gs).sum().backward()
    part = leaves(x[:, mine], dt[:, mine], A, B[:, mine], C[:, mine], s0 if rank == 0 else None)
    yp = kdnn.cp.ssd(*part[:5], None, part[5], chunk_size=4, comm=comm, seq_idx=seq[:, mine])
    (yp * gs[:, mine]).sum().backward()
    torch.testing.assert_close(yp, y[:, mine])
    for i in (0, 1, 3, 4):  # x, dt, B, C: this rank's steps
        torch.testing.assert_close(part[i].grad, whole[i].grad[:, mine])
    torch.testing.assert_close(summed(part[2].grad), whole[2].grad)
    if rank == 0:
        torch.testing.assert_close(part[5].grad, whole[5].grad)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_varlen_states_of_each_rank_equal_the_single_rank_ones(pattern):
    """Each rank's offsets (0, the starts inside its steps, its step count):
    the state after each of its segments, and so the final state of every
    sequence that ends on it, equals the single-rank call's."""
    torch.manual_seed(4)
    L, h, p, g, n = 23, 2, 3, 1, 4
    f64 = dict(dtype=torch.float64)
    starts = [5, 6, 13, 13, 20]  # an empty sequence at 13
    seq = torch.tensor([[sum(1 for c in starts if c <= t) for t in range(L)]])
    first, count = split(L, pattern)
    x, dt = torch.randn(1, L, h, p, **f64), F.softplus(torch.randn(1, L, h, **f64))
    A, B, C = -torch.rand(h, **f64) - 0.1, torch.randn(1, L, g, n, **f64), torch.randn(1, L, g, n, **f64)
    s0 = torch.randn(1, h, p, n, **f64)
    mine = [0] + [c - first for c in starts if first < c < first + count] + [count]
    _, states = kdnn.cp.ssd(x[:, first:first + count], dt[:, first:first + count], A,
                            B[:, first:first + count], C[:, first:first + count], None,
                            s0 if rank == 0 else None, chunk_size=4, comm=comm,
                            seq_idx=seq[:, first:first + count], cu_seqlens=mine,
                            return_varlen_states=True)
    assert list(states.shape) == [len(mine) - 1, h, p, n]
    for q in range(len(mine) - 1):
        if mine[q + 1] == mine[q]:
            torch.testing.assert_close(states[q], torch.zeros_like(states[q]), rtol=0, atol=0)
            continue
        end = first + mine[q + 1]
        # The single-rank scan's final state after `end` steps of the same ids.
        _, want = kdnn.ssd(x[:, :end], dt[:, :end], A, B[:, :end], C[:, :end], None, s0,
                           chunk_size=4, seq_idx=seq[:, :end], return_final_states=True)
        torch.testing.assert_close(states[q], want[0])


@pytest.mark.parametrize("pattern", PATTERNS)
def test_ssd_step_sizes_and_gate_equal_the_single_rank_scan(pattern):
    """dt_bias, dt_softplus, dt_limit and z on each rank's steps; dt_bias's
    gradient a partial sum as A's."""
    torch.manual_seed(2)
    b, L, h, p, g, n = 1, 19, 2, 3, 1, 4
    f64 = dict(dtype=torch.float64)
    x, dt, z = torch.randn(b, L, h, p, **f64), torch.randn(b, L, h, **f64), torch.randn(b, L, h, p, **f64)
    A, bias = -torch.rand(h, **f64) - 0.1, torch.randn(h, **f64)
    B, C = torch.randn(b, L, g, n, **f64), torch.randn(b, L, g, n, **f64)
    gy = torch.randn(b, L, h, p, **f64)
    first, count = split(L, pattern)
    mine = slice(first, first + count)
    options = dict(chunk_size=4, dt_softplus=True, dt_limit=(0.05, 2.0))

    whole = leaves(x, dt, A, B, C, z, bias)
    y = kdnn.ssd(*whole[:5], None, None, *whole[5:], **options)
    (y * gy).sum().backward()

    part = leaves(x[:, mine], dt[:, mine], A, B[:, mine], C[:, mine], z[:, mine], bias)
    yp = kdnn.cp.ssd(*part[:5], None, None, *part[5:], comm=comm, **options)
    (yp * gy[:, mine]).sum().backward()

    torch.testing.assert_close(yp, y[:, mine])
    for i in (0, 1, 3, 4, 5):  # x, dt, B, C, z: this rank's steps
        torch.testing.assert_close(part[i].grad, whole[i].grad[:, mine])
    for i in (2, 6):  # A, dt_bias: partial sums
        torch.testing.assert_close(summed(part[i].grad), whole[i].grad)


def test_a_bad_dt_on_one_rank_is_an_error_on_every_rank():
    x, dt = torch.randn(1, 4, 2, 3), torch.full((1, 4, 2), 0.5)
    if rank == 0:
        dt[0, 2, 1] = -1.0
    with pytest.raises(kdnn.Error, match=r"dt\[0, 2, 1\]=-1"):
        kdnn.cp.ssd(x, dt, -torch.ones(2), torch.randn(1, 4, 1, 2), torch.randn(1, 4, 1, 2),
                    chunk_size=4, comm=comm)


def test_comm_must_be_a_communicator():
    with pytest.raises(kdnn.Error, match="comm is a int, expected an mpi4py communicator"):
        kdnn.cp.ssd(torch.randn(1, 4, 2, 3), torch.ones(1, 4, 2), -torch.ones(2),
                    torch.randn(1, 4, 1, 2), torch.randn(1, 4, 1, 2), chunk_size=4, comm=0)


def ssd_call(**changes):
    """kdnn.cp.ssd on a small valid problem (2 steps per rank), with
    `changes` to its arguments (a value of None drops an optional one)."""
    torch.manual_seed(3)
    args = dict(x=torch.randn(1, 2, 2, 3), dt=torch.full((1, 2, 2), 0.5), A=-torch.ones(2),
                B=torch.randn(1, 2, 1, 2), C=torch.randn(1, 2, 1, 2), D=torch.ones(2),
                dt_bias=torch.zeros(2), chunk_size=4, comm=comm)
    args.update(changes)
    return kdnn.cp.ssd(**args)


def conv_dt_call(**changes):
    """kdnn.cp.conv_dt on a small valid problem, with `changes`."""
    torch.manual_seed(4)
    args = dict(x=torch.randn(1, 3, 4), weight=torch.ones(4, 3), dt=torch.randn(1, 3, 2),
                dt_bias=torch.zeros(2), comm=comm)
    args.update(changes)
    return kdnn.cp.conv_dt(**args)


# Arguments that are wrong wherever they are given: on the last rank only,
# every rank must raise the same kdnn.Error (they used to raise on that
# rank while the others waited in MPI forever).
BAD_ON_ONE_RANK = [
    (ssd_call, dict(D=torch.ones(3)), r"cp.ssd: D has shape \[3\]"),
    (ssd_call, dict(chunk_size=0), r"cp.ssd: chunk_size=0, expected an integer in \[1, "),
    (ssd_call, dict(dt_limit=(1.0, 0.5)), r"cp.ssd: dt_limit=\(1.0, 0.5\), expected"),
    (ssd_call, dict(seq_idx=torch.zeros(1, 2)), r"cp.ssd: seq_idx has dtype torch.float32"),
    (ssd_call, dict(x=torch.randn(1, 2, 2, 3).half()), r"cp.ssd: x has dtype torch.float16"),
    (conv_dt_call, dict(activation="relu"), r"cp.conv_dt: activation='relu', expected one of"),
    (conv_dt_call, dict(weight=torch.ones(4, 3, 1)), r"cp.conv_dt: weight has shape \[4, 3, 1\]"),
    (conv_dt_call, dict(dt_limit=(0.0, -1.0)), r"cp.conv_dt: dt_limit=\(0.0, -1.0\), expected"),
    (conv_dt_call, dict(seq_idx=[[0.5, 0.5, 0.5]]), r"cp.conv_dt: seq_idx has dtype"),
]


@pytest.mark.parametrize("call, bad, message", BAD_ON_ONE_RANK)
def test_a_bad_argument_on_one_rank_is_the_same_error_on_every_rank(call, bad, message):
    changes = bad if rank == size - 1 else {}
    with pytest.raises(kdnn.Error, match=message + rf".* \(on rank {size - 1} of {size}\)$"):
        call(**changes)
    call()  # the ranks are still in step: a good call after it succeeds on every rank


def _with_nan(shape, at):
    t = torch.randn(*shape)
    t[at] = float("nan")
    return t


@pytest.mark.parametrize("call, data, message", [
    (ssd_call, dict(x=_with_nan((1, 2, 2, 3), (0, 1, 0, 2))), r"x\[0, 1, 0, 2\]=nan"),
    (conv_dt_call, dict(x=_with_nan((1, 3, 4), (0, 2, 1))), r"x\[0, 2, 1\]=nan"),
    (conv_dt_call, dict(dt=_with_nan((1, 3, 2), (0, 0, 1))), r"dt\[0, 0, 1\]=nan"),
])
def test_check_finite_is_collective(call, data, message):
    # A NaN on the last rank: without check_finite it propagates there (no
    # error, every rank returns); with it, every rank raises the same error.
    out = call(**(data if rank == size - 1 else {}))
    outs = out if isinstance(out, tuple) else (out,)
    assert any(torch.isnan(o).any().item() for o in outs) == (rank == size - 1)
    with pytest.raises(kdnn.Error, match=message + rf", expected finite values \(check_finite\) "
                                                   rf"\(on rank {size - 1} of {size}\)$"):
        call(check_finite=True, **(data if rank == size - 1 else {}))


# Arguments that are valid on each rank alone but differ between ranks
# (each rank returned a result, a wrong one): the same kdnn.Error everywhere.
DIFFER_BETWEEN_RANKS = [
    (ssd_call, dict(D=torch.ones(2, 3)), r"D's length \(H, or H·P per channel\)=6 on rank"),
    (ssd_call, dict(dt_limit=(0.0, 2.0)), r"opts.dt_max=2 on rank \d+, expected inf"),
    (ssd_call, dict(A=-2 * torch.ones(2)), r"cp::ssd_forward: A on rank \d+ differs from rank 0's"),
    (ssd_call, dict(dt_bias=torch.ones(2)), r"dt_bias on rank \d+ differs from rank 0's"),
    (ssd_call, dict(D=2 * torch.ones(2)), r"D on rank \d+ differs from rank 0's"),
    (ssd_call, dict(x=torch.randn(1, 2, 2, 3, dtype=torch.float64),
                    dt=torch.full((1, 2, 2), 0.5, dtype=torch.float64),
                    A=-torch.ones(2, dtype=torch.float64), B=torch.randn(1, 2, 1, 2).double(),
                    C=torch.randn(1, 2, 1, 2).double(), D=torch.ones(2).double(),
                    dt_bias=torch.zeros(2).double()),
     r"x has dtype float64 on rank \d+, expected float32"),
    (conv_dt_call, dict(weight=2 * torch.ones(4, 3)), r"weight on rank \d+ differs from rank 0's"),
    (conv_dt_call, dict(dt_bias=torch.ones(2)), r"dt_bias on rank \d+ differs from rank 0's"),
    (conv_dt_call, dict(bias=torch.ones(4)), r"bias given=1 on rank"),
]


@pytest.mark.skipif(size < 2, reason="needs two ranks")
@pytest.mark.parametrize("call, different, message", DIFFER_BETWEEN_RANKS)
def test_arguments_that_differ_between_ranks_are_an_error_on_every_rank(call, different, message):
    with pytest.raises(kdnn.Error, match=message):
        call(**(different if rank == size - 1 else {}))
    call()


class _FakeComm:
    def py2f(self):
        return 0


class _HugeHandle(MPI.Intracomm):
    def py2f(self):
        return 2**40


class _GarbageHandle(MPI.Intracomm):
    def py2f(self):
        return 123456


class _StringHandle(MPI.Intracomm):
    def py2f(self):
        return "0"


def _freed():
    dup = comm.Dup()
    dup.Free()  # mpi4py sets it to MPI.COMM_NULL
    return dup


BAD_COMMUNICATORS = [
    (lambda: _FakeComm(), "comm is a _FakeComm, expected an mpi4py communicator"),
    (lambda: MPI.COMM_NULL, "comm is MPI.COMM_NULL"),
    (lambda: comm.Get_group(), "comm is a Group, expected an mpi4py communicator"),
    (_freed, "comm is MPI.COMM_NULL"),
    (lambda: _GarbageHandle(comm), "comm has the handle 123456, which names no communicator"),
    (lambda: _HugeHandle(comm), "comm has the handle 1099511627776, expected a Fortran integer"),
    (lambda: _StringHandle(comm), "comm has the handle '0', expected a Fortran integer"),
]


@pytest.mark.parametrize("make, message", BAD_COMMUNICATORS)
def test_a_bad_communicator_is_an_error_naming_comm(make, message):
    # Every rank passes it: a rank without a usable communicator cannot
    # reach the others, so this check is each rank's own.
    bad = make()
    for call in (ssd_call, conv_dt_call):
        with pytest.raises(kdnn.Error, match=message):
            call(comm=bad)


@pytest.mark.skipif(size < 2, reason="an intercommunicator needs two ranks")
def test_an_intercommunicator_is_refused():
    half = comm.Split(rank % 2, rank)
    inter = half.Create_intercomm(0, comm, 1 - rank % 2 if size > 1 else 0, tag=7)
    try:
        with pytest.raises(kdnn.Error, match="comm is an intercommunicator, expected an "
                                             "intracommunicator"):
            ssd_call(comm=inter)
    finally:
        inter.Free()
        half.Free()


class _AllgatherSteps(torch.autograd.Function):
    """Every rank's [B, n_r, ...] into the whole [B, L, ...] on every rank
    (ranks in order); its backward keeps this rank's steps."""

    @staticmethod
    def forward(ctx, part, counts):
        first = sum(counts[:rank])
        ctx.steps = slice(first, first + counts[rank])
        mine = part.transpose(0, 1).contiguous()  # [n_r, B, ...]: a rank's block is contiguous
        per_step = mine[0].numel() if mine.shape[0] else math.prod(mine.shape[1:])
        whole = part.new_empty((sum(counts),) + tuple(mine.shape[1:]))
        comm.Allgatherv(mine.numpy(), [whole.numpy(), [c * per_step for c in counts]])
        return whole.transpose(0, 1).contiguous()

    @staticmethod
    def backward(ctx, g):
        return g[:, ctx.steps].contiguous(), None


class _SumGradientOverRanks(torch.autograd.Function):
    """The identity; its backward sums the gradient over the ranks."""

    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        return summed(g)


def whole_sequence(op, inputs, per_step, counts):
    """op on this rank's steps of replicated whole-sequence inputs, its
    outputs gathered: a function of the whole inputs to the whole outputs,
    the same on every rank, whose gradient is checked against finite
    differences on every rank at once (every call collective, in step)."""
    first = sum(counts[:rank])
    mine = slice(first, first + counts[rank])
    xs = [_SumGradientOverRanks.apply(t) for t in inputs]
    xs = [t[:, mine] if step else t for t, step in zip(xs, per_step)]
    out = op(*xs)
    outs = out if isinstance(out, tuple) else (out,)
    return tuple(_AllgatherSteps.apply(o, counts) for o in outs)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_gradcheck_of_the_whole_sequence(pattern):
    L = 7
    counts = comm.allgather(split(L, pattern)[1])
    f64 = dict(dtype=torch.float64, requires_grad=True)
    torch.manual_seed(3)
    conv = [torch.randn(1, L, 2, **f64), torch.randn(2, 3, **f64), torch.randn(1, L, 1, **f64),
            torch.randn(1, **f64), torch.randn(2, **f64)]
    assert torch.autograd.gradcheck(
        lambda *a: whole_sequence(lambda x, w, dt, dtb, b: kdnn.cp.conv_dt(x, w, dt, dtb, b, comm=comm),
                                  a, (True, False, True, False, False), counts), conv)
    ssd = [torch.randn(1, L, 2, 2, **f64),
           F.softplus(torch.randn(1, L, 2, dtype=torch.float64)).requires_grad_(True),
           (-torch.rand(2, dtype=torch.float64) - 0.1).requires_grad_(True),
           torch.randn(1, L, 1, 3, **f64), torch.randn(1, L, 1, 3, **f64), torch.randn(2, **f64)]
    assert torch.autograd.gradcheck(
        lambda *a: whole_sequence(lambda x, dt, A, B, C, D: kdnn.cp.ssd(x, dt, A, B, C, D, chunk_size=3, comm=comm),
                                  a, (True, True, False, True, True, False), counts), ssd)
