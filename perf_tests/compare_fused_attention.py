#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Time kdnn's fused and unfused scaled-dot-product attention
(perf_tests/bench_fused_attention.cpp) and PyTorch's
F.scaled_dot_product_attention (float32, autograd for the backward) at the
same sizes in one run, and print one markdown table: phase, size, time,
GFLOP/s (4·B·H·S·Sk·D forward, 2.5 times that backward) and peak memory of
each, and the ratio PyTorch / kdnn fused (> 1: kdnn faster). Up to
--f64-max-seq (default 2048) a second table times kdnn's fused attention in
float64 against PyTorch's float64 SDPA.

Peak memory: kdnn's is the most Kokkos held during the phase (inputs,
outputs, what the forward keeps, the phase's allocations); PyTorch's is the
growth of the process's peak resident memory from just before the inputs
exist to the end of one forward (forward) or forward + backward (backward)
(Linux's VmHWM, reset first), measured in a fresh process per size and
phase (on a GPU: torch.cuda.max_memory_allocated). PyTorch runs on
--torch-threads threads (default 2).

  python perf_tests/compare_fused_attention.py --bench build/serial/perf_tests/kdnn_perf_fused_attention
  python perf_tests/compare_fused_attention.py --device cuda --bench build/cuda/perf_tests/kdnn_perf_fused_attention
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gbench import median_runs  # noqa: E402
import result_rows  # noqa: E402

PHASES = ("forward", "backward")


def parse_sizes(text):
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]


def flops(phase, B, H, S, Sk, D):
    return 4.0 * B * H * S * Sk * D * {"forward": 1.0, "backward": 2.5, "fwd+bwd": 3.5}[phase]


def inputs(size, device, dtype=torch.float32):
    B, H, S, Sk, D = size
    g = torch.Generator(device="cpu").manual_seed(0)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype).to(  # noqa: E731
        device).requires_grad_()
    return (make(B, H, S, D), make(B, H, Sk, D), make(B, H, Sk, D),
            torch.randn(B, H, S, D, dtype=dtype).to(device))


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def torch_times(size, device, repetitions, dtype=torch.float32):
    q, k, v, g = inputs(size, device, dtype)
    times = {p: [] for p in PHASES}
    for rep in range(repetitions + 1):  # the first is a warm-up
        sync(device)
        t0 = time.perf_counter()
        o = F.scaled_dot_product_attention(q, k, v)
        sync(device)
        t1 = time.perf_counter()
        o.backward(g)
        sync(device)
        t2 = time.perf_counter()
        q.grad = k.grad = v.grad = None
        if rep > 0:
            times["forward"].append((t1 - t0) * 1e3)
            times["backward"].append((t2 - t1) * 1e3)
    return {p: statistics.median(t) for p, t in times.items()}


def torch_peak_mib(size, phase, device):
    """Runs in a fresh process (see --peak-of); MiB."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        # Linux: writing 5 to clear_refs resets the peak resident size (VmHWM).
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = resident_kib("VmRSS")
    q, k, v, g = inputs(size, device)
    o = F.scaled_dot_product_attention(q, k, v)
    if phase == "backward":
        o.backward(g)
    sync(device)
    if device == "cuda":
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    return (resident_kib("VmHWM") - base) / 1024


def resident_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="kdnn_perf_fused_attention")
    ap.add_argument("--sizes", default="8x4x128x128x64,1x8x2048x2048x64")
    ap.add_argument("--unfused-max-seq", type=int, default=4096,
                    help="skip kdnn's unfused path above this S (its [B,H,S,Sk] tensors)")
    ap.add_argument("--f64-max-seq", type=int, default=2048,
                    help="time the float64 fused attention (kdnn and PyTorch) up to this S")
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--json", help="also write the rows in result_rows.py's form here")
    ap.add_argument("--peak-of", help=argparse.SUPPRESS)  # internal: SIZE:PHASE in this process
    args = ap.parse_args()
    torch.set_num_threads(args.torch_threads)
    if args.peak_of:
        size, phase = args.peak_of.split(":")
        print(json.dumps(torch_peak_mib(parse_sizes(size)[0], phase, args.device)))
        return

    sizes = parse_sizes(args.sizes)
    kdnn = {}
    for size in sizes:
        arg = "--kdnn_sizes=" + "x".join(map(str, size))
        wanted = ["sdpa_f32/fused"]
        if size[2] <= args.unfused_max_seq:
            wanted.append("sdpa_f32/unfused")
        if size[2] <= args.f64_max_seq:
            wanted.append("sdpa_f64/")
        filt = "--benchmark_filter=" + "|".join(wanted)
        reps = args.repetitions if size[2] * size[3] <= 2048 * 2048 else 1
        for parts, result in median_runs(args.bench, [arg, filt], reps).items():
            # sdpa_f32/<path>_<phase>/B/H/S/Sk/D/real_time (sdpa_f64: float64, fused only)
            path, phase = parts[1].split("_")
            if parts[0] == "sdpa_f64":
                path += "64"
            kdnn[(path, phase, size)] = result
    rows = []
    for size in sizes:
        reps = args.repetitions if size[2] * size[3] <= 2048 * 2048 else 1
        times = torch_times(size, args.device, reps)
        for phase in PHASES:
            peak = json.loads(subprocess.run(
                [sys.executable, __file__, "--bench", args.bench, "--device", args.device,
                 "--torch-threads", str(args.torch_threads),
                 "--peak-of", "x".join(map(str, size)) + ":" + phase],
                check=True, capture_output=True, text=True).stdout)
            rows.append((phase, size, kdnn.get(("fused", phase, size)),
                         kdnn.get(("unfused", phase, size)), times[phase], peak))
        # The training step the targets name: forward + backward.
        fwd, bwd = rows[-2], rows[-1]
        both = lambda a, b: None if a is None else (  # noqa: E731
            a[0] + b[0], {"peak_MiB": max(a[1]["peak_MiB"], b[1]["peak_MiB"])})
        rows.append(("fwd+bwd", size, both(fwd[2], bwd[2]), both(fwd[3], bwd[3]),
                     fwd[4] + bwd[4], max(fwd[5], bwd[5])))

    gf = lambda phase, size, ms: flops(phase, *size) / (ms * 1e-3) / 1e9  # noqa: E731
    print("| phase | B, H, S, Sk, D | fused ms | unfused ms | PyTorch ms | PyTorch / fused "
          "| fused GFLOP/s | PyTorch GFLOP/s | fused MiB | unfused MiB | PyTorch MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for phase, size, fused, unfused, torch_ms, peak in rows:
        f_ms, f_c = fused
        u = f"{unfused[0]:.1f}" if unfused else "-"
        u_mib = f"{unfused[1]['peak_MiB']:.0f}" if unfused else "-"
        print(f"| {phase} | {', '.join(map(str, size))} | {f_ms:.1f} | {u} | {torch_ms:.1f} "
              f"| {torch_ms / f_ms:.2f}x | {gf(phase, size, f_ms):.1f} "
              f"| {gf(phase, size, torch_ms):.1f} | {f_c['peak_MiB']:.0f} | {u_mib} | {peak:.0f} |")
    json_rows = []
    for phase, size, fused, unfused, torch_ms, _ in rows:
        json_rows.append(result_rows.row("attention", "fused " + phase, size, fused[0],
                                         "PyTorch SDPA float32", torch_ms))
        if unfused:
            json_rows.append(result_rows.row("attention", "unfused " + phase, size, unfused[0],
                                             "PyTorch SDPA float32", torch_ms))
        host_form = kdnn.get(("fusedhost", phase, size))
        if host_form:  # the host form pinned (on a GPU: the kernels before the GPU forms)
            json_rows.append(result_rows.row("attention", "fused host-form " + phase, size,
                                             host_form[0], "PyTorch SDPA float32", torch_ms))

    # float64: kdnn's fused attention against PyTorch's float64 SDPA.
    rows64 = []
    for size in sizes:
        if size[2] > args.f64_max_seq or ("fused64", "forward", size) not in kdnn:
            continue
        times = torch_times(size, args.device, args.repetitions, torch.float64)
        for phase in PHASES:
            rows64.append((phase, size, kdnn[("fused64", phase, size)][0], times[phase]))
        fwd, bwd = rows64[-2], rows64[-1]
        rows64.append(("fwd+bwd", size, fwd[2] + bwd[2], fwd[3] + bwd[3]))
    if rows64:
        print("\nfloat64:\n")
        print("| phase | B, H, S, Sk, D | fused ms | PyTorch ms | PyTorch / fused "
              "| fused GFLOP/s | PyTorch GFLOP/s |")
        print("|---|---|---|---|---|---|---|")
    for phase, size, f_ms, torch_ms in rows64:
        print(f"| {phase} | {', '.join(map(str, size))} | {f_ms:.2f} | {torch_ms:.2f} "
              f"| {torch_ms / f_ms:.2f}x | {gf(phase, size, f_ms):.1f} "
              f"| {gf(phase, size, torch_ms):.1f} |")
        json_rows.append(result_rows.row("attention", "fused float64 " + phase, size, f_ms,
                                         "PyTorch SDPA float64", torch_ms, dtype="float64"))
    result_rows.write(args.json, json_rows)


if __name__ == "__main__":
    main()
