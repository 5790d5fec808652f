#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Time kdnn's multi-head attention layer (perf_tests/bench_mha.cpp) and the
same math in PyTorch float32 (F.linear, per-head matmul, softmax, matmul,
F.linear, autograd for the backward) at the same sizes in one run, and print
one table: phase, size, kdnn ms, PyTorch ms, ratio (PyTorch / kdnn; > 1 means
kdnn is faster) and both GFLOP/s (counted as in bench_mha.cpp).

Phases: forward (PyTorch: recording the autograd graph, as in training),
backward (data and weights: PyTorch's out.backward(dout)), step (both).

  /usr/bin/python3 perf_tests/compare_mha.py --bench build/serial/perf_tests/kdnn_perf_mha
  python3 perf_tests/compare_mha.py --device cuda --bench build/cuda/perf_tests/kdnn_perf_mha \\
      --sizes 8x4x128x128x64,2x4x1024x1024x64,1x8x2048x2048x64
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gbench import median_times_ms  # noqa: E402
import result_rows  # noqa: E402

PHASES = ("forward", "backward", "step")


def parse_sizes(text):
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]


def forward_flops(B, H, S, Sk, D):
    E = H * D
    return 2 * B * (S + 2 * Sk) * E * H * D + 2 * B * S * H * D * E + 4 * B * H * S * Sk * D


def run_kdnn(bench, sizes, repetitions):
    arg = "--kdnn_sizes=" + ",".join("x".join(map(str, s)) for s in sizes)
    results = {}
    for parts, ms in median_times_ms(bench, [arg], repetitions).items():
        # mha_f32/<phase>/B/H/S/Sk/D/real_time
        results[(parts[1], tuple(int(p) for p in parts[2:7]))] = ms
    return results


def torch_layer(q, k, v, w, H):
    """The layer of kdnn/attention/mha.hpp: projections, per-head scaled
    softmax(Q Kᵀ) V, heads side by side, output projection."""
    B, S, _ = q.shape
    Sk = k.shape[1]
    D = w["q"].shape[0] // H
    Q = F.linear(q, w["q"], w["bq"]).view(B, S, H, D).transpose(1, 2)
    K = F.linear(k, w["k"], w["bk"]).view(B, Sk, H, D).transpose(1, 2)
    V = F.linear(v, w["v"], w["bv"]).view(B, Sk, H, D).transpose(1, 2)
    P = torch.softmax(torch.matmul(Q, K.transpose(-1, -2)) / D ** 0.5, dim=-1)
    A = torch.matmul(P, V).transpose(1, 2).reshape(B, S, H * D)
    return F.linear(A, w["o"], w["bo"])


def run_torch(sizes, repeats, device):
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    results = {}
    for (B, H, S, Sk, D) in sizes:
        E = H * D
        g = torch.Generator().manual_seed(0)

        def rand(*shape, scale=1.0):
            return (torch.randn(*shape, generator=g) * scale).to(device).requires_grad_()

        w = {"q": rand(E, E, scale=E ** -0.5), "k": rand(E, E, scale=E ** -0.5),
             "v": rand(E, E, scale=E ** -0.5), "o": rand(E, E, scale=E ** -0.5),
             "bq": rand(E), "bk": rand(E), "bv": rand(E), "bo": rand(E)}
        q, k, v = rand(B, S, E), rand(B, Sk, E), rand(B, Sk, E)
        dout = torch.randn(B, S, E, generator=g).to(device)
        times = {p: [] for p in PHASES}
        for trial in range(repeats + 1):  # the first is a warm-up
            sync()
            t0 = time.perf_counter()
            out = torch_layer(q, k, v, w, H)
            sync()
            t1 = time.perf_counter()
            out.backward(dout)
            sync()
            t2 = time.perf_counter()
            if trial:
                times["forward"].append(t1 - t0)
                times["backward"].append(t2 - t1)
                times["step"].append(t2 - t0)
            for t in list(w.values()) + [q, k, v]:
                t.grad = None
        for p in PHASES:
            results[(p, (B, H, S, Sk, D))] = 1e3 * statistics.median(times[p])
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True, help="the kdnn_perf_mha executable")
    ap.add_argument("--sizes", default="8x4x128x128x64,2x4x1024x1024x64", help="BxHxSxSkxD,...")
    ap.add_argument("--threads", type=int, default=2, help="PyTorch CPU threads")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="also write the rows in result_rows.py's form here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes = parse_sizes(args.sizes)
    kdnn = run_kdnn(args.bench, sizes, args.repeats)
    ref = run_torch(sizes, args.repeats, args.device)
    rows = []
    print("| phase | B, H, S, Sk, D | kdnn ms | PyTorch ms | ratio | kdnn GFLOP/s | PyTorch GFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    for size in sizes:
        for p in PHASES:
            flops = forward_flops(*size) * {"forward": 1, "backward": 2, "step": 3}[p]
            a, b = kdnn[(p, size)], ref[(p, size)]
            rows.append(result_rows.row("mha", p, size, a, "PyTorch float32", b))
            print(f"| {p} | {', '.join(map(str, size))} | {a:.3f} | {b:.3f} | {b / a:.2f}x "
                  f"| {flops / a * 1e-6:.1f} | {flops / b * 1e-6:.1f} |")
    result_rows.write(args.json, rows)


if __name__ == "__main__":
    main()
