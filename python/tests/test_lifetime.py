# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn at interpreter exit: calls still running in daemon threads, and
module objects still alive, in a fresh interpreter each."""
import subprocess
import sys


def run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_exit_while_a_daemon_thread_is_inside_a_call():
    # The thread is inside a call of about a second when the main thread
    # exits: Kokkos is finalized after the call, whose thread then waits for
    # the process's end instead of returning to the exiting interpreter.
    # (PyTorch's own operators abort a daemon thread that is inside one at
    # exit, before Python 3.14: the thread spends its time in kdnn here.)
    done = run("""
import threading, time, torch, kdnn
x = torch.randn(256, 64, 64, dtype=torch.float64)
started = threading.Event()
def work():
    started.set()
    while True:
        kdnn.sinkhorn(x, iters=2000)
threading.Thread(target=work, daemon=True).start()
started.wait()
time.sleep(0.3)
print("exiting")
""")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exiting"
    assert "Segmentation" not in done.stderr


def test_no_leak_warnings_with_outputs_alive_at_exit():
    done = run("""
import torch, kdnn
q = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
w = [torch.randn(8, 8, dtype=torch.float64, requires_grad=True) for _ in range(4)]
out = kdnn.multi_head_attention(q, q, q, *w, heads=2, window=([0] * 5, [5] * 5))
m = kdnn.nn.MultiheadAttention(8, 2, dtype=torch.float64)
out2 = m(q, q, q)
print("alive")
""")
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr, done.stderr
