# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.compat.causal_conv1d against causal-conv1d's semantics: its
reference formulations (causal_conv1d_ref, causal_conv1d_update_ref),
written here in PyTorch from the peer's documentation, both memory layouts
of x, initial and final states, gradients, the decoding step, and the
options kdnn does not have; and the peer's own test cases at its native
dtypes (float16 and bfloat16 activations, float32 weights) with its
tolerances."""
import pytest
import torch
import torch.nn.functional as F
from common import DTYPES, TOLERANCE, assert_matches

import kdnn
from kdnn.compat.causal_conv1d import causal_conv1d_fn, causal_conv1d_update


def conv_ref(x, weight, bias=None, initial_states=None, return_final_states=False,
             activation=None):
    """x (batch, dim, seqlen) -> out (batch, dim, seqlen) [, final states]."""
    seqlen = x.shape[-1]
    dim, width = weight.shape
    if initial_states is None:
        out = F.conv1d(x, weight.unsqueeze(1), bias, padding=width - 1, groups=dim)
    else:
        x = torch.cat([initial_states, x], dim=-1)
        out = F.conv1d(x, weight.unsqueeze(1), bias, padding=0, groups=dim)
    out = out[..., :seqlen]
    out = out if activation is None else F.silu(out)
    if not return_final_states:
        return out
    return out, F.pad(x, (width - 1 - x.shape[-1], 0))  # the last width - 1 inputs


def update_ref(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None):
    """One decoding step on a copy of conv_state: (out, the new state).
    cache_seqlens: a circular state, read at the width - 1 slots before
    cache_seqlens % state_len and written from it, in order."""
    squeeze = x.dim() == 2
    x = x.unsqueeze(-1) if squeeze else x
    seqlen, state_len = x.shape[-1], conv_state.shape[-1]
    width = weight.shape[1]
    if cache_seqlens is None:
        x_new = torch.cat([conv_state, x], dim=-1)
        new_state = x_new[..., -state_len:]
    else:
        past = torch.arange(-(width - 1), 0)[None, :] + cache_seqlens[:, None].long()
        past = past.remainder(state_len)[:, None, :].expand(-1, x.shape[1], -1)
        x_new = torch.cat([conv_state.gather(2, past), x], dim=-1)
        new_state = conv_state.clone()
        for t in range(seqlen):  # in order: with seqlen > state_len the later steps stay
            new_state[torch.arange(x.shape[0]), :, (cache_seqlens.long() + t) % state_len] = x[..., t]
    out = F.conv1d(x_new, weight.unsqueeze(1), bias, groups=weight.shape[0])[..., -seqlen:]
    out = out if activation is None else F.silu(out)
    return (out.squeeze(-1) if squeeze else out), new_state


def channel_last(batch, dim, seqlen, **kw):
    """(batch, dim, seqlen) with stride(1) == 1, as Mamba's blocks pass x."""
    return torch.randn(batch, seqlen, dim, **kw).transpose(1, 2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "channel_last"])
@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_fn_matches_the_reference(dtype, layout, width, activation):
    kw = dict(dtype=dtype)
    x = (torch.randn(2, 8, 13, **kw) if layout == "contiguous" else channel_last(2, 8, 13, **kw))
    x.requires_grad_()
    w = torch.randn(8, width, **kw, requires_grad=True)
    b = torch.randn(8, **kw, requires_grad=True)
    out = causal_conv1d_fn(x, w, b, activation=activation)
    assert out.shape == x.shape and out.stride() == x.stride()  # the peer's layout
    assert_matches(out, conv_ref(x, w, b, activation=activation), (x, w, b), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_fn_states(dtype):
    kw = dict(dtype=dtype)
    x = channel_last(2, 6, 3, **kw).requires_grad_()  # seqlen < width - 1: states reach back
    w = torch.randn(6, 5, **kw, requires_grad=True)
    init = channel_last(2, 6, 4, **kw).requires_grad_()
    got = causal_conv1d_fn(x, w, None, None, init, True, None, "swish")
    want = conv_ref(x, w, None, init, True, "silu")
    assert_matches(got, want, (x, w, init), **TOLERANCE[dtype])
    # final_states_out is written and returned
    out = torch.empty(2, 4, 6, **kw).transpose(1, 2)
    _, final = causal_conv1d_fn(x.detach(), w.detach(), initial_states=init.detach(),
                                return_final_states=True, final_states_out=out)
    assert final is out
    torch.testing.assert_close(out, want[1].detach())


@pytest.mark.parametrize("layout", ["contiguous", "channel_last"])
def test_fn_zero_copy_in_both_layouts(copies, layout):
    # Both of the peer's layouts of x are read in place, and the output and
    # x's gradient written in x's layout: no copy either way.
    kw = dict(dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 5, 9, **kw) if layout == "contiguous" else channel_last(
        2, 5, 9, dtype=torch.float64).detach().requires_grad_()  # a leaf, channel-last
    w, b = torch.randn(5, 4, **kw), torch.randn(5, **kw)
    out, final = causal_conv1d_fn(x, w, b, return_final_states=True, activation="silu")
    g = torch.randn(2, 5, 9, dtype=torch.float64)
    out.backward(g)
    assert copies == []
    assert out.stride() == x.stride() and x.grad.stride() == x.stride()
    assert final.stride(1) == 1  # channel-last, as the peer's
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    want = conv_ref(xr, wr, br, activation="silu")
    torch.testing.assert_close(out, want)
    torch.testing.assert_close((x.grad, w.grad, b.grad),
                               torch.autograd.grad(want, (xr, wr, br), g))


def test_fn_gradcheck():
    f64 = dict(dtype=torch.float64, requires_grad=True)
    args = (torch.randn(1, 3, 6, **f64), torch.randn(3, 3, **f64), torch.randn(3, **f64))
    init = torch.randn(1, 2, 3, dtype=torch.float64).transpose(1, 2).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, w, b, s: causal_conv1d_fn(x, w, b, None, s, True, None, "silu"),
        (*args, init))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seqlen", [None, 1, 3])
@pytest.mark.parametrize("state_len", [3, 6])
def test_update_matches_the_reference(dtype, seqlen, state_len):
    kw = dict(dtype=dtype)
    x = torch.randn(2, 5, **kw) if seqlen is None else torch.randn(2, 5, seqlen, **kw)
    state = torch.randn(2, 5, state_len, **kw)
    w, b = torch.randn(5, 4, **kw), torch.randn(5, **kw)
    want, want_state = update_ref(x, state.clone(), w, b, "silu")
    got = causal_conv1d_update(x, state, w, b, "silu")
    torch.testing.assert_close(got, want, **TOLERANCE[dtype])
    torch.testing.assert_close(state, want_state, rtol=0, atol=0)  # updated in place


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seqlen", [None, 2, 7])
def test_update_with_a_circular_state_and_state_indices(dtype, seqlen):
    kw = dict(dtype=dtype)
    x = torch.randn(3, 5, **kw) if seqlen is None else torch.randn(3, 5, seqlen, **kw)
    w, b = torch.randn(5, 4, **kw), torch.randn(5, **kw)
    positions = torch.tensor([0, 9, 4], dtype=torch.int32)
    rows = torch.tensor([5, 0, 2], dtype=torch.int32)
    for cache_seqlens, indices in ((positions, None), (None, rows), (positions, rows)):
        state = torch.randn(6 if indices is not None else 3, 5, 5, **kw)
        picked = state[indices.long()] if indices is not None else state
        want, want_rows = update_ref(x, picked.clone(), w, b, "silu", cache_seqlens)
        want_state = state.clone()
        if indices is not None:
            want_state[indices.long()] = want_rows
        else:
            want_state = want_rows
        got = causal_conv1d_update(x, state, w, b, "silu", cache_seqlens, indices)
        torch.testing.assert_close(got, want, **TOLERANCE[dtype])
        torch.testing.assert_close(state, want_state, rtol=0, atol=0)  # other rows untouched


# The peer's tolerances for 16-bit activations (weights' gradients: rtolw,
# atolw), and its reference: computed in the weights' float32, the outputs
# rounded to the activations' dtype.
PEER_TOLERANCE = {torch.float16: dict(rtol=3e-3, atol=5e-3),
                  torch.bfloat16: dict(rtol=1e-2, atol=5e-2)}
PEER_WEIGHT_TOLERANCE = dict(rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("itype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channel_last", [False, True])
@pytest.mark.parametrize("has_initial_states", [False, True])
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("seqlen", [1, 8, 130])
def test_fn_at_the_peers_native_dtypes(itype, channel_last, has_initial_states, silu, width,
                                       seqlen):
    if not channel_last and has_initial_states:
        pytest.skip("the peer takes initial states channel-last only")
    torch.manual_seed(0)
    batch, dim = 2, 64
    if channel_last:  # a slice of wider rows, as the peer's test
        x = torch.randn(batch, seqlen, dim + 96).to(itype)[:, :, 32:32 + dim].transpose(1, 2)
    else:
        x = torch.randn(batch, dim + 96, seqlen).to(itype)[:, 32:32 + dim, :]
    x.requires_grad_()
    weight = torch.randn(dim, width, requires_grad=True)
    bias = torch.randn(dim, requires_grad=True)
    init = (torch.randn(batch, width - 1, dim).to(itype).transpose(1, 2).requires_grad_()
            if has_initial_states else None)
    refs = [t.detach().clone().requires_grad_() if t is not None else None
            for t in (x, weight, bias, init)]
    activation = "silu" if silu else None
    out, final = causal_conv1d_fn(x, weight, bias, initial_states=init, return_final_states=True,
                                  activation=activation)
    xr, wr, br, ir = refs
    out_ref, final_ref = conv_ref(xr.float(), wr, br, None if ir is None else ir.float(),
                                  return_final_states=True, activation=activation)
    out_ref, final_ref = out_ref.to(itype), final_ref.to(itype)
    tol = PEER_TOLERANCE[itype]
    torch.testing.assert_close(out, out_ref, **tol)
    torch.testing.assert_close(final, final_ref, rtol=0, atol=0)  # copies of inputs
    g = torch.randn_like(out)
    out.backward(g)
    out_ref.backward(g)
    torch.testing.assert_close(x.grad, xr.grad, **tol)
    torch.testing.assert_close(weight.grad, wr.grad, **PEER_WEIGHT_TOLERANCE)
    torch.testing.assert_close(bias.grad, br.grad, **PEER_WEIGHT_TOLERANCE)
    if has_initial_states:
        torch.testing.assert_close(init.grad, ir.grad, **tol)


@pytest.mark.parametrize("itype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("has_cache_seqlens", [False, True])
@pytest.mark.parametrize("seqlen", [1, 4, 5])
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("has_bias", [False, True])
def test_update_at_the_peers_native_dtypes(itype, has_cache_seqlens, seqlen, width, has_bias):
    torch.manual_seed(0)
    batch, dim = 16, 2048 + 16
    x = torch.randn(batch, seqlen, dim).to(itype).transpose(-1, -2)
    state_len = int(torch.randint(width - 1, width + 10, (1,)))
    state = torch.randn(batch, state_len, dim).to(itype).transpose(-1, -2)
    weight = torch.randn(dim, width)
    bias = torch.randn(dim) if has_bias else None
    cache_seqlens = (torch.randint(0, 1024, (batch,), dtype=torch.int32)
                     if has_cache_seqlens else None)
    want, want_state = update_ref(x.float(), state.float(), weight, bias, "silu", cache_seqlens)
    got = causal_conv1d_update(x, state, weight, bias, "silu", cache_seqlens)
    torch.testing.assert_close(got, want.to(itype), **PEER_TOLERANCE[itype])
    assert torch.equal(state, want_state.to(itype))


def test_update_serving_errors_leave_the_state():
    x, w = torch.randn(2, 4), torch.randn(4, 3)
    state = torch.randn(3, 4, 2)
    before = state.clone()
    with pytest.raises(kdnn.Error, match=r"state_indices\[1\]=3, expected a state row in \[0, 3\)"):
        causal_conv1d_update(x, state, w, conv_state_indices=torch.tensor([0, 3], dtype=torch.int32))
    with pytest.raises(kdnn.Error, match=r"conv_state_indices\[1\]=0 is also conv_state_indices\[0\]"):
        causal_conv1d_update(x, state, w, conv_state_indices=[0, 0])
    with pytest.raises(kdnn.Error, match=r"cache_seqlens\[0\]=-1, expected a position >= 0"):
        causal_conv1d_update(x, state[:2], w, cache_seqlens=[-1, 0])
    with pytest.raises(kdnn.Error, match=r"cache_seqlens has shape \[3\], expected \[2\]"):
        causal_conv1d_update(x, state[:2], w, cache_seqlens=[0, 0, 0])
    with pytest.raises(kdnn.Error, match=r"conv_state_indices has dtype torch.float32"):
        causal_conv1d_update(x, state, w, conv_state_indices=torch.zeros(2))
    assert torch.equal(state, before)


def test_update_decodes_the_sequence():
    # Step by step from a zero state: the whole sequence's causal_conv1d_fn.
    x = torch.randn(2, 4, 10, dtype=torch.float64)
    w, b = torch.randn(4, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    state = torch.zeros(2, 4, 3, dtype=torch.float64)
    steps = [causal_conv1d_update(x[..., t], state, w, b, True) for t in range(10)]
    torch.testing.assert_close(torch.stack(steps, dim=-1), causal_conv1d_fn(x, w, b, activation="silu"))


def test_update_state_layouts_and_errors():
    w = torch.randn(4, 4, dtype=torch.float64)
    x = torch.randn(2, 4, dtype=torch.float64)
    # A non-contiguous state is updated in place too.
    state = torch.randn(2, 3, 4, dtype=torch.float64).transpose(1, 2)
    want, want_state = update_ref(x, state.clone(), w)
    torch.testing.assert_close(causal_conv1d_update(x, state, w), want)
    torch.testing.assert_close(state, want_state)
    short = torch.randn(2, 4, 2, dtype=torch.float64)
    before = short.clone()
    with pytest.raises(kdnn.Error, match=r"conv_state has extent\(2\)=2, expected W >= K-1=3"):
        causal_conv1d_update(x, short, w)
    assert torch.equal(short, before)  # untouched by the failed call
    with pytest.raises(kdnn.Error, match="x requires grad; the decoding step has no backward"):
        causal_conv1d_update(x.clone().requires_grad_(), state, w)
    with pytest.raises(kdnn.Error, match="activation='relu'"):
        causal_conv1d_update(x, state, w, activation="relu")


def packed_ids(lengths_per_row):
    """seq_idx (batch, seqlen) from each row's sequence lengths (a 0 skips an id)."""
    rows = []
    for lengths in lengths_per_row:
        rows.append(torch.cat([torch.full((n,), i, dtype=torch.int32)
                               for i, n in enumerate(lengths)]))
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["channel_last", "contiguous"])
def test_seq_idx_equals_the_calls_per_sequence(dtype, layout):
    width, dim = 4, 6
    lengths = [[1, 3, 0, 4, 9, 2, 1], [5, 1, 1, 12, 1]]
    seqlen = sum(lengths[0])
    assert sum(lengths[1]) == seqlen
    seq_idx = packed_ids(lengths)
    make = channel_last if layout == "channel_last" else (lambda b, d, l, **kw: torch.randn(b, d, l, **kw))
    x = make(2, dim, seqlen, dtype=dtype).requires_grad_()
    w = torch.randn(dim, width, dtype=dtype, requires_grad=True)
    b = torch.randn(dim, dtype=dtype, requires_grad=True)
    out = causal_conv1d_fn(x, w, b, seq_idx=seq_idx, activation="silu")
    assert out.stride() == x.stride()  # in x's layout, as without seq_idx
    want = torch.empty_like(out)
    for row, row_lengths in enumerate(lengths):
        t = 0
        for n in filter(None, row_lengths):  # a length 0 is an id without steps
            piece = x[row:row + 1, :, t:t + n]
            want[row:row + 1, :, t:t + n] = conv_ref(piece, w, b, activation="silu")
            t += n
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, want, **tol)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, w, b), g)
    ref = torch.autograd.grad(want, (x, w, b), g)
    for name, a, e in zip(("x", "weight", "bias"), got, ref):
        torch.testing.assert_close(a, e, **tol, msg=name)


def test_seq_idx_gradcheck_and_states():
    x = torch.randn(1, 3, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    init = torch.randn(1, 3, 2, dtype=torch.float64, requires_grad=True)
    seq_idx = packed_ids([[2, 1, 5, 1]])
    torch.autograd.gradcheck(
        lambda x, w, init: causal_conv1d_fn(x, w, seq_idx=seq_idx, initial_states=init,
                                            return_final_states=True, activation="silu"),
        (x, w, init))
    # The initial states continue the first sequence; the final states hold
    # the last sequence's steps (here one) and zeros for the others.
    out, final = causal_conv1d_fn(x, w, seq_idx=seq_idx, initial_states=init,
                                  return_final_states=True)
    want_first = conv_ref(x[..., :2], w, initial_states=init)
    torch.testing.assert_close(out[..., :2], want_first)
    torch.testing.assert_close(final[..., :1], torch.zeros_like(final[..., :1]))
    torch.testing.assert_close(final[..., 1:], x[..., 8:])


def test_seq_idx_is_checked_and_copied():
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    w = torch.randn(3, 2, dtype=torch.float64)
    with pytest.raises(kdnn.Error, match=r"seq_idx has shape \[2, 4\], expected \[2, 5\]"):
        causal_conv1d_fn(x, w, seq_idx=torch.zeros(2, 4, dtype=torch.int32))
    with pytest.raises(kdnn.Error, match="seq_idx has dtype torch.float32, expected integers"):
        causal_conv1d_fn(x, w, seq_idx=torch.zeros(2, 5))
    with pytest.raises(kdnn.Error, match=r"seq_idx holds values in \[0, 4294967296\], expected int32"):
        causal_conv1d_fn(x, w, seq_idx=torch.tensor([[0] * 5, [0, 0, 0, 0, 2**32]]))
    # int64 ids are taken; editing them after the forward changes no gradient.
    xg = x.clone().requires_grad_()
    seq_idx = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])
    out = causal_conv1d_fn(xg, w, seq_idx=seq_idx)
    seq_idx.zero_()
    g = torch.autograd.grad(out.sum(), xg)[0]
    want = torch.autograd.grad(causal_conv1d_fn(
        xg, w, seq_idx=torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])).sum(), xg)[0]
    torch.testing.assert_close(g, want)
