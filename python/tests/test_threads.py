# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn's operators called from several Python threads at once (the bindings
release the GIL): every output and gradient equals, bitwise, what the same
call gives alone, on every device this kdnn computes on. And a first kdnn
call on the GPU made from a new thread (no CUDA context current there)."""
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

import kdnn
from kdnn._tensors import DEVICES

THREADS = 4
REPEATS = 5


def devices():
    return [d for d in DEVICES if d == "cpu" or torch.cuda.is_available()]


def cases(dtype):
    """(name, fn, input makers): fn(*inputs) returns the outputs; a maker
    draws thread t's inputs from generator g."""
    f = dict(dtype=dtype)

    def randn(*shape):
        return lambda g: torch.randn(*shape, generator=g, **f)

    def positive(*shape):
        return lambda g: F.softplus(torch.randn(*shape, generator=g, **f))

    def negative(*shape):
        return lambda g: -torch.rand(*shape, generator=g, **f)

    E, H = 32, 4
    return [
        ("sinkhorn implicit", lambda x: kdnn.sinkhorn(x, iters=30), [randn(64, 16, 16)]),
        ("sinkhorn unrolled", lambda x: kdnn.sinkhorn(x, iters=10, backward="unrolled"),
         [randn(32, 8, 8)]),
        ("flash_attention", lambda q, k, v: kdnn.flash_attention(q, k, v, causal=True),
         [randn(1, 2, 80, 32), randn(1, 2, 80, 32), randn(1, 2, 80, 32)]),
        ("multi_head_attention",
         lambda x, wq, wk, wv, wo: kdnn.multi_head_attention(x, x, x, wq, wk, wv, wo, heads=H,
                                                             causal=True),
         [randn(2, 40, E), randn(E, E), randn(E, E), randn(E, E), randn(E, E)]),
        ("causal_conv1d", lambda x, w, b: kdnn.causal_conv1d(x, w, b, activation="silu"),
         [randn(2, 120, 24), randn(24, 4), randn(24)]),
        ("dt_softplus", lambda dt, b: kdnn.dt_softplus(dt, b), [randn(2, 60, 8), randn(8)]),
        ("ssd", lambda x, dt, A, B, C: kdnn.ssd(x, dt, A, B, C, chunk_size=32),
         [randn(1, 100, 2, 8), positive(1, 100, 2), negative(2), randn(1, 100, 1, 8),
          randn(1, 100, 1, 8)]),
    ]


def run(fn, makers, thread, device):
    """Thread `thread`'s call: its inputs, outputs and input gradients (CPU
    copies) for a fixed output gradient."""
    g = torch.Generator().manual_seed(1000 + thread)
    xs = [m(g).to(device).requires_grad_() for m in makers]
    out = fn(*xs)
    outs = out if isinstance(out, tuple) else (out,)
    grads = [torch.randn(o.shape, generator=g, dtype=o.dtype).to(device) for o in outs]
    got = torch.autograd.grad(outs, xs, grads)
    return [t.detach().cpu() for t in (*outs, *got)]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_concurrent_calls_give_the_results_of_lone_calls(device, dtype):
    for name, fn, makers in cases(dtype):
        alone = [run(fn, makers, t, device) for t in range(THREADS)]
        wrong, errors = [], []
        start = threading.Barrier(THREADS)

        def worker(t):
            try:
                start.wait()
                for r in range(REPEATS):
                    if not same(run(fn, makers, t, device), alone[t]):
                        wrong.append((t, r))
            except Exception as e:  # pragma: no cover (reported below)
                errors.append(repr(e))

        pool = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        assert not errors, f"{name}: {errors}"
        assert not wrong, f"{name}: {len(wrong)} of {THREADS * REPEATS} concurrent results differ"


@pytest.mark.skipif(not (torch.cuda.is_available() and "cuda" in DEVICES),
                    reason="needs a CUDA build of kdnn and a GPU")
def test_the_first_gpu_call_of_a_process_from_a_new_thread():
    # A fresh process, so that kdnn has made no CUDA instance yet: a thread
    # with no CUDA context current makes the first call, forward and backward.
    code = """
import threading, torch, kdnn
x = torch.randn(16, 4, 4, dtype=torch.float64)
result = {}
def first_call():
    y = x.cuda().requires_grad_()
    out = kdnn.sinkhorn(y, iters=20)
    out.sum().backward()
    result["out"], result["grad"] = out.detach().cpu(), y.grad.cpu()
t = threading.Thread(target=first_call)
t.start()
t.join()
y = x.clone().requires_grad_()
out = kdnn.sinkhorn(y, iters=20)
out.sum().backward()
torch.testing.assert_close(result["out"], out.detach(), rtol=1e-9, atol=1e-12)
torch.testing.assert_close(result["grad"], y.grad, rtol=1e-9, atol=1e-12)
print("same")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "same"
