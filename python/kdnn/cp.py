# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.cp: context parallelism. Mamba-2's conv1d + dt softplus and SSD and
the fused attention with the sequence split across the ranks of an MPI
communicator (mpi4py), differentiable; one SequenceLayout for them all.

Each rank passes its own steps and gets its own steps of the result, equal
to the single-rank operators' on the whole sequence. Which steps a rank
holds is a SequenceLayout: SequenceLayout.contiguous(lengths) (rank 0 the
first steps; any lengths, ranks with none included; the default, from each
rank's length) or SequenceLayout.load_balanced(S, ranks) (2R chunks, rank r
holding chunks r and 2R - 1 - r, so that causal attention costs every rank
the same); a rank's tensors hold its segments one after another. shard()
and gather() move a whole sequence to and from the ranks. The conv's halo
steps, the SSD's states and attention's keys and values travel between the
ranks inside the calls, in the forward and in the backward. Gradients:
those of a rank's inputs are the gradients of the sum of every rank's loss
(what the single-rank backward gives for those steps); those of the
parameters (weight, bias, dt_bias, A, D, sinks) are this rank's partial
sums: add them over the communicator (e.g. comm.Allreduce), as for data
parallelism. Every call is collective: all ranks call it, in the same
order. Needs kdnn built with MPI (kdnn.cp.available).
"""
import math

import torch

from . import _kdnn
from ._options import Options
from ._tensors import (Error, Operands, dropout_options, empty_in_order_of, finite_parameter,
                       first_order, flag, int32_array, integer, rows_contiguous, stream_of)
from .attention import _alibi_slopes, _band, _forward_options, _options, _score_options, _sinks
from .mamba2 import (_Ssd, conv_options, conv_silu, dt_limits, dt_options, ssd_operands,
                     ssd_outputs, varlen_offsets)

available = _kdnn.has_cp
SequenceLayout = _kdnn.SequenceLayout if available else None


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


def _layout(op, layout, comm, steps, default=True):
    """The SequenceLayout of a call, agreed by every rank (one allgather,
    which every rank makes, so that a layout given on some ranks only, or
    not a SequenceLayout, is the same kdnn.Error on every rank): `layout`,
    or (None) the contiguous one of every rank's `steps` (with default
    False: None)."""
    state = ("none" if layout is None else "given" if isinstance(layout, SequenceLayout)
             else type(layout).__name__)
    ranks = comm.allgather((steps, state))
    for r, (_, s) in enumerate(ranks):
        if s not in ("none", "given"):
            raise Error(f"{op}: layout is a {s} on rank {r}, expected a kdnn.cp.SequenceLayout "
                        "or None")
        if s != ranks[0][1]:
            raise Error(f"{op}: layout is {'None' if s == 'none' else 'given'} on rank {r} and "
                        f"{'None' if ranks[0][1] == 'none' else 'given'} on rank 0, expected the "
                        "same on every rank")
    if layout is not None or not default:
        return layout
    bad = [r for r, (n, _) in enumerate(ranks) if not isinstance(n, int) or n < 0]
    if bad:
        raise Error(f"{op}: rank {bad[0]} has no sequence steps to lay out (its arguments are "
                    "wrong), expected every rank's tensors")
    return SequenceLayout.contiguous([n for n, _ in ranks])


def _steps(x, dim):
    """x's length along `dim` (-1 when x is not a tensor of that many
    dimensions): what a rank contributes to the default layout."""
    return int(x.shape[dim]) if isinstance(x, torch.Tensor) and x.dim() > dim else -1


def shard(x, *, layout, rank, dim=1):
    """Rank `rank`'s steps of a whole sequence x (its length along `dim` is
    the layout's): its segments one after another along `dim`, as the
    kdnn.cp functions take them. Differentiable (a torch indexing)."""
    if not isinstance(layout, SequenceLayout):
        raise Error(f"cp.shard: layout is a {type(layout).__name__}, expected a "
                    "kdnn.cp.SequenceLayout")
    if not isinstance(x, torch.Tensor) or not -x.dim() <= dim < x.dim():
        raise Error(f"cp.shard: x must be a tensor with a dimension {dim}")
    if x.shape[dim] != layout.length:
        raise Error(f"cp.shard: x has {x.shape[dim]} steps along dimension {dim}, expected "
                    f"the layout's {layout.length}")
    parts = [x.narrow(dim, b, e - b) for b, e in layout.segments(rank)]
    return torch.cat(parts, dim) if len(parts) > 1 else parts[0]


def gather(x, *, comm, layout=None, dim=1):
    """The whole sequence from every rank's steps x (its segments of
    `layout` along `dim`; None: the ranks' steps in rank order): the same
    tensor on every rank. Collective; not differentiable."""
    handle = _handle(comm)
    layout = _layout("cp.gather", layout, comm, _steps(x, dim))

    def checks():
        if not isinstance(x, torch.Tensor) or not -x.dim() <= dim < x.dim():
            raise Error(f"cp.gather: x must be a tensor with a dimension {dim}")
        return Operands("cp.gather")(x.detach().movedim(dim, 0), "x", x.dim(), "any")

    local = _collective(handle, checks)
    steps, rest = local.shape[0], local.shape[1:]
    whole = local.new_empty((1, layout.length, math.prod(rest)))
    _kdnn.cp_gather(local.reshape(1, steps, math.prod(rest)), whole, layout, handle,
                    stream_of(local))
    return whole.reshape((layout.length,) + tuple(rest)).movedim(0, dim)


class _ConvDt(torch.autograd.Function):
    """options: the ConvDtOptions record; comm: (layout, the communicator's
    Fortran handle), layout None for the ranks' steps in rank order."""

    @staticmethod
    def forward(ctx, x, weight, bias, dt, dt_bias, options, comm, seq_idx):
        B, _, C = x.shape
        y, dt_out = torch.empty_like(x), torch.empty_like(dt)
        layout, handle = comm
        segments = 1 if layout is None else len(layout.segments(_rank(handle)))
        # the K - 1 steps before each of this rank's segments
        halo = x.new_empty(B, segments * (weight.shape[1] - 1), C)
        _kdnn.cp_conv_dt_forward(x, weight, bias, dt, dt_bias, y, halo, dt_out, seq_idx,
                                 options.bound(), *comm, stream_of(x))
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
                                  ctx.options.bound(), *ctx.comm, stream_of(x))
        return dx, dw, dbias, ddt, ddt_bias, None, None, None


def conv_dt(x, weight, dt, dt_bias, bias=None, *, comm, layout=None, activation="silu",
            dt_limit=(0.0, math.inf), seq_idx=None, check_finite=False):
    """This rank's steps of kdnn.causal_conv1d(x, weight, bias, activation,
    seq_idx) and kdnn.dt_softplus(dt, dt_bias, dt_limit) on a sequence split
    across `comm` by `layout` (a SequenceLayout; None: the ranks' steps in
    rank order): x [B, L_r, C], weight [C, K], dt [B, L_r, H], dt_bias [H],
    seq_idx [B, L_r] (packed sequences, given on every rank or on none).
    Each of a rank's segments takes its K - 1 steps of history from the rank
    that holds them. check_finite as theirs. Returns (y [B, L_r, C],
    dt_out [B, L_r, H])."""
    handle = _handle(comm)
    layout = _layout("cp.conv_dt", layout, comm, _steps(x, 1), default=False)

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
    return _ConvDt.apply(x, weight, bias, dt, dt_bias, options, (layout, handle), seq_idx)


def ssd(x, dt, A, B, C, D=None, initial_states=None, z=None, dt_bias=None, *, chunk_size, comm,
        layout=None, dt_softplus=False, dt_limit=(0.0, math.inf), return_final_states=False, seq_idx=None,
        cu_seqlens=None, return_varlen_states=False, check_finite=False):
    """This rank's steps of kdnn.ssd on a sequence split across `comm` by
    `layout` (a SequenceLayout; None: the ranks' steps in rank order; the
    states of each segment pass to the next in sequence order, whichever
    rank holds it): x [B, L_r, H, P], dt [B, L_r, H], B and C [B, L_r, G, N], z [B, L_r, H, P];
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
    segment, the state at the rank's end); not on a rank that holds more
    than one segment."""
    handle = _handle(comm)
    layout = _layout("cp.ssd", layout, comm, _steps(x, 1), default=False)

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
    y, final, states = _Ssd.apply(*tensors, options, (layout, handle), seq_idx, cu_seqlens)
    return ssd_outputs(y, final, states, return_final_states, cu_seqlens is not None)


def _rank(handle):
    """This rank's number in the communicator of Fortran handle `handle`."""
    from mpi4py import MPI
    return MPI.Comm.f2py(handle).Get_rank()


_COMM_TYPES = {"ring": 0, "all_gather": 1, "all_to_all": 2, "all_to_all_ring": 3}


class _CpFlashAttention(torch.autograd.Function):
    """kdnn.flash_attention's function over the ranks: call is (layout,
    comm_type, gather_kv_heads, heads_comm handle, cu_seqlens, comm
    handle), as _kdnn.cp_flash_attention_forward takes them."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, options, mask, call):
        B, H, L, _ = q.shape
        o = empty_in_order_of(q, (B, H, L, v.shape[-1]))
        lse = q.new_empty(B, H, L)
        _kdnn.cp_flash_attention_forward(q, k, v, o, lse, sinks, _forward_options(options),
                                         mask.bound(), *call, stream_of(q))
        ctx.save_for_backward(q, k, v, o, lse, sinks)
        ctx.options, ctx.mask, ctx.call = options, mask, call
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @first_order("cp.flash_attention")
    def backward(ctx, do, _):
        q, k, v, o, lse, sinks = ctx.saved_tensors
        dq, dk, dv = (empty_in_order_of(t, t.shape) for t in (q, k, v))
        dsinks = torch.empty_like(sinks) if ctx.needs_input_grad[3] else None
        _kdnn.cp_flash_attention_backward(q, k, v, o, lse, rows_contiguous(do), dq, dk, dv, sinks,
                                          dsinks, ctx.options.bound(), ctx.mask.bound(),
                                          *ctx.call, stream_of(q))
        return dq, dk, dv, dsinks, None, None, None


def flash_attention(q, k, v, *, comm, comm_type="ring", layout=None, heads_comm=None,
                    gather_kv_heads=0, cu_seqlens=None, causal=False, band=None, scale=None,
                    softcap=0.0, alibi_slopes=None, sinks=None, dropout_p=0.0, seed=None,
                    offset=0, allow_tf32=False, return_lse=False, check_finite=False):
    """This rank's rows of kdnn.flash_attention over a sequence split across
    `comm` by `layout` (a SequenceLayout; None: the ranks' steps in rank
    order): q [B, H, L_r, D], k [B, Hkv, L_r, D], v [B, Hkv, L_r, Dv], each
    rank's steps; returns [B, H, L_r, Dv] (and lse [B, H, L_r] with
    return_lse), equal to the single-rank call's rows at those steps.

    comm_type: "ring" (K/V blocks around the ranks, overlapped with the
    compute; blocks the causal mask or the band hide are skipped),
    "all_gather" (K/V gathered gather_kv_heads heads at a time, 0:
    ceil(Hkv / R); for sliding windows), "all_to_all" (DeepSpeed-Ulysses:
    heads scattered, the sequence gathered; any head counts) or
    "all_to_all_ring" (all_to_all inside the groups of heads_comm, an
    mpi4py split of comm into groups of one size, and a ring across them).
    cu_seqlens: packed sequences over the whole sequence (B = 1), N + 1
    offsets (a list or an integer tensor, the same on every rank): a query
    sees only its own sequence's keys, as kdnn.flash_attention_varlen.
    causal (top-left), band (bottom-right, flash-attn's window), scale,
    softcap, alibi_slopes ([H], [B, H], or [N, H] with cu_seqlens), sinks,
    dropout, allow_tf32 and check_finite as kdnn.flash_attention, in the
    whole sequence's positions; seed=None takes rank 0's draw from its
    generator. Per-query windows are not taken.
    """
    op = "cp.flash_attention"
    handle = _handle(comm)
    layout = _layout(op, layout, comm, _steps(q, 2))
    draw = comm.Get_rank() == 0 and seed is None and _positive(dropout_p)
    drawn = comm.bcast(int(torch.randint(0, 2**62, (), dtype=torch.int64)) if draw else 0, root=0)

    def checks():
        check = Operands(op)
        checked = [check(q, "q", 4, "[B, H, L_r, D]", strides="rows"),
                   check(k, "k", 4, "[B, Hkv, L_r, D]", strides="rows"),
                   check(v, "v", 4, "[B, Hkv, L_r, Dv]", strides="rows")]
        if comm_type not in _COMM_TYPES:
            raise Error(f"{op}: comm_type={comm_type!r}, expected one of "
                        f"{', '.join(map(repr, _COMM_TYPES))}")
        heads = None if heads_comm is None else _handle(heads_comm)
        kv_heads = integer(op, "gather_kv_heads", gather_kv_heads, 0, 2**31 - 1)
        cu = None if cu_seqlens is None else _host_offsets(op, cu_seqlens)
        is_causal = flag(op, "causal", causal)
        bounds = _band(op, band)
        scaling = _score_options(op, scale, softcap, checked[0].shape[-1])
        dropout = dropout_options(op, dropout_p, drawn if seed is None else seed, offset)
        tf32 = flag(op, "allow_tf32", allow_tf32)
        lse = flag(op, "return_lse", return_lse)
        batch = checked[0].shape[0] if cu is None else max(len(cu) - 1, 1)
        slopes = _alibi_slopes(op, alibi_slopes, batch, checked[0].shape[1], checked[0].device)
        finite = flag(op, "check_finite", check_finite)
        sink = _sinks(check, sinks, checked[0].shape[1])
        mask = Options("AttentionMask", causal=is_causal, band_left=bounds[0],
                       band_right=bounds[1], alibi_slopes=slopes)
        options = _options(*scaling, dropout, tf32, finite)
        call = (layout, _COMM_TYPES[comm_type], kv_heads, heads, cu, handle)
        return checked, sink, options, mask, call, lse

    (q, k, v), sinks, options, mask, call, return_lse = _collective(handle, checks)
    o, lse = _CpFlashAttention.apply(q, k, v, sinks, options, mask, call)
    return (o, lse) if return_lse else o


def flash_attention_varlen(q, k, v, cu_seqlens, *, comm, **options):
    """kdnn.cp.flash_attention over packed sequences in flash-attn's varlen
    layout: q [L_r, H, D], k [L_r, Hkv, D], v [L_r, Hkv, Dv], this rank's
    packed steps; cu_seqlens [N + 1] the offsets of the sequences over the
    whole packed sequence (the same on every rank; boundaries anywhere, on
    rank edges included). Returns [L_r, H, Dv] (and lse [H, L_r] with
    return_lse=True). The other options as kdnn.cp.flash_attention's."""
    op = "cp.flash_attention_varlen"
    if "cu_seqlens" in options:
        raise Error(f"{op}: cu_seqlens given twice, expected it positionally")
    heads_first = [t.transpose(0, 1).unsqueeze(0) if isinstance(t, torch.Tensor) and t.dim() == 3
                   else t for t in (q, k, v)]
    out = flash_attention(*heads_first, comm=comm, cu_seqlens=cu_seqlens, **options)
    if isinstance(out, tuple):
        return out[0][0].transpose(0, 1), out[1][0]
    return out[0].transpose(0, 1)


def _positive(p):
    """Whether p is a number above 0 (anything else: the checks report it)."""
    try:
        return float(p) > 0
    except (TypeError, ValueError):
        return False


def _host_offsets(op, cu):
    """cu_seqlens as a list of ints (from a list, tuple or integer tensor)."""
    if isinstance(cu, torch.Tensor):
        if cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64):
            raise Error(f"{op}: cu_seqlens has dtype {cu.dtype} and {cu.dim()} dimensions, "
                        "expected a vector of int32 or int64")
        cu = cu.tolist()
    if not isinstance(cu, (list, tuple)) or not all(isinstance(c, int) for c in cu):
        raise Error(f"{op}: cu_seqlens is a {type(cu).__name__}, expected a list of ints or "
                    "an integer vector")
    return list(cu)
