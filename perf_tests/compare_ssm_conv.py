#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Time kdnn's causal depthwise conv1d + SiLU (perf_tests/bench_ssm_conv.cpp)
and PyTorch's formulation of it at the same sizes in one run, and print one
markdown table: phase, size, kdnn time, kdnn GB/s, that bandwidth as a
fraction of the copy bandwidth measured by the same kdnn binary in the same
run (a Kokkos::deep_copy of B·L·C floats), PyTorch time and the ratio
PyTorch / kdnn (> 1: kdnn faster).

PyTorch's formulation is Mamba's reference, from a channel-last x [B, L, C]
(contiguous), transposes included:

  y = F.silu(F.conv1d(F.pad(x.transpose(1, 2), (K - 1, 0)), w.unsqueeze(1),
                      bias, groups=C)).transpose(1, 2)

float32; the backward is autograd's y.backward(dy) giving dx, dw and dbias,
timed alone (the forward before it is not counted). GB/s counts the bytes
each phase must move at least once: forward 2·B·L·C·4 (read x, write y),
backward 3·B·L·C·4 (read x and dy, write dx), plus w. The copy rows show the
reference bandwidth itself (PyTorch's column there: dst.copy_(src)).
PyTorch runs on --torch-threads threads (default 2).

  python perf_tests/compare_ssm_conv.py --bench build/k46/perf_tests/kdnn_perf_ssm_conv
  python perf_tests/compare_ssm_conv.py --device cuda --bench build/cuda/perf_tests/kdnn_perf_ssm_conv

On a GPU the benchmark also times the tiled form (forward_tiled,
backward_tiled: launch.shape = host); those rows follow, against the same
PyTorch times.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gbench import median_runs  # noqa: E402
import result_rows  # noqa: E402

PHASES = ("forward", "backward", "copy")


def parse_sizes(text):
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def conv(x, w, bias):
    K = w.shape[1]
    return F.silu(F.conv1d(F.pad(x.transpose(1, 2), (K - 1, 0)), w.unsqueeze(1), bias,
                           groups=x.shape[2])).transpose(1, 2)


def torch_times(size, device, repetitions):
    """Median ms of the forward, the backward and a copy of x."""
    B, L, C, K = size
    g = torch.Generator(device="cpu").manual_seed(0)
    make = lambda *shape: (torch.rand(*shape, generator=g) * 2 - 1).to(device)  # noqa: E731
    x = make(B, L, C).requires_grad_()
    w = make(C, K).requires_grad_()
    bias = make(C).requires_grad_()
    dy = make(B, L, C)
    times = {p: [] for p in PHASES}
    for rep in range(repetitions + 1):  # the first is a warm-up
        sync(device)
        t0 = time.perf_counter()
        y = conv(x, w, bias)
        sync(device)
        t1 = time.perf_counter()
        y.backward(dy)
        sync(device)
        t2 = time.perf_counter()
        del y
        x.grad = w.grad = bias.grad = None
        if rep > 0:
            times["forward"].append((t1 - t0) * 1e3)
            times["backward"].append((t2 - t1) * 1e3)
    src, dst = dy, torch.empty_like(dy)
    for rep in range(repetitions + 1):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        t1 = time.perf_counter()
        if rep > 0:
            times["copy"].append((t1 - t0) * 1e3)
    return {p: statistics.median(t) for p, t in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="kdnn_perf_ssm_conv")
    ap.add_argument("--sizes", default="8x4096x1024x4,2x16384x2048x4", help="BxLxCxK,...")
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--json", help="also write the rows in result_rows.py's form here")
    args = ap.parse_args()
    torch.set_num_threads(args.torch_threads)

    sizes = parse_sizes(args.sizes)
    kdnn = {}
    for size in sizes:
        arg = "--kdnn_sizes=" + "x".join(map(str, size))
        for parts, result in median_runs(args.bench, [arg], args.repetitions).items():
            # ssm_conv_f32/<phase>/B/L/C/K/real_time
            kdnn[(parts[1], size)] = result
    rows = []
    for size in sizes:
        times = torch_times(size, args.device, args.repetitions)
        copy_gbs = kdnn[("copy", size)][1]["GB/s"]
        for phase in PHASES:
            ms, counters = kdnn[(phase, size)]
            rows.append((phase, size, ms, counters["GB/s"], copy_gbs, times[phase]))
        for phase in ("forward", "backward"):  # the tiled form, on a GPU only
            if (phase + "_tiled", size) in kdnn:
                ms, counters = kdnn[(phase + "_tiled", size)]
                rows.append((phase + "_tiled", size, ms, counters["GB/s"], copy_gbs,
                             times[phase]))
    print("| phase | B, L, C, K | kdnn ms | kdnn GB/s | of copy GB/s | PyTorch ms "
          "| PyTorch / kdnn |")
    print("|---|---|---|---|---|---|---|")
    for phase, size, ms, gbs, copy_gbs, torch_ms in rows:
        print(f"| {phase} | {', '.join(map(str, size))} | {ms:.2f} | {gbs:.2f} "
              f"| {gbs / copy_gbs:.3f} | {torch_ms:.2f} | {torch_ms / ms:.2f}x |")
    result_rows.write(args.json, [
        result_rows.row("ssm-conv", phase, size, ms,
                        "copy" if phase == "copy" else "PyTorch F.conv1d + SiLU", torch_ms,
                        traffic_bytes=gbs * 1e9 * ms * 1e-3, copy_gbps=copy_gbs)
        for phase, size, ms, gbs, copy_gbs, torch_ms in rows])

if __name__ == "__main__":
    main()
