# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Hostile and edge-case calls on the newer surfaces (kdnn.compat, packed
sequences, the conv's decoding step, the SSD's parameters), each of which
once gave a silent wrong answer, another exception type or a message naming
an internal field: now a kdnn.Error naming the argument as the caller
spelled it, or the right answer."""
import subprocess
import sys

import numpy as np
import pytest
import torch

import kdnn
from kdnn.compat import causal_conv1d as cc
from kdnn.compat import flash_attn as fa
from kdnn.compat import mamba_ssm, tile_kernels


def raises(fragment):
    return pytest.raises(kdnn.Error, match=fragment)


# -- silent on one process ---------------------------------------------------


def test_an_A_of_minus_infinity_is_refused():
    x, dt = torch.randn(1, 4, 2, 3), torch.full((1, 4, 2), 0.5)
    B, C = torch.randn(1, 4, 1, 2), torch.randn(1, 4, 1, 2)
    A = torch.tensor([-1.0, -float("inf")])
    with raises(r"ssd_forward: A\[1\]=-inf, expected a finite A <= 0"):
        kdnn.ssd(x, dt, A, B, C, chunk_size=4)
    with raises(r"A\[1\]=-inf, expected a finite A <= 0"):
        mamba_ssm.mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=4)


def varlen(total_q=7, total_k=7, heads=2, d=4):
    torch.manual_seed(0)
    return (torch.randn(total_q, heads, d), torch.randn(total_k, heads, d),
            torch.randn(total_k, heads, d))


def test_a_max_seqlen_shorter_than_a_sequence_is_refused():
    q, k, v = varlen()
    cu = torch.tensor([0, 2, 7], dtype=torch.int32)  # the longest sequence holds 5
    with raises(r"max_seqlen_k=3, expected at least the longest sequence's length \(5, from "
                r"cu_seqlens_k\)"):
        fa.flash_attn_varlen_func(q, k, v, cu, cu, 5, 3, window_size=(2, -1))
    with raises(r"max_seqlen_q=4, expected at least the longest sequence's length \(5"):
        fa.flash_attn_varlen_func(q, k, v, cu, cu, 4, 5)
    # At the longest length or above, the window bound is the same.
    a = fa.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, window_size=(2, -1))
    b = fa.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9, window_size=(2, -1))
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def conv_fn_inputs():
    torch.manual_seed(1)
    return torch.randn(2, 3, 6), torch.randn(3, 4)


@pytest.mark.parametrize("out, message", [
    (lambda: torch.zeros(2, 3, 1), r"final_states_out has shape \[2, 3, 1\], expected \[2, 3, 3\]"),
    (lambda: torch.zeros(3), r"final_states_out has shape \[3\], expected \[2, 3, 3\]"),
    (lambda: torch.zeros(2, 3, 3, dtype=torch.float64),
     r"final_states_out has dtype torch.float64, expected torch.float32"),
    (lambda: torch.zeros(2, 3, 3, dtype=torch.int32),
     r"final_states_out has dtype torch.int32, expected torch.float32"),
    (lambda: torch.zeros(2, 3, 3, requires_grad=True),
     r"final_states_out is a leaf that requires grad"),
    (lambda: torch.zeros(1, 3, 3).expand(2, 3, 3), r"final_states_out is expanded"),
    (lambda: [[0.0]], r"final_states_out is a list, expected a torch.Tensor"),
])
def test_a_wrong_final_states_out_is_refused_and_left_as_it_was(out, message):
    x, w = conv_fn_inputs()
    target = out()
    before = target.clone() if isinstance(target, torch.Tensor) else None
    with raises(message):
        cc.causal_conv1d_fn(x, w, return_final_states=True, final_states_out=target)
    if before is not None:
        assert torch.equal(target.detach(), before.detach())


def test_a_right_final_states_out_receives_the_final_states():
    x, w = conv_fn_inputs()
    out = torch.full((2, 3, 3), float("nan"))
    y, final = cc.causal_conv1d_fn(x, w, return_final_states=True, final_states_out=out)
    assert final is out
    torch.testing.assert_close(out, x[:, :, -3:], rtol=0, atol=0)  # the last width - 1 inputs
    torch.testing.assert_close(y, cc.causal_conv1d_fn(x, w), rtol=0, atol=0)


# -- other exception types -----------------------------------------------------


def test_varlen_alibi_of_one_row_with_several_sequences_returns_flash_attns_lse():
    q, k, v = varlen()
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    slopes = torch.tensor([[0.5, 0.25]])  # [1, nheads]: every sequence's
    out, lse, _ = fa.flash_attn_varlen_func(q, k, v, cu, cu, 4, 4, causal=True,
                                            alibi_slopes=slopes, return_attn_probs=True)
    same, lse_1d, _ = fa.flash_attn_varlen_func(q, k, v, cu, cu, 4, 4, causal=True,
                                                alibi_slopes=slopes[0], return_attn_probs=True)
    torch.testing.assert_close(out, same, rtol=0, atol=0)
    torch.testing.assert_close(lse, lse_1d, rtol=0, atol=0)
    # flash-attn's causal ALiBi adds slope·j: its lse, per sequence, by hand.
    for s, (a, b) in enumerate(((0, 3), (3, 7))):
        n = b - a
        for h in range(2):
            scores = (q[a:b, h] @ k[a:b, h].T) / 2.0 + slopes[0, h] * torch.arange(n)
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -float("inf"))
            torch.testing.assert_close(lse[h, a:b], torch.logsumexp(scores, -1))


def test_an_expanded_conv_state_is_refused_and_left_as_it_was():
    torch.manual_seed(2)
    state = torch.randn(1, 3, 4).expand(2, 3, 4)
    before = state.clone()
    with raises(r"causal_conv1d_update: conv_state is expanded \(stride 0 in dimension 0"):
        cc.causal_conv1d_update(torch.randn(2, 3), state, torch.randn(3, 4))
    assert torch.equal(state, before)


@pytest.mark.parametrize("name", ["seq_idx", "cu_seqlens", "cache_seqlens", "conv_state_indices"])
def test_index_tensors_on_the_meta_device_are_refused(name):
    meta = torch.zeros(1, 4, dtype=torch.int64, device="meta")
    if name == "seq_idx":
        call = lambda: kdnn.causal_conv1d(torch.randn(1, 4, 2), torch.randn(2, 3), seq_idx=meta)
    elif name == "cu_seqlens":
        q, k, v = varlen(4, 4)
        cu = torch.tensor([0, 4], device="meta")
        call = lambda: kdnn.flash_attention_varlen(q, k, v, cu, cu)
    else:
        index = torch.zeros(1, dtype=torch.int64, device="meta")
        call = lambda: kdnn.causal_conv1d_update(torch.randn(1, 2), torch.zeros(1, 2, 3),
                                                 torch.randn(2, 3), **{name: index})
    with raises(rf"{name}(_q)? is on meta, expected a tensor on cpu"):
        call()


# -- valid input refused ---------------------------------------------------------


def test_numpy_integers_are_integers():
    q, k, v = (torch.randn(1, 5, 2, 4) for _ in range(3))
    want = fa.flash_attn_func(q, k, v, window_size=(2, 1))
    got = fa.flash_attn_func(q, k, v, window_size=(np.int64(2), np.int32(1)))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    qv, kv, vv = varlen()
    cu = torch.tensor([0, 2, 7], dtype=torch.int32)
    want = fa.flash_attn_varlen_func(qv, kv, vv, cu, cu, 5, 5, window_size=(1, 0))
    got = fa.flash_attn_varlen_func(qv, kv, vv, cu, cu, np.int64(5), np.int32(5),
                                    window_size=(np.int16(1), np.int64(0)))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with raises(r"window_size=\(2.0, 1\), expected \(left, right\) integers"):
        fa.flash_attn_func(q, k, v, window_size=(2.0, 1))
    with raises(r"max_seqlen_k=True, expected an integer >= 0"):
        fa.flash_attn_varlen_func(qv, kv, vv, cu, cu, 5, True)


# -- messages that named an internal field ----------------------------------------


def test_messages_name_the_argument_as_the_caller_spelled_it():
    torch.manual_seed(3)
    x, w = torch.randn(2, 3), torch.randn(3, 4)
    with raises(r"causal_conv1d_update: conv_state has extent\(1\)=2, expected 3"):
        kdnn.causal_conv1d_update(x, torch.zeros(2, 2, 3), w)
    with raises(r"causal_conv1d_update: conv_state_indices\[1\]=5, expected a state row in "
                r"\[0, 4\) \(conv_state's extent\(0\)\)"):
        cc.causal_conv1d_update(x, torch.zeros(4, 3, 3), w, conv_state_indices=torch.tensor([0, 5]))
    with raises(r"compat.causal_conv1d.causal_conv1d_fn: initial_states has shape \[2, 3, 2\], "
                r"expected \(batch, dim, width - 1\) = \[2, 3, 3\]"):
        cc.causal_conv1d_fn(torch.randn(2, 3, 6), w, initial_states=torch.zeros(2, 3, 2))
    x4, B4 = torch.randn(1, 4, 2, 3), torch.randn(1, 4, 1, 5)
    with raises(r"ssd: initial_states has shape \[1, 2, 3, 4\], expected \[B, H, P, N\] = "
                r"\[1, 2, 3, 5\]"):
        mamba_ssm.mamba_chunk_scan_combined(x4, torch.ones(1, 4, 2), -torch.ones(2), B4, B4,
                                            chunk_size=4, initial_states=torch.zeros(1, 2, 3, 4))
    with raises(r"compat.tile_kernels.sinkhorn_normalize: repeat=0, expected an integer in \[1, "):
        tile_kernels.sinkhorn_normalize(torch.randn(2, 4, 4), repeat=0)


# -- kdnn.cp without a running MPI ------------------------------------------------


def test_kdnn_cp_refuses_a_communicator_of_an_uninitialised_mpi():
    if not kdnn.cp.available:
        pytest.skip("kdnn was built without MPI")
    pytest.importorskip("mpi4py")
    script = """
import mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
import torch, kdnn
try:
    kdnn.cp.conv_dt(torch.randn(1, 3, 4), torch.ones(4, 3), torch.randn(1, 3, 2), torch.zeros(2),
                    comm=MPI.COMM_WORLD)
except kdnn.Error as e:
    print(e)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert "kdnn.cp: comm cannot be used, MPI is not initialised" in run.stdout
