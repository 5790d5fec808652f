# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.compat.mamba_ssm against mamba's semantics: the chunked SSD
reference with what mamba_chunk_scan_combined does around the scan (dt_bias,
dt_softplus, dt_limit, D per head or per (head, channel), z gating, initial
and final states), written here in PyTorch from the peer's code's
documented behaviour; gradients, and the options kdnn does not have."""
import math

import pytest
import torch
import torch.nn.functional as F
from common import DTYPES, TOLERANCE, assert_matches
from kdnn_reference import ssd as ssd_reference

import kdnn
from kdnn.compat.mamba_ssm import mamba_chunk_scan_combined


def reference(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
              dt_softplus=False, dt_limit=(0.0, math.inf)):
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = F.softplus(dt)  # linear above 20, as mamba's
    dt = dt.clamp(*dt_limit)
    y, final = ssd_reference.ssd_chunked(x, dt, A, B, C, chunk_size, init=initial_states)
    if D is not None:
        y = y + x * (D[:, None] if D.dim() == 1 else D)
    if z is not None:
        y = y * F.silu(z)
    return y, final


def inputs(dtype, b=2, L=19, h=4, p=3, g=2, n=5):
    kw = dict(dtype=dtype, requires_grad=True)
    return dict(x=torch.randn(b, L, h, p, **kw), dt=torch.randn(b, L, h, **kw),
                A=(-torch.rand(h, dtype=dtype) - 0.2).requires_grad_(),
                B=torch.randn(b, L, g, n, **kw), C=torch.randn(b, L, g, n, **kw),
                D=torch.randn(h, p, **kw), z=torch.randn(b, L, h, p, **kw),
                dt_bias=torch.randn(h, **kw), initial_states=torch.randn(b, h, p, n, **kw))


OPTIONS = [dict(dt_softplus=True), dict(dt_softplus=True, dt_limit=(0.05, 1.5), D="head"),
           dict(dt_softplus=True, z=True, D="channel", initial_states=True),
           dict(dt_softplus=False, dt_bias=True, z=True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("chunk_size", [4, 8])
def test_matches_the_reference(dtype, options, chunk_size):
    t = inputs(dtype)
    args = dict(dt_softplus=options["dt_softplus"], dt_limit=options.get("dt_limit", (0.0, math.inf)))
    if options["dt_softplus"] or options.get("dt_bias"):
        args["dt_bias"] = t["dt_bias"]
    if options.get("D") == "head":
        args["D"] = t["D"][:, 0].detach().clone().requires_grad_()
    elif options.get("D") == "channel":
        args["D"] = t["D"]
    for name in ("z", "initial_states"):
        if options.get(name):
            args[name] = t[name]
    core = [t[k] for k in ("x", "dt", "A", "B", "C")]
    got = mamba_chunk_scan_combined(*core, chunk_size, return_final_states=True, **args)
    want = reference(*core, chunk_size, **args)
    leaves = core + [v for k, v in args.items() if isinstance(v, torch.Tensor)]
    assert_matches(got, want, leaves, **TOLERANCE[dtype])


def test_positional_arguments_as_mamba():
    t = inputs(torch.float64)
    core = [t[k].detach() for k in ("x", "dt", "A", "B", "C")]
    D, z, bias = t["D"].detach(), t["z"].detach(), t["dt_bias"].detach()
    got = mamba_chunk_scan_combined(*core, 4, D, z, bias, None, None, None, True)
    torch.testing.assert_close(got, reference(*core, 4, D=D, z=z, dt_bias=bias, dt_softplus=True)[0])


def test_options_kdnn_does_not_have():
    t = {k: v.detach() for k, v in inputs(torch.float64).items()}
    core = [t[k] for k in ("x", "dt", "A", "B", "C")]
    with pytest.raises(kdnn.Error, match=r"A\[0\]=.*expected a finite A <= 0"):
        mamba_chunk_scan_combined(core[0], core[1], -core[2], *core[3:], 4, dt_softplus=True)


def packed_ids(lengths_per_row, first_ids=None):
    """seq_idx (batch, seqlen) from each row's sequence lengths (a 0 skips an
    id), row b's ids counted from first_ids[b] (0 by default)."""
    rows = []
    for b, lengths in enumerate(lengths_per_row):
        first = 0 if first_ids is None else first_ids[b]
        rows.append(torch.cat([torch.full((n,), first + i, dtype=torch.int32)
                               for i, n in enumerate(lengths)]))
    return torch.stack(rows)


def per_sequence(t, lengths_per_row, chunk_size, initial_rows, **options):
    """The reference run on each sequence alone, concatenated: y, and each
    row's last sequence's final state; row b's first sequence starts from
    its initial state where initial_rows[b]."""
    ys, finals = [], []
    for b, lengths in enumerate(lengths_per_row):
        pieces, start, final = [], 0, None
        for i, n in enumerate(length for length in lengths if length > 0):
            steps = slice(start, start + n)
            piece = {k: t[k][b:b + 1, steps] for k in ("x", "dt", "B", "C", "z")}
            init = t["initial_states"][b:b + 1] if i == 0 and initial_rows[b] else None
            y, final = reference(piece["x"], piece["dt"], t["A"], piece["B"], piece["C"],
                                 chunk_size, D=t["D"], z=piece["z"], dt_bias=t["dt_bias"],
                                 initial_states=init, **options)
            pieces.append(y)
            start += n
        ys.append(torch.cat(pieces, dim=1))
        finals.append(final)
    return torch.cat(ys), torch.cat(finals)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_size", [4, 8])
def test_seq_idx_equals_the_calls_per_sequence(dtype, chunk_size):
    t = inputs(dtype)
    lengths = [[1, 3, 0, 4, 5, 6], [19]]  # starts inside chunks and on their edges
    core = [t[k] for k in ("x", "dt", "A", "B", "C")]
    options = dict(D=t["D"], z=t["z"], dt_bias=t["dt_bias"], dt_softplus=True)
    # mamba's initial states belong to sequence id 0: row 1, whose ids start
    # at 3, starts from zeros.
    seq_idx = packed_ids(lengths, first_ids=[0, 3])
    got = mamba_chunk_scan_combined(*core, chunk_size, initial_states=t["initial_states"],
                                    seq_idx=seq_idx, return_final_states=True, **options)
    want = per_sequence(t, lengths, chunk_size, [True, False], dt_softplus=True)
    assert_matches(got, want, list(t.values()), **TOLERANCE[dtype])
    # kdnn.ssd's own: the initial states continue each row's first sequence.
    got = kdnn.ssd(*core, t["D"], t["initial_states"], t["z"], t["dt_bias"],
                   chunk_size=chunk_size, dt_softplus=True, return_final_states=True,
                   seq_idx=seq_idx)
    want = per_sequence(t, lengths, chunk_size, [True, True], dt_softplus=True)
    assert_matches(got, want, list(t.values()), **TOLERANCE[dtype])


def test_seq_idx_is_checked_and_copied():
    t = {k: v.detach() for k, v in inputs(torch.float64).items()}
    core = [t[k] for k in ("x", "dt", "A", "B", "C")]
    with pytest.raises(kdnn.Error, match=r"seq_idx has shape \[2, 18\], expected \[2, 19\]"):
        kdnn.ssd(*core, chunk_size=4, seq_idx=torch.zeros(2, 18, dtype=torch.int32))
    with pytest.raises(kdnn.Error, match="seq_idx has dtype torch.float64, expected integers"):
        mamba_chunk_scan_combined(*core, 4, seq_idx=torch.zeros(2, 19, dtype=torch.float64))
    seq_idx = packed_ids([[9, 10], [5, 14]]).long()
    x = t["x"].clone().requires_grad_()
    y = kdnn.ssd(x, *core[1:], chunk_size=4, dt_softplus=True, seq_idx=seq_idx)
    seq_idx.zero_()  # after the forward: the backward keeps the forward's copy
    g = torch.autograd.grad(y.sum(), x)[0]
    want = torch.autograd.grad(kdnn.ssd(x, *core[1:], chunk_size=4, dt_softplus=True,
                                        seq_idx=packed_ids([[9, 10], [5, 14]])).sum(), x)[0]
    torch.testing.assert_close(g, want, rtol=0, atol=0)


def per_sequence_states(t, lengths, chunk_size, **options):
    """Row 0's sequences run alone through the reference: each one's final
    state (zeros for an empty one); the first starts from the initial
    state."""
    states, start = [], 0
    for i, n in enumerate(lengths):
        if n == 0:
            states.append(torch.zeros_like(t["initial_states"][:1]))
            continue
        steps = slice(start, start + n)
        piece = {k: t[k][:1, steps] for k in ("x", "dt", "B", "C")}
        init = t["initial_states"][:1] if start == 0 else None
        states.append(reference(piece["x"], piece["dt"], t["A"], piece["B"], piece["C"],
                                chunk_size, dt_bias=t["dt_bias"], initial_states=init,
                                **options)[1])
        start += n
    return torch.cat(states)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_size", [4, 8])
def test_varlen_states_equal_the_calls_per_sequence(dtype, chunk_size):
    t = {k: v.detach() for k, v in inputs(dtype, b=1).items()}
    lengths = [0, 1, 3, 4, 0, 5, 6]  # ends inside chunks and on their edges, empty sequences
    offsets = torch.tensor([0] + lengths).cumsum(0)
    # An empty sequence's id has no step; the first step's id is 0, whose
    # sequence the initial states continue (mamba's rule).
    seq_idx = packed_ids([lengths], first_ids=[-1])
    core = [t[k] for k in ("x", "dt", "A", "B", "C")]
    y, final, states = mamba_chunk_scan_combined(
        *core, chunk_size, D=t["D"], z=t["z"], dt_bias=t["dt_bias"],
        initial_states=t["initial_states"], seq_idx=seq_idx, cu_seqlens=offsets,
        dt_softplus=True, return_final_states=True, return_varlen_states=True)
    want = per_sequence_states(t, lengths, chunk_size, dt_softplus=True)
    torch.testing.assert_close(states, want, **TOLERANCE[dtype])
    torch.testing.assert_close(final, want[-1:], **TOLERANCE[dtype])
    # The other outputs are the call's without the states, to the bit.
    y_alone = mamba_chunk_scan_combined(*core, chunk_size, D=t["D"], z=t["z"],
                                        dt_bias=t["dt_bias"], initial_states=t["initial_states"],
                                        seq_idx=seq_idx, dt_softplus=True)
    torch.testing.assert_close(y, y_alone, rtol=0, atol=0)
    # Without return_varlen_states, cu_seqlens is ignored (as mamba does).
    ignored = mamba_chunk_scan_combined(*core, chunk_size, D=t["D"], z=t["z"],
                                        dt_bias=t["dt_bias"], initial_states=t["initial_states"],
                                        seq_idx=seq_idx, cu_seqlens=offsets, dt_softplus=True)
    torch.testing.assert_close(ignored, y_alone, rtol=0, atol=0)


def test_varlen_states_have_no_gradient():
    t = inputs(torch.float64, b=1)
    core = [t[k] for k in ("x", "dt", "A", "B", "C")]
    seq_idx = packed_ids([[7, 12]])
    y, states = kdnn.ssd(*core, chunk_size=4, dt_softplus=True, seq_idx=seq_idx,
                         cu_seqlens=[0, 7, 19], return_varlen_states=True)
    assert y.requires_grad and not states.requires_grad
    assert list(states.shape) == [2, 4, 3, 5]


def test_varlen_states_are_checked():
    t = {k: v.detach() for k, v in inputs(torch.float64).items()}
    t["dt"] = t["dt"].abs()  # step sizes as they are (no softplus)
    core = [t[k] for k in ("x", "dt", "A", "B", "C")]
    one = [c[:1] if c.dim() > 1 else c for c in core]
    seq_idx = packed_ids([[7, 12]])
    with pytest.raises(kdnn.Error, match="return_varlen_states=True without cu_seqlens"):
        mamba_chunk_scan_combined(*one, 4, seq_idx=seq_idx, return_varlen_states=True)
    with pytest.raises(kdnn.Error, match="cu_seqlens is given with return_varlen_states=False"):
        kdnn.ssd(*one, chunk_size=4, seq_idx=seq_idx, cu_seqlens=[0, 7, 19])
    with pytest.raises(kdnn.Error, match=r"x has extent\(0\)=2, expected 1 with cu_seqlens"):
        kdnn.ssd(*core, chunk_size=4, seq_idx=packed_ids([[7, 12], [7, 12]]),
                 cu_seqlens=[0, 7, 19], return_varlen_states=True)
    with pytest.raises(kdnn.Error, match="cu_seqlens is given without seq_idx"):
        kdnn.ssd(*one, chunk_size=4, cu_seqlens=[0, 7, 19], return_varlen_states=True)
    with pytest.raises(kdnn.Error, match=r"cu_seqlens\[2\]=18, expected 19"):
        kdnn.ssd(*one, chunk_size=4, seq_idx=seq_idx, cu_seqlens=[0, 7, 18],
                 return_varlen_states=True)
    with pytest.raises(kdnn.Error, match="expected a new id: cu_seqlens starts a sequence at "
                                         "step 5"):
        kdnn.ssd(*one, chunk_size=4, seq_idx=seq_idx, cu_seqlens=[0, 5, 19],
                 return_varlen_states=True)
    with pytest.raises(kdnn.Error, match=r"cu_seqlens has shape \[1, 3\], expected \[S \+ 1\]"):
        kdnn.ssd(*one, chunk_size=4, seq_idx=seq_idx, cu_seqlens=[[0, 7, 19]],
                 return_varlen_states=True)
    with pytest.raises(kdnn.Error, match="cu_seqlens has dtype torch.float32, expected integers"):
        kdnn.ssd(*one, chunk_size=4, seq_idx=seq_idx, cu_seqlens=[0.0, 7.0, 19.0],
                 return_varlen_states=True)
