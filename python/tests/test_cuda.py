# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""CUDA tensors (a CUDA build of kdnn with a CUDA PyTorch): every operator
on the GPU, on PyTorch's current stream, against the same operator on the
CPU (which the other tests check against PyTorch's formulations). Skipped
elsewhere."""
import pytest
import torch
import torch.nn.functional as F

import kdnn
from kdnn._tensors import DEVICES

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and "cuda" in DEVICES),
                                reason="needs a CUDA build of kdnn and a GPU")

# The GPU forms sum in other orders than the host forms.
CLOSE = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-9, atol=1e-11)}


def on_both(fn, *inputs):
    """(outputs and input gradients on the CPU, the same on the GPU) for
    fn(*inputs) with a random output gradient; None inputs stay None."""
    results = []
    for device in ("cpu", "cuda"):
        xs = [None if x is None else x.detach().to(device).requires_grad_(x.is_floating_point())
              for x in inputs]
        out = fn(*xs)
        outs = out if isinstance(out, tuple) else (out,)
        torch.manual_seed(5)
        grads = [torch.randn(o.shape, dtype=o.dtype).to(device) for o in outs]
        leaves = [x for x in xs if x is not None and x.requires_grad]
        got = torch.autograd.grad(outs, leaves, grads)
        results.append([t.cpu() for t in (*outs, *got)])
    return results


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_operator_on_the_gpu_matches_the_cpu(dtype):
    f = dict(dtype=dtype)
    slopes = torch.rand(2, 4)  # ALiBi's, per batch entry (the same for both calls)
    cases = [
        (lambda x: kdnn.sinkhorn(x, iters=20, backward="unrolled"), torch.randn(64, 8, 8, **f)),
        (lambda q, k, v: kdnn.flash_attention(q, k, v, causal=True),
         torch.randn(2, 4, 100, 64, **f), torch.randn(2, 4, 90, 64, **f),
         torch.randn(2, 4, 90, 64, **f)),
        (lambda x, w, b: kdnn.causal_conv1d(x, w, b, activation="silu"), torch.randn(2, 300, 64, **f),
         torch.randn(64, 4, **f), torch.randn(64, **f)),
        (lambda d, b: kdnn.dt_softplus(d, b), torch.randn(2, 50, 8, **f), torch.randn(8, **f)),
        (lambda x, dt, A, B, C: kdnn.ssd(x, dt, A, B, C, chunk_size=64), torch.randn(2, 200, 4, 16, **f),
         F.softplus(torch.randn(2, 200, 4, **f)), -torch.rand(4, **f), torch.randn(2, 200, 1, 16, **f),
         torch.randn(2, 200, 1, 16, **f)),
        # Grouped-query attention with per-query windows.
        (lambda q, k, v: kdnn.flash_attention(q, k, v, window=(torch.arange(70) // 2,
                                                               torch.arange(70) + 10)),
         torch.randn(2, 8, 70, 64, **f), torch.randn(2, 2, 80, 64, **f),
         torch.randn(2, 2, 80, 32, **f)),
        # ALiBi (slopes per batch entry) with a score cap, causal, S < Sk.
        (lambda q, k, v: kdnn.flash_attention(q, k, v, causal=True, softcap=2.0,
                                              alibi_slopes=slopes),
         torch.randn(2, 4, 70, 64, **f), torch.randn(2, 4, 130, 64, **f),
         torch.randn(2, 4, 130, 64, **f)),
    ]
    for fn, *inputs in cases:
        cpu, gpu = on_both(fn, *inputs)
        for a, b in zip(cpu, gpu):
            torch.testing.assert_close(b, a, **CLOSE[dtype])


def test_the_decoding_step_on_the_gpu_matches_the_cpu():
    x, w, b = torch.randn(3, 64, 2), torch.randn(64, 4), torch.randn(64)
    state = torch.randn(3, 64, 5)
    state_gpu = state.cuda()
    y = kdnn.causal_conv1d_update(x.cuda(), state_gpu, w.cuda(), b.cuda(), activation="silu")
    want = kdnn.causal_conv1d_update(x, state, w, b, activation="silu")
    torch.testing.assert_close(y.cpu(), want, **CLOSE[torch.float32])
    torch.testing.assert_close(state_gpu.cpu(), state)
    # Serving: state rows chosen per entry of a larger state, circular.
    rows, positions = torch.tensor([4, 0, 2], dtype=torch.int32), torch.tensor([1, 8, 3])
    big = torch.randn(5, 64, 5)
    big_gpu = big.cuda()
    y = kdnn.causal_conv1d_update(x.cuda(), big_gpu, w.cuda(), b.cuda(), activation="silu",
                                  cache_seqlens=positions.cuda(), conv_state_indices=rows.cuda())
    want = kdnn.causal_conv1d_update(x, big, w, b, activation="silu", cache_seqlens=positions,
                                     conv_state_indices=rows)
    torch.testing.assert_close(y.cpu(), want, **CLOSE[torch.float32])
    torch.testing.assert_close(big_gpu.cpu(), big)


def test_the_peers_entry_points_on_the_gpu():
    from kdnn.compat.causal_conv1d import causal_conv1d_fn
    from kdnn.compat.flash_attn import flash_attn_func
    q, k = torch.randn(2, 50, 4, 64), torch.randn(2, 60, 2, 64)
    for fn, args in ((lambda *a: flash_attn_func(*a, causal=True, window_size=(20, 0)), (q, k, k)),
                     (lambda *a: causal_conv1d_fn(*a, activation="silu"),
                      (torch.randn(2, 300, 64).transpose(1, 2), torch.randn(64, 4)))):
        cpu, gpu = on_both(fn, *args)
        for a, b in zip(cpu, gpu):
            torch.testing.assert_close(b, a, **CLOSE[torch.float32])


def test_a_side_stream_is_used():
    q = torch.randn(1, 2, 64, 64, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = kdnn.flash_attention(q, q, q)
    stream.synchronize()
    torch.testing.assert_close(out.cpu(), kdnn.flash_attention(q.cpu(), q.cpu(), q.cpu()),
                               rtol=1e-4, atol=1e-5)


def test_value_checks_read_on_the_callers_stream():
    """dt >= 0 is checked on the caller's stream: a dt written there just
    before the call, behind a long kernel, is checked as written (it was -1
    before: a check on another stream could read that and refuse it)."""
    x, Bm, C = (torch.randn(1, 64, 2, 16), torch.randn(1, 64, 1, 16), torch.randn(1, 64, 1, 16))
    A, dt = -torch.rand(2), torch.full((1, 64, 2), -1.0)
    want = kdnn.ssd(x, dt.fill_(0.1), A, Bm, C, chunk_size=16)
    x, Bm, C, A = (t.cuda() for t in (x, Bm, C, A))
    dt = torch.full((1, 64, 2), -1.0, device="cuda")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # some 0.1 s of GPU time before the write
        dt.fill_(0.1)
        y = kdnn.ssd(x, dt, A, Bm, C, chunk_size=16)
    stream.synchronize()
    torch.testing.assert_close(y.cpu(), want, **CLOSE[torch.float32])


def test_tensors_on_two_devices_are_an_error():
    q = torch.randn(1, 2, 8, 16, device="cuda")
    with pytest.raises(kdnn.Error, match=r"flash_attention: k is on cpu, expected cuda:0"):
        kdnn.flash_attention(q, q.cpu(), q)
