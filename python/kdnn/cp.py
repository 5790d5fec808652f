# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.cp: Mamba-2's conv1d + dt softplus and SSD with the sequence split
across the ranks of an MPI communicator (mpi4py), differentiable.

Each rank passes its own consecutive steps (rank 0 the first; any split,
ranks with no steps included) and gets its own steps of the result, equal to
the single-rank operators' on the whole sequence. The conv's K - 1 halo
steps and the SSD's states travel between the ranks inside the calls, in
the forward and in the backward. Gradients: those of a rank's inputs are the
gradients of the sum of every rank's loss (what the single-rank backward
gives for those steps); those of the parameters (weight, bias, dt_bias, A,
D) are this rank's partial sums: add them over the communicator (e.g.
comm.Allreduce), as for data parallelism. Every call is collective: all
ranks call it, in the same order. Needs kdnn built with MPI (kdnn.cp.available).
"""
import math

import torch

from . import _kdnn
from ._options import Options
from ._tensors import (Error, Operands, finite_parameter, first_order, flag, int32_array,
                       stream_of)
from .mamba2 import (_Ssd, conv_options, conv_silu, dt_limits, dt_options, ssd_operands,
                     ssd_outputs, varlen_offsets)

available = _kdnn.has_cp


def _handle(comm):
    """The Fortran handle (Comm.py2f()) of `comm`, a live mpi4py
    intracommunicator; anything else is a kdnn.Error naming comm. Local: a
    rank without a usable communicator cannot reach the others."""
    if not available:
        raise Error("kdnn.cp: this kdnn was built without MPI (install an MPI and mpi4py, then "
                    "reinstall kdnn)")
    try:
        from mpi4py import MPI
    except ImportError:
        MPI = None
    if MPI is None or not isinstance(comm, MPI.Comm):
        raise Error(f"kdnn.cp: comm is a {type(comm).__name__}, expected an mpi4py communicator "
                    "(mpi4py.MPI.Intracomm)")
    if not MPI.Is_initialized() or MPI.Is_finalized():
        state = "finalised" if MPI.Is_finalized() else "not initialised"
        raise Error(f"kdnn.cp: comm cannot be used, MPI is {state}, expected a communicator of "
                    "an initialised MPI")
    if comm == MPI.COMM_NULL:
        raise Error("kdnn.cp: comm is MPI.COMM_NULL (a null or freed communicator), expected a "
                    "live communicator")
    handle = comm.py2f()
    if not isinstance(handle, int) or not -2**31 <= handle < 2**31:
        raise Error(f"kdnn.cp: comm has the handle {handle!r}, expected a Fortran integer "
                    "(comm.py2f())")
    return handle  # the extension checks that it names a live intracommunicator


def _collective(handle, checks):
    """checks() (this rank's checks of the call's arguments) with the
    verdict agreed by every rank of the communicator: an error on any rank
    is the same kdnn.Error on every rank, never a rank raising alone while
    the others wait in MPI. Returns what checks() returns."""
    message, result = None, None
    try:
        result = checks()
    except Exception as e:  # noqa: BLE001 -- any rank's failure must reach every rank
        message = str(e) if isinstance(e, Error) else f"{type(e).__name__}: {e}"
    _kdnn.cp_agree(message, handle)
    return result


class _ConvDt(torch.autograd.Function):
    """options: the ConvDtOptions record; comm: the communicator's Fortran
    handle."""

    @staticmethod
    def forward(ctx, x, weight, bias, dt, dt_bias, options, comm, seq_idx):
        B, _, C = x.shape
        y, dt_out = torch.empty_like(x), torch.empty_like(dt)
        halo = x.new_empty(B, weight.shape[1] - 1, C)  # the K - 1 steps before this rank's
        _kdnn.cp_conv_dt_forward(x, weight, bias, dt, dt_bias, y, halo, dt_out, seq_idx,
                                 options.bound(), comm, stream_of(x))
        ctx.save_for_backward(x, weight, bias, halo, dt, dt_bias, seq_idx)
        ctx.options, ctx.comm = options, comm
        ctx.set_materialize_grads(True)
        return y, dt_out

    @staticmethod
    @first_order("cp.conv_dt")
    def backward(ctx, dy, ddt_out):
        x, weight, bias, halo, dt, dt_bias, seq_idx = ctx.saved_tensors
        dx, dw, ddt, ddt_bias = (torch.empty_like(t) for t in (x, weight, dt, dt_bias))
        dbias = None if bias is None else torch.empty_like(bias)
        _kdnn.cp_conv_dt_backward(x, weight, bias, halo, dy.contiguous(), dx, dw, dbias, dt, dt_bias,
                                  ddt_out.contiguous(), ddt, ddt_bias, seq_idx,
                                  ctx.options.bound(), ctx.comm, stream_of(x))
        return dx, dw, dbias, ddt, ddt_bias, None, None, None


def conv_dt(x, weight, dt, dt_bias, bias=None, *, comm, activation="silu",
            dt_limit=(0.0, math.inf), seq_idx=None, check_finite=False):
    """This rank's steps of kdnn.causal_conv1d(x, weight, bias, activation,
    seq_idx) and kdnn.dt_softplus(dt, dt_bias, dt_limit) on a sequence split
    across `comm`: x [B, L_r, C], weight [C, K], dt [B, L_r, H], dt_bias [H],
    seq_idx [B, L_r] (packed sequences, given on every rank or on none).
    check_finite as theirs. Returns (y [B, L_r, C], dt_out [B, L_r, H])."""
    handle = _handle(comm)

    def checks():
        check = Operands("cp.conv_dt")
        checked = [check(x, "x", 3, "[B, L_r, C]"), check(weight, "weight", 2, "[C, K]"),
                   check(dt, "dt", 3, "[B, L_r, H]"), check(dt_bias, "dt_bias", 1, "[H]"),
                   check(bias, "bias", 1, "[C]", optional=True)]
        checked[3] = finite_parameter("cp.conv_dt", "dt_bias", checked[3])
        silu = conv_silu("cp.conv_dt", checked[1], activation)
        limits = dt_limits("cp.conv_dt", dt_limit)
        finite = flag("cp.conv_dt", "check_finite", check_finite)
        options = Options("ConvDtOptions", conv=conv_options(silu, finite),
                          dt=dt_options(limits, finite))
        ids = None if seq_idx is None else int32_array("cp.conv_dt", "seq_idx", seq_idx,
                                                       list(checked[0].shape[:2]),
                                                       checked[0].device)
        return checked, options, ids

    (x, weight, dt, dt_bias, bias), options, seq_idx = _collective(handle, checks)
    return _ConvDt.apply(x, weight, bias, dt, dt_bias, options, handle, seq_idx)


def ssd(x, dt, A, B, C, D=None, initial_states=None, z=None, dt_bias=None, *, chunk_size, comm,
        dt_softplus=False, dt_limit=(0.0, math.inf), return_final_states=False, seq_idx=None,
        cu_seqlens=None, return_varlen_states=False, check_finite=False):
    """This rank's steps of kdnn.ssd on a sequence split across `comm`:
    x [B, L_r, H, P], dt [B, L_r, H], B and C [B, L_r, G, N], z [B, L_r, H, P];
    A [H], D [H] or [H, P] and dt_bias [H] the same on every rank;
    initial_states [B, H, P, N] the sequence's, given on rank 0 only (None
    elsewhere). dt_bias, dt_softplus, dt_limit, z and check_finite as in
    kdnn.ssd. Chunks
    of chunk_size steps are counted from the sequence's start, as on one
    rank. With return_final_states, also the state after this rank's steps
    (the last rank's: the sequence's). seq_idx [B, L_r]: packed sequences as
    in kdnn.ssd, given on every rank or on none; where a rank's first step
    starts a sequence, the state from the ranks before does not enter it.
    With return_varlen_states (B = 1, seq_idx given), cu_seqlens [S_r + 1]
    are this rank's offsets: 0, where each sequence starts inside its
    steps, then L_r; the states [S_r, H, P, N] after each of those
    segments' last step are returned last: the final state of every
    sequence that ends on this rank, wherever it started (and, for its last
    segment, the state at the rank's end)."""
    handle = _handle(comm)

    def checks():
        *tensors, options = ssd_operands("cp.ssd", x, dt, A, B, C, D, initial_states, z,
                                         dt_bias, chunk_size, dt_softplus, dt_limit,
                                         check_finite, steps="L_r")
        final = flag("cp.ssd", "return_final_states", return_final_states)
        offsets = varlen_offsets("cp.ssd", cu_seqlens, return_varlen_states, tensors[0].device)
        ids = None if seq_idx is None else int32_array("cp.ssd", "seq_idx", seq_idx,
                                                       list(tensors[0].shape[:2]),
                                                       tensors[0].device)
        return tensors, options, final, offsets, ids

    tensors, options, return_final_states, cu_seqlens, seq_idx = _collective(handle, checks)
    y, final, states = _Ssd.apply(*tensors, options, handle, seq_idx, cu_seqlens)
    return ssd_outputs(y, final, states, return_final_states, cu_seqlens is not None)
