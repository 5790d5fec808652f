# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Mamba-2's sequence-mixing operators, differentiable: kdnn.causal_conv1d
(+ SiLU), kdnn.dt_softplus and kdnn.ssd (the chunked SSD scan).

The conv and the dt softplus take bfloat16 and float16 activations (x, the
states, dt) beside float32 and float64, computing in float32; their
parameters (weight, bias, dt_bias) are float32 or of the activations'
dtype, and their gradients float32, as mamba's mixed-precision training
keeps them."""
import math

import torch

from . import _kdnn
from ._options import Options
from ._tensors import (STORAGE, Operands, compute_dtype, contiguous, empty_in_order_of,
                       first_order, flag, int32_array, finite_parameter, int32_vector, integer,
                       number, offsets, require, stream_of, writable)

ACTIVATIONS = (None, "silu", "swish")


def conv_silu(op, weight, activation):
    """Whether the conv of operator `op` applies SiLU, after checking the
    activation and weight's width K >= 1."""
    require(activation in ACTIVATIONS,
            f"{op}: activation={activation!r}, expected one of {ACTIVATIONS}")
    require(weight.shape[1] >= 1, f"{op}: weight has shape {list(weight.shape)}, expected K >= 1 [C, K]")
    return activation is not None


def dt_limits(op, dt_limit):
    """(low, high) of dt_limit as floats, checked for operator `op`."""
    require(isinstance(dt_limit, (tuple, list)) and len(dt_limit) == 2,
            f"{op}: dt_limit={dt_limit!r}, expected (low, high)")
    lo, hi = (number(op, "dt_limit", v) for v in dt_limit)
    require(not math.isnan(lo) and not math.isnan(hi) and lo <= hi,
            f"{op}: dt_limit={tuple(dt_limit)!r}, expected (low, high) with low <= high")
    return lo, hi


def _new(t, like):
    """An uninitialised tensor like `like`, or None when `t` is None."""
    return None if t is None else torch.empty_like(like)


def conv_options(silu, check_finite):
    """The CausalConv1dOptions record of checked values."""
    return Options("CausalConv1dOptions", silu=silu, check_finite=check_finite)


def dt_options(dt_limit, check_finite):
    """The DtSoftplusOptions record of checked values (dt_limit: (low, high),
    from dt_limits)."""
    return Options("DtSoftplusOptions", dt_min=dt_limit[0], dt_max=dt_limit[1],
                   check_finite=check_finite)


class _CausalConv1d(torch.autograd.Function):
    """options: the CausalConv1dOptions record."""

    @staticmethod
    def forward(ctx, x, weight, bias, initial_state, seq_idx, options):
        B, _, C = x.shape
        y = empty_in_order_of(x, x.shape, last_inner=False)  # x's memory order: no copy
        final = x.new_empty(B, weight.shape[1] - 1, C)
        _kdnn.causal_conv1d_forward(x, weight, bias, initial_state, y, final, seq_idx,
                                    options.bound(), stream_of(x))
        ctx.save_for_backward(x, weight, bias, initial_state, seq_idx)
        ctx.options = options
        ctx.set_materialize_grads(False)
        return y, final

    @staticmethod
    @first_order("causal_conv1d")
    def backward(ctx, dy, dfinal):
        x, weight, bias, init, seq_idx = ctx.saved_tensors
        # dy of any strides (an expanded one included) is read as it is.
        dy = torch.zeros_like(x) if dy is None else dy.resolve_neg()
        dx, dw = empty_in_order_of(x, x.shape, last_inner=False), torch.empty_like(weight)
        dbias, dinit = _new(bias, bias), _new(init, init)
        _kdnn.causal_conv1d_backward(x, weight, bias, init, dy, contiguous(dfinal), dx, dw, dbias,
                                     dinit, seq_idx, ctx.options.bound(), stream_of(x))
        return dx, dw, dbias, dinit, None, None, None


def causal_conv1d(x, weight, bias=None, initial_state=None, *, activation=None,
                  return_final_states=False, seq_idx=None, check_finite=False):
    """Mamba's causal depthwise conv1d, channel-last:
    y[b, t, c] = act(bias[c] + sum_k weight[c, k] * x[b, t - K + 1 + k, c]),
    the K - 1 steps before t = 0 taken from initial_state (zeros if None).

    x [B, L, C], weight [C, K], bias [C], initial_state [B, K - 1, C];
    activation None or "silu" ("swish"). x and initial_state float32,
    float64, bfloat16 or float16, one dtype; weight and bias of x's dtype or
    (16-bit x) float32, their gradients float32. Returns y [B, L, C], and with
    return_final_states also the last K - 1 inputs [B, K - 1, C] (the next
    call's initial_state). x of any strides is read in place (e.g. the
    transpose(1, 2) of a contiguous [B, C, L] tensor, causal-conv1d's
    layout), and y and x's gradient are laid out in x's dimension order.

    Packed sequences: seq_idx [B, L] (integers) gives each step's sequence;
    a step's window reads only the steps of its own sequence (equal ids),
    forward and backward, as if each sequence were convolved alone. The
    initial_state continues step 0's sequence; the final states keep only
    the last step's sequence (zeros for the steps of others).

    check_finite: refuse a NaN or an infinity in x, weight, bias,
    initial_state (and the incoming gradients), naming the first; without
    it they propagate, as in PyTorch (docs/api.md).
    """
    check = Operands("causal_conv1d", STORAGE)
    x = check(x, "x", 3, "[B, L, C]", strides="any")
    weight = check(weight, "weight", 2, "[C, K]", parameter=True)
    bias = check(bias, "bias", 1, "[C]", optional=True, parameter=True)
    initial_state = check(initial_state, "initial_state", 3, "[B, K-1, C]", optional=True)
    silu = conv_silu("causal_conv1d", weight, activation)
    return_final_states = flag("causal_conv1d", "return_final_states", return_final_states)
    if seq_idx is not None:
        seq_idx = int32_array("causal_conv1d", "seq_idx", seq_idx, list(x.shape[:2]), x.device)
    check_finite = flag("causal_conv1d", "check_finite", check_finite)
    y, final = _CausalConv1d.apply(x, weight, bias, initial_state, seq_idx,
                                   conv_options(silu, check_finite))
    return (y, final) if return_final_states else y


def causal_conv1d_update(x, conv_state, weight, bias=None, *, activation=None,
                         cache_seqlens=None, conv_state_indices=None, check_finite=False):
    """One decoding step (or a few) of causal_conv1d on a rolling state, as
    causal-conv1d's causal_conv1d_update: with x̄ the state followed by x's
    steps, y[b, c, t] = act(bias[c] + sum_k weight[c, k] * x̄[b, c, W + t - K + 1 + k]),
    and the state becomes x̄'s last W steps.

    x [B, C] or [B, C, Lnew] (channel first), conv_state [B, C, W] with
    W >= K - 1 (updated in place), weight [C, K], bias [C]; activation None
    or "silu" ("swish"); dtypes as causal_conv1d's (the state x's). Returns y of x's shape. For serving, as the peer's:
    conv_state_indices [B] (distinct rows of a conv_state [Bs, C, W]): batch
    entry b uses state row conv_state_indices[b]; cache_seqlens [B] (>= 0):
    the state is a circular buffer, x̄ is the K - 1 steps before slot
    p = cache_seqlens[b] (mod W) and step t is written to slot (p + t) mod W
    (the caller advances p). Both are integer vectors, checked on the host.
    For inference: inputs that require grad are refused while grad mode is
    on (kdnn has no backward for it), and the state is left as it was when a
    check fails. check_finite: refuse a NaN or an infinity in x, conv_state,
    weight or bias, naming the first (docs/api.md).
    """
    op = "causal_conv1d_update"
    check = Operands(op, STORAGE)
    x_in = x
    x = check(x, "x", -2, "[B, C] or [B, C, Lnew]")
    require(x.dim() <= 3, f"{op}: x has shape {list(x.shape)}, expected [B, C] or [B, C, Lnew]")
    state = check(conv_state, "conv_state", 3, "[B, C, W]")
    writable(op, "conv_state", conv_state)
    weight = check(weight, "weight", 2, "[C, K]", parameter=True)
    bias = check(bias, "bias", 1, "[C]", optional=True, parameter=True)
    silu = conv_silu(op, weight, activation)
    check_finite = flag(op, "check_finite", check_finite)
    if torch.is_grad_enabled():
        for name, t in (("x", x_in), ("conv_state", conv_state), ("weight", weight), ("bias", bias)):
            require(t is None or not t.requires_grad,
                    f"{op}: {name} requires grad; the decoding step has no backward (run it "
                    "under torch.no_grad() or detach the inputs)")
    steps = x if x.dim() == 3 else x.unsqueeze(-1)
    B = steps.shape[0]
    rows = None if conv_state_indices is None else int32_vector(
        op, "conv_state_indices", conv_state_indices, B, x.device)
    positions = None if cache_seqlens is None else int32_vector(
        op, "cache_seqlens", cache_seqlens, B, x.device)
    y = torch.empty_like(steps)
    # The update writes the state in place: into the caller's tensor, or
    # into a contiguous copy of it that is copied back.
    _kdnn.causal_conv1d_update(steps, state, weight, bias, y, rows, positions,
                               conv_options(silu, check_finite).bound(), stream_of(x))
    if state.data_ptr() != conv_state.data_ptr():
        conv_state.copy_(state)
    return y if x.dim() == 3 else y.squeeze(-1)


class _DtSoftplus(torch.autograd.Function):
    """options: the DtSoftplusOptions record."""

    @staticmethod
    def forward(ctx, dt, dt_bias, options):
        out = torch.empty_like(dt, dtype=compute_dtype(dt.dtype))
        _kdnn.dt_softplus_forward(dt, dt_bias, out, options.bound(), stream_of(dt))
        ctx.save_for_backward(dt, dt_bias)
        ctx.options = options
        return out

    @staticmethod
    @first_order("dt_softplus")
    def backward(ctx, dout):
        dt, dt_bias = ctx.saved_tensors
        ddt, dbias = torch.empty_like(dt), torch.empty_like(dt_bias)
        _kdnn.dt_softplus_backward(dt, dt_bias, dout.contiguous(), ddt, dbias, ctx.options.bound(),
                                   stream_of(dt))
        return ddt, dbias, None


def dt_softplus(dt, dt_bias, *, dt_limit=(0.0, math.inf), check_finite=False):
    """Mamba-2's step sizes: clamp(softplus(dt + dt_bias), *dt_limit)
    (softplus linear above 20, as PyTorch). dt [B, L, H], dt_bias [H]
    (finite: a parameter, always checked). dt float32, float64, bfloat16 or
    float16; dt_bias of dt's dtype or (16-bit dt) float32; the result and
    dt_bias's gradient in float32 for a 16-bit dt (as mamba keeps the step
    sizes), dt's gradient in dt's dtype. check_finite: refuse a NaN or an
    infinity in dt (and the incoming gradient) too (docs/api.md)."""
    check = Operands("dt_softplus", STORAGE)
    dt = check(dt, "dt", 3, "[B, L, H]")
    dt_bias = finite_parameter("dt_softplus", "dt_bias",
                               check(dt_bias, "dt_bias", 1, "[H]", parameter=True))
    options = dt_options(dt_limits("dt_softplus", dt_limit),
                         flag("dt_softplus", "check_finite", check_finite))
    return _DtSoftplus.apply(dt, dt_bias, options)


class _Ssd(torch.autograd.Function):
    """The SSD on one rank (comm None) or, with comm = (layout, handle): over
    the communicator with that Fortran handle, on this rank's steps of the
    SequenceLayout (None: the ranks' steps in rank order; kdnn.cp.ssd). options: the SsdOptions
    record; seq_idx: packed sequences (this rank's steps under comm);
    cu_seqlens: their offsets (under comm, within this rank's steps), for
    the state after each one's last step (the third output, None without
    them; it has no gradient, as mamba's varlen states)."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, D, initial_states, dt_bias, z, options, comm, seq_idx=None,
                cu_seqlens=None):
        b, _, h, p = x.shape
        y = torch.empty_like(x)
        final = x.new_empty(b, h, p, B.shape[-1])
        ungated = None if z is None else torch.empty_like(x)  # spares the backward a forward
        states = None
        if cu_seqlens is not None:
            states = x.new_empty(cu_seqlens.shape[0] - 1, h, p, B.shape[-1])
        tensors = (x, dt, A, B, C, D, initial_states, dt_bias, z, y, final, ungated, seq_idx,
                   cu_seqlens, states)
        if comm is None:
            _kdnn.ssd_forward(*tensors, options.bound(), stream_of(x))
        else:
            _kdnn.cp_ssd_forward(*tensors, options.bound(), *comm, stream_of(x))
        ctx.save_for_backward(x, dt, A, B, C, D, initial_states, dt_bias, z, ungated, seq_idx)
        ctx.options, ctx.comm = options, comm
        ctx.set_materialize_grads(False)
        if states is not None:
            ctx.mark_non_differentiable(states)
        return y, final, states

    @staticmethod
    @first_order("ssd")
    def backward(ctx, dy, dfinal, _dstates=None):
        x, dt, A, B, C, D, init, dt_bias, z, ungated, seq_idx = ctx.saved_tensors
        dy = torch.zeros_like(x) if dy is None else dy.contiguous()
        dx, ddt, dA = torch.empty_like(x), torch.empty_like(dt), torch.empty_like(A)
        dB, dC = torch.empty_like(B), torch.empty_like(C)
        dD, dinit = _new(D, D), _new(init, init)
        ddt_bias, dz = _new(dt_bias, dt_bias), _new(z, z)
        tensors = (x, dt, A, B, C, D, init, dt_bias, z, ungated, dy, contiguous(dfinal), dx, ddt,
                   dA, dB, dC, dD, dinit, ddt_bias, dz, seq_idx)
        if ctx.comm is None:
            _kdnn.ssd_backward(*tensors, ctx.options.bound(), stream_of(x))
        else:
            _kdnn.cp_ssd_backward(*tensors, ctx.options.bound(), *ctx.comm, stream_of(x))
        return dx, ddt, dA, dB, dC, dD, dinit, ddt_bias, dz, None, None, None, None


def ssd_operands(op, x, dt, A, B, C, D, initial_states, z, dt_bias, chunk_size, dt_softplus,
                 dt_limit, check_finite, steps="L"):
    """The SSD's arguments checked (the tensors made contiguous) for
    operator `op`: its tensors in _Ssd's order, then the SsdOptions record;
    `steps` names the sequence dimension in messages."""
    check = Operands(op)
    x = check(x, "x", 4, f"[B, {steps}, H, P]")
    dt = check(dt, "dt", 3, f"[B, {steps}, H]")
    A = check(A, "A", 1, "[H]")
    B = check(B, "B", 4, f"[B, {steps}, G, N]")
    C = check(C, "C", 4, f"[B, {steps}, G, N]")
    D = check(D, "D", -1, "[H] or [H, P]", optional=True)
    if D is not None:
        H, P = x.shape[2], x.shape[3]
        require(list(D.shape) in ([H], [H, P]),
                f"{op}: D has shape {list(D.shape)}, expected [H] = [{H}] or [H, P] = [{H}, {P}] "
                "(from x)")
        D = D.reshape(-1)  # [H·P] per channel: kdnn's flat form (a view; its gradient flows back)
    initial_states = check(initial_states, "initial_states", 4, "[B, H, P, N]", optional=True)
    if initial_states is not None:  # checked here, so that errors name it as the caller does
        want = [x.shape[0], x.shape[2], x.shape[3], B.shape[3]]
        require(list(initial_states.shape) == want,
                f"{op}: initial_states has shape {list(initial_states.shape)}, expected "
                f"[B, H, P, N] = {want} (from x and B)")
    dt_bias = check(dt_bias, "dt_bias", 1, "[H]", optional=True)
    z = check(z, "z", 4, f"[B, {steps}, H, P]", optional=True)
    chunk_size = integer(op, "chunk_size", chunk_size, 1, 2**31 - 1)
    dt_softplus = flag(op, "dt_softplus", dt_softplus)
    dt_min, dt_max = dt_limits(op, dt_limit)
    check_finite = flag(op, "check_finite", check_finite)
    # The Python API always checks the parameters (A finite and <= 0, D and
    # dt_bias finite) and dt >= 0 (after the transform when there is one);
    # the data's finiteness with check_finite (docs/api.md).
    options = Options("SsdOptions", chunk=chunk_size, check_parameters=True, check_dt=True,
                      dt_softplus=dt_softplus, dt_min=dt_min, dt_max=dt_max,
                      check_finite=check_finite)
    return x, dt, A, B, C, D, initial_states, dt_bias, z, options


def ssd(x, dt, A, B, C, D=None, initial_states=None, z=None, dt_bias=None, *, chunk_size,
        dt_softplus=False, dt_limit=(0.0, math.inf), return_final_states=False, seq_idx=None,
        cu_seqlens=None, return_varlen_states=False, check_finite=False):
    """Mamba-2's SSD scan, with the arguments of mamba's
    mamba_chunk_scan_combined:
        h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T,   y_t = h_t C_t + D x_t,
    computed by chunks of chunk_size steps (L need not be a multiple).

    x [B, L, H, P], dt [B, L, H], A [H] (<= 0), B and C [B, L, G, N] (G
    divides H; head h reads group h // (H // G)), D [H] or [H, P] (per
    channel, as mamba's D of shape (nheads, headdim)), initial_states
    [B, H, P, N]. Returns y [B, L, H, P], and with return_final_states also
    the final state [B, H, P, N].

    As mamba, inside the call: with dt_bias [H], dt_softplus or a dt_limit
    other than (0, inf), the step sizes are clamp(f(dt + dt_bias), *dt_limit)
    with f softplus (dt_softplus) or the identity; with z [B, L, H, P], the
    output is y * silu(z). Without the transform, dt is the step sizes. The
    step sizes must be >= 0, A finite and <= 0, D and dt_bias finite: a bad
    value is a kdnn.Error naming the first one. check_finite: refuse a NaN
    or an infinity in any input (and the incoming gradients) too; without
    it they propagate, as in PyTorch (docs/api.md).

    Packed sequences: seq_idx [B, L] (integers), each step's sequence; a
    step whose id differs from the previous step's starts a sequence, where
    the state is reset (no decay crosses it, exactly), so that each sequence
    is scanned as if alone. initial_states continue step 0's sequence; the
    final state is the last sequence's. Copied at the call.

    Each sequence's final state (mamba's varlen states): with B = 1,
    return_varlen_states=True and cu_seqlens [S + 1] (integers: 0, the
    offsets where each sequence starts along L, then L; seq_idx given too,
    its id changing exactly there), the states [S, H, P, N] after each
    sequence's last step (0 for an empty sequence), returned last. They have
    no gradient (as mamba's).
    """
    *tensors, options = ssd_operands("ssd", x, dt, A, B, C, D, initial_states, z, dt_bias,
                                     chunk_size, dt_softplus, dt_limit, check_finite)
    return_final_states = flag("ssd", "return_final_states", return_final_states)
    cu_seqlens = varlen_offsets("ssd", cu_seqlens, return_varlen_states, x.device)
    if seq_idx is not None:
        seq_idx = int32_array("ssd", "seq_idx", seq_idx, list(x.shape[:2]), x.device)
    y, final, states = _Ssd.apply(*tensors, options, None, seq_idx, cu_seqlens)
    return ssd_outputs(y, final, states, return_final_states, cu_seqlens is not None)


def varlen_offsets(op, cu_seqlens, return_varlen_states, device):
    """cu_seqlens as the int32 offsets the SSD reads, with
    return_varlen_states (a bool) only; None without."""
    if flag(op, "return_varlen_states", return_varlen_states):
        require(cu_seqlens is not None,
                f"{op}: return_varlen_states=True without cu_seqlens, expected the sequences' "
                "offsets cu_seqlens [S + 1]")
        return offsets(op, "cu_seqlens", cu_seqlens, device)
    require(cu_seqlens is None,
            f"{op}: cu_seqlens is given with return_varlen_states=False, expected it only with "
            "return_varlen_states=True (seq_idx packs the sequences; cu_seqlens says where their "
            "states are read)")
    return None


def ssd_outputs(y, final, states, return_final_states, return_varlen_states):
    """y, then the final state and the sequences' states where asked for."""
    out = [y] + ([final] if return_final_states else []) + (
        [states] if return_varlen_states else [])
    return tuple(out) if len(out) > 1 else y
