#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Time kdnn's multi-head attention layer (kdnn.multi_head_attention,
through the kdnn package where it is importable) and the same math in
PyTorch float32 (F.linear, per-head matmul, softmax, matmul, F.linear,
autograd for the backward) on the same inputs in one process, and print one
table: phase, size, kdnn's device and call times and its C++ benchmark time
(perf_tests/bench_mha.cpp) as a cross-check, PyTorch's device and call
times, the ratio PyTorch / kdnn by device time (> 1: kdnn faster;
device_timing.py says how each is measured) and both GFLOP/s from the device
times (counted as in bench_mha.cpp).

Phases: forward (recording the autograd graph, as in training), backward
(data and weights: out.backward(dout)), step (both, timed as one).

  /usr/bin/python3 perf_tests/compare_mha.py --bench build/serial/perf_tests/kdnn_perf_mha
  python3 perf_tests/compare_mha.py --device cuda --bench build/cuda/perf_tests/kdnn_perf_mha \\
      --sizes 8x4x128x128x64,2x4x1024x1024x64,1x8x2048x2048x64
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_timing import (  # noqa: E402
    PhaseTimer, call_cell, device_and_call, kdnn_package, method_line)
from gbench import median_times_ms  # noqa: E402
import result_rows  # noqa: E402

PHASES = ("forward", "backward", "step")


def parse_sizes(text):
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]


def forward_flops(B, H, S, Sk, D):
    E = H * D
    return 2 * B * (S + 2 * Sk) * E * H * D + 2 * B * S * H * D * E + 4 * B * H * S * Sk * D


def run_bench(bench, sizes, repetitions):
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


def kdnn_layer(kdnn):
    """kdnn.multi_head_attention as torch_layer's call (None without the package)."""
    if kdnn is None:
        return None
    return lambda q, k, v, w, H: kdnn.multi_head_attention(
        q, k, v, w["q"], w["k"], w["v"], w["o"], w["bq"], w["bk"], w["bv"], w["bo"], heads=H)


def timed(layer, size, device, repeats):
    """device_timing.Times of the forward, the backward and the step (both)
    of layer(q, k, v, w, H), each phase alone."""
    B, H, S, Sk, D = size
    E = H * D
    g = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device).requires_grad_()

    w = {"q": rand(E, E, scale=E ** -0.5), "k": rand(E, E, scale=E ** -0.5),
         "v": rand(E, E, scale=E ** -0.5), "o": rand(E, E, scale=E ** -0.5),
         "bq": rand(E), "bk": rand(E), "bv": rand(E), "bo": rand(E)}
    q, k, v = rand(B, S, E), rand(B, Sk, E), rand(B, Sk, E)
    dout = torch.randn(B, S, E, generator=g).to(device)
    held = {}

    def clear_grads():
        for t in list(w.values()) + [q, k, v]:
            t.grad = None

    def one_run(phase):
        with phase("forward"):
            held["out"] = layer(q, k, v, w, H)
        with phase("backward"):
            held.pop("out").backward(dout)
        clear_grads()
        with phase("step"):
            layer(q, k, v, w, H).backward(dout)
        clear_grads()

    return PhaseTimer(device, repeats).run(one_run)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True, help="the kdnn_perf_mha executable")
    ap.add_argument("--sizes", default="8x4x128x128x64,2x4x1024x1024x64", help="BxHxSxSkxD,...")
    ap.add_argument("--threads", type=int, default=2, help="PyTorch CPU threads")
    ap.add_argument("--repetitions", type=int, default=5,
                    help="of the C++ benchmark (its median)")
    ap.add_argument("--repeats", type=int, default=10,
                    help="timed runs of each Python-side implementation (median; at least 10)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="also write the rows in result_rows.py's form here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes = parse_sizes(args.sizes)
    bench = run_bench(args.bench, sizes, args.repetitions)
    module = kdnn_layer(kdnn_package())
    print(method_line(module, "PyTorch"))
    print("| phase | B, H, S, Sk, D | kdnn device | kdnn call | kdnn bench | kdnn GFLOP/s "
          "| PyTorch device | PyTorch call | PyTorch / kdnn | PyTorch GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for size in sizes:
        kdnn = timed(module, size, args.device, args.repeats) if module else None
        reference = timed(torch_layer, size, args.device, args.repeats)
        for p in PHASES:
            flops = forward_flops(*size) * {"forward": 1, "backward": 2, "step": 3}[p]
            bench_ms, ref = bench[(p, size)], reference[p]
            mine = kdnn[p] if kdnn else bench_ms
            ms = device_and_call(mine)[0]
            print(f"| {p} | {', '.join(map(str, size))} | {ms:.3f} | {call_cell(mine)} "
                  f"| {bench_ms:.3f} "
                  f"| {flops / ms * 1e-6:.1f} | {ref.device_ms:.3f} | {ref.call_ms:.3f} "
                  f"| {ref.device_ms / ms:.2f}x | {flops / ref.device_ms * 1e-6:.1f} |")
            rows.append(result_rows.row("mha", p, size, mine, "PyTorch float32", ref,
                                        bench_ms=bench_ms))
    result_rows.write(args.json, rows)


if __name__ == "__main__":
    main()
