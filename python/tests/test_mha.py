# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn.multi_head_attention and kdnn.nn.MultiheadAttention against the
layer written with torch.nn.functional (kdnn_reference.mha) and against
torch.nn.MultiheadAttention: outputs and every gradient, across masks,
sequence lengths, dropout and both algorithms; gradcheck in float64."""
import pytest
import torch
from common import DTYPES, TOLERANCE, assert_matches
from kdnn_reference import mha as reference
from kdnn_reference import philox

import kdnn

PARAMS = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")


def layer(dtype, B=2, S=7, Sk=9, Eq=6, Ek=5, Ev=4, H=2, D=3, Dv=4, Eo=5, biases=True,
          residual=False, Hkv=None):
    def leaf(*shape, fan_in=1):  # weights scaled as nn.Linear's
        return (torch.randn(*shape, dtype=dtype) / fan_in**0.5).requires_grad_(True)
    Hkv = Hkv or H
    t = {"q": leaf(B, S, Eq), "k": leaf(B, Sk, Ek), "v": leaf(B, Sk, Ev),
         "residual": leaf(B, S, Eo) if residual else None,
         "w_q": leaf(H * D, Eq, fan_in=Eq), "w_k": leaf(Hkv * D, Ek, fan_in=Ek),
         "w_v": leaf(Hkv * Dv, Ev, fan_in=Ev), "w_o": leaf(Eo, H * Dv, fan_in=H * Dv)}
    for name, n in (("b_q", H * D), ("b_k", Hkv * D), ("b_v", Hkv * Dv), ("b_o", Eo)):
        t[name] = leaf(n) if biases else None
    return t, H


def run(t, H, **kw):
    return kdnn.multi_head_attention(t["q"], t["k"], t["v"], *(t[p] for p in PARAMS), heads=H,
                                     residual=t["residual"], **kw)


def leaves(t):
    return [x for x in t.values() if x is not None]


def in_double(t):
    """The same tensors in float64, as new leaves: the reference's inputs."""
    return {n: None if x is None else x.detach().double().requires_grad_(True) for n, x in t.items()}


CASES = [
    dict(),
    dict(causal=True),
    dict(window=([0, 0, 1, 2, 9, 3, 0], [3, 4, 5, 6, 9, 9, 9])),  # query 4 sees no key
    dict(seq_lengths=([7, 4], [9, 2]), residual=True),
    dict(causal=True, algo="unfused", residual=True),
    dict(biases=False),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(c) or "plain")
def test_layer_matches_the_reference(dtype, case):
    case = dict(case)
    t, H = layer(dtype, biases=case.pop("biases", True), residual=case.pop("residual", False))
    B, S, Sk = t["q"].shape[0], t["q"].shape[1], t["k"].shape[1]
    lo, hi = case.get("window", (None, None))
    lens_q, lens_k = case.get("seq_lengths", (None, None))
    mask = reference.visible(B, S, Sk, case.get("causal", False), lo, hi, lens_q, lens_k)
    t64 = in_double(t)  # the reference in float64, kdnn in `dtype`
    assert_matches(run(t, H, **case), reference.forward(t64, H, mask, lens_q=lens_q), leaves(t),
                   leaves(t64), **TOLERANCE[dtype])


@pytest.mark.parametrize("algo", ["fused", "unfused"])
def test_dropout_is_kdnns_philox_mask(algo):
    t, H = layer(torch.float64)
    p, seed, offset = 0.25, 99 + (3 << 32), 7
    out = run(t, H, dropout_p=p, seed=seed, offset=offset, algo=algo)
    keep = torch.from_numpy(philox.dropout_keep((2, H, 7, 9), p, seed, offset))
    want = reference.forward(t, H, reference.visible(2, 7, 9), keep=keep, p=p)
    torch.testing.assert_close(out, want)


def test_gradcheck():
    t, H = layer(torch.float64, B=1, S=3, Sk=4, Eq=3, Ek=2, Ev=3, D=2, Dv=2, Eo=3, residual=True)
    names = [name for name, x in t.items() if x is not None]

    def f(*xs):
        return run(dict(t, **dict(zip(names, xs))), H, causal=True)
    assert torch.autograd.gradcheck(f, [t[n] for n in names])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algo", ["fused", "unfused"])
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_query_layer_matches_the_reference(dtype, algo, kv_heads):
    """kv_heads < heads: w_k, w_v with kv_heads heads, each read by its
    group of query heads (the reference repeats K and V per query head);
    every gradient, dw_k and dw_v summed over the groups, by autograd."""
    t, H = layer(dtype, H=4, Hkv=kv_heads, residual=True)
    B, S, Sk = 2, 7, 9
    lens_q, lens_k = [7, 5], [9, 3]
    mask = reference.visible(B, S, Sk, True, None, None, lens_q, lens_k)
    t64 = in_double(t)
    got = run(t, H, kv_heads=kv_heads, causal=True, seq_lengths=(lens_q, lens_k), algo=algo)
    assert_matches(got, reference.forward(t64, H, mask, lens_q=lens_q, kv_heads=kv_heads),
                   leaves(t), leaves(t64), **TOLERANCE[dtype])


def test_grouped_query_gradcheck():
    t, H = layer(torch.float64, B=1, S=3, Sk=4, Eq=3, Ek=2, Ev=3, H=4, D=2, Dv=2, Eo=3, Hkv=2)
    names = [name for name, x in t.items() if x is not None]

    def f(*xs):
        return run(dict(t, **dict(zip(names, xs))), H, kv_heads=2, causal=True, algo="unfused")
    assert torch.autograd.gradcheck(f, [t[n] for n in names])


def test_module_with_kv_heads_is_the_grouped_layer():
    ours = kdnn.nn.MultiheadAttention(8, 4, kv_heads=2, dtype=torch.float64)
    assert ours.w_k.shape == (4, 8) and ours.w_v.shape == (4, 8) and ours.b_k.shape == (4,)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    t = {"q": x, "k": x, "v": x, "residual": None,
         **{name: getattr(ours, name) for name in PARAMS}}
    want = reference.forward(t, 4, reference.visible(2, 5, 5, True), kv_heads=2)
    torch.testing.assert_close(ours(x, causal=True), want)
    for kw, match in ((dict(kv_heads=3), r"kv_heads=3, expected a divisor of num_heads=4"),
                      (dict(kv_heads=0), r"kv_heads=0, expected an integer in \[1, 4\]"),
                      (dict(num_heads=3), r"num_heads=3, expected a divisor of embed_dim=8")):
        with pytest.raises(kdnn.Error, match=match):
            kdnn.nn.MultiheadAttention(8, **{"num_heads": 4, **kw})


def test_module_is_torch_multihead_attention():
    E, H = 8, 2
    ours = kdnn.nn.MultiheadAttention(E, H, dtype=torch.float64)
    theirs = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.w_q, ours.w_k, ours.w_v]))
        torch.nn.init.normal_(ours.b_q), torch.nn.init.normal_(ours.b_o)
        theirs.in_proj_bias.copy_(torch.cat([ours.b_q, ours.b_k, ours.b_v]))
        theirs.out_proj.weight.copy_(ours.w_o)
        theirs.out_proj.bias.copy_(ours.b_o)
    x = torch.randn(3, 5, E, dtype=torch.float64)
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # True: not allowed
    want, _ = theirs(x, x, x, attn_mask=causal, need_weights=False)
    torch.testing.assert_close(ours(x, causal=True), want)


def test_bad_input():
    t, H = layer(torch.float32)
    with pytest.raises(kdnn.Error, match=r"heads=0, expected an integer in \[1, 2147483647\]"):
        run(t, 0)
    with pytest.raises(kdnn.Error, match=r"w_q has 6 rows and w_v 8, expected multiples of heads=4"):
        run(t, 4)
    with pytest.raises(kdnn.Error, match=r"kv_heads=3, expected an integer in \[1, 2\]"):
        run(t, H, kv_heads=3)
    g, _ = layer(torch.float32, H=4, Hkv=2)
    with pytest.raises(kdnn.Error, match=r"kv_heads=3, expected a divisor of heads=4"):
        run(g, 4, kv_heads=3)
    with pytest.raises(kdnn.Error, match=r"weights.w_k has extent\(0\)=6, expected 3 \(Hkv·D"):
        run(g, 4, kv_heads=1)  # w_v's 8 rows read as Dv = 8: w_k must then be [1·3, Ek]
    with pytest.raises(kdnn.Error, match=r"seq_lengths\[0\] has shape \[3\], expected \[2\]"):
        run(t, H, seq_lengths=([1, 2, 3], [1, 2]))
    with pytest.raises(kdnn.Error, match=r"mask.seq_q\[1\]=8, expected a value in \[0, 7\]"):
        run(t, H, seq_lengths=([1, 8], [1, 2]))
    with pytest.raises(kdnn.Error, match=r"algo='flash', expected one of"):
        run(t, H, algo="flash")


def test_masks_are_checked_and_copied():
    """An int64 length past int32 is an error (not a wrapped value), and the
    masks are the values at the call: editing them before the backward
    changes nothing."""
    t, H = layer(torch.float64)
    with pytest.raises(kdnn.Error,
                       match=r"seq_lengths\[0\] holds values in \[5, 4294967298\], expected int32"):
        run(t, H, seq_lengths=(torch.tensor([2**32 + 2, 5]), [6, 6]))
    with pytest.raises(kdnn.Error, match=r"window\[1\] holds values in \[-2147483649, 9\]"):
        run(t, H, window=([0] * 7, torch.tensor([-2**31 - 1, 9, 9, 9, 9, 9, 9])))
    seq_q, seq_k = torch.tensor([7, 4], dtype=torch.int32), torch.tensor([9, 2], dtype=torch.int32)
    g = torch.randn(2, 7, 5, dtype=torch.float64)
    (run(t, H, seq_lengths=(seq_q, seq_k)) * g).sum().backward()
    want = [x.grad.clone() for x in leaves(t)]
    for x in leaves(t):
        x.grad = None
    out = run(t, H, seq_lengths=(seq_q, seq_k))
    seq_q.fill_(1)
    seq_k.fill_(1)
    (out * g).sum().backward()
    for got, expected in zip((x.grad for x in leaves(t)), want):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_sequences_are_each_sequences_layer(dtype):
    """cu_seqlens: one batch entry of packed sequences; each sequence's rows
    of the output are the layer on that sequence alone, and the gradients
    of every input and weight are those of the sum of those layers."""
    lengths_q, lengths_k = [3, 0, 6], [4, 2, 5]
    t, H = layer(dtype, B=1, S=9, Sk=11, residual=True, Hkv=1)
    cu = ([0, 3, 3, 9], torch.tensor([0, 4, 6, 11]))
    out = run(t, H, kv_heads=1, causal=True, cu_seqlens=cu)
    parts = []
    i = j = 0
    for sq, sk in zip(lengths_q, lengths_k):
        part = dict(t, q=t["q"][:, i:i + sq], k=t["k"][:, j:j + sk], v=t["v"][:, j:j + sk],
                    residual=t["residual"][:, i:i + sq])
        parts.append(run(part, H, kv_heads=1, causal=True))
        i, j = i + sq, j + sk
    assert_matches(out, torch.cat(parts, dim=1), leaves(t), **TOLERANCE[dtype])


def test_packed_sequences_gradcheck_and_errors():
    t, H = layer(torch.float64, B=1, S=5, Sk=5, Eq=3, Ek=2, Ev=3, D=2, Dv=2, Eo=3)
    names = [name for name, x in t.items() if x is not None]
    cu = ([0, 2, 5], [0, 3, 5])

    def f(*xs):
        return run(dict(t, **dict(zip(names, xs))), H, cu_seqlens=cu)
    assert torch.autograd.gradcheck(f, [t[n] for n in names])
    with pytest.raises(kdnn.Error, match="cu_seqlens is a int, expected"):
        run(t, H, cu_seqlens=3)
    with pytest.raises(kdnn.Error, match=r"seqs.cu_seqlens_k\[2\]=4, expected 5"):
        run(t, H, cu_seqlens=([0, 2, 5], [0, 3, 4]))
    with pytest.raises(kdnn.Error, match="expected AttentionAlgo::fused"):
        run(t, H, cu_seqlens=cu, algo="unfused")
    t2, _ = layer(torch.float64, B=2, S=5, Sk=5)
    with pytest.raises(kdnn.Error, match="packed sequences \\(seqs\\) with a batch of 2"):
        run(t2, H, cu_seqlens=cu)
