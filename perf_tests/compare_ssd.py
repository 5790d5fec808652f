#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Time kdnn's SSD chunked scan (perf_tests/bench_ssd.cpp) and PyTorch's
chunked formulation of it (kdnn_reference.ssd.ssd_chunked, after Mamba-2's
minimal SSD) at the same sizes in one run, and print one markdown table:
phase, size, kdnn time and GFLOP/s, PyTorch time and the ratio
PyTorch / kdnn (> 1: kdnn faster), and the bytes a rank sends with the
sequence split over 4 ranks (kdnn's state passing) against re-sharding by
heads with all-to-alls.

float32, one group (G = 1), D given, no initial state; PyTorch's backward is
autograd's y.backward(dy) giving dx, ddt, dA, dB, dC and dD, timed alone.
PyTorch runs on --torch-threads threads (default 2).

  python perf_tests/compare_ssd.py --bench build/serial/perf_tests/kdnn_perf_ssd
  python perf_tests/compare_ssd.py --device cuda --bench build/cuda/perf_tests/kdnn_perf_ssd
"""
import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # gbench
sys.path.insert(0, os.path.join(HERE, "..", "unit_tests", "reference"))  # kdnn_reference
from gbench import median_runs  # noqa: E402
import result_rows  # noqa: E402
from kdnn_reference.ssd import ssd_chunked  # noqa: E402

PHASES = ("forward", "backward")


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def torch_times(size, device, repetitions):
    """Median ms of the forward and the backward."""
    B, L, H, P, N, Q = size
    g = torch.Generator(device="cpu").manual_seed(0)

    def make(lo, hi, *shape):
        return (lo + (hi - lo) * torch.rand(*shape, generator=g)).to(device).requires_grad_()

    x, Bm, Cm = make(-1, 1, B, L, H, P), make(-1, 1, B, L, 1, N), make(-1, 1, B, L, 1, N)
    dt, A, D = make(0.001, 0.1, B, L, H), make(-8, -1, H), make(-1, 1, H)
    dy = torch.rand(B, L, H, P, generator=g).to(device)
    times = {p: [] for p in PHASES}
    for rep in range(repetitions + 1):  # the first is a warm-up
        sync(device)
        t0 = time.perf_counter()
        y, _ = ssd_chunked(x, dt, A, Bm, Cm, Q, D)
        sync(device)
        t1 = time.perf_counter()
        y.backward(dy)
        sync(device)
        t2 = time.perf_counter()
        del y
        for t in (x, Bm, Cm, dt, A, D):
            t.grad = None
        if rep > 0:
            times["forward"].append((t1 - t0) * 1e3)
            times["backward"].append((t2 - t1) * 1e3)
    return {p: statistics.median(t) for p, t in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="kdnn_perf_ssd")
    ap.add_argument("--sizes", default="2x4096x8x64x64x64,2x16384x8x64x64x64",
                    help="BxLxHxPxNxQ,...")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--json", help="also write the rows in result_rows.py's form here")
    args = ap.parse_args()
    torch.set_num_threads(args.torch_threads)

    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",") if s]
    kdnn = {}
    for size in sizes:
        arg = "--kdnn_sizes=" + "x".join(map(str, size))
        for parts, result in median_runs(args.bench, [arg], args.repetitions).items():
            kdnn[(parts[1], size)] = result  # ssd_f32/<phase>/B/L/H/P/N/Q/real_time
    print("| phase | B, L, H, P, N, Q | kdnn ms | kdnn GFLOP/s | PyTorch ms | PyTorch / kdnn "
          "| state bytes / rank (R=4) | all-to-all bytes / rank (R=4) |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for size in sizes:
        times = torch_times(size, args.device, args.repetitions)
        for phase in PHASES:
            ms, c = kdnn[(phase, size)]
            print(f"| {phase} | {', '.join(map(str, size))} | {ms:.1f} | {c['GFLOP/s']:.2f} "
                  f"| {times[phase]:.1f} | {times[phase] / ms:.2f}x "
                  f"| {int(c['state_bytes_r4'])} | {int(c['a2a_bytes_r4'])} |")
            rows.append(result_rows.row("ssd", phase, size, ms, "chunked PyTorch",
                                        times[phase]))
    result_rows.write(args.json, rows)


if __name__ == "__main__":
    main()
