#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Time kdnn's fused scaled-dot-product attention (kdnn.flash_attention,
through the kdnn package where it is importable) and PyTorch's
F.scaled_dot_product_attention (float32, autograd for the backward) on the
same inputs in one process, and print one markdown table: phase, size,
kdnn's device and call times and its C++ benchmark time
(perf_tests/bench_fused_attention.cpp) as a cross-check, the unfused path's
benchmark time, PyTorch's device and call times, the ratio PyTorch / kdnn by
device time (> 1: kdnn faster; device_timing.py says how each is measured),
GFLOP/s from the device times (4·B·H·S·Sk·D forward, 2.5 times that
backward) and peak memory. fwd+bwd is the sum of the two phases. Up to
--f64-max-seq (default 2048) a second table does the same in float64. A
third table is the single-pass TF32 choice: kdnn with allow_tf32=True beside
PyTorch with torch.backends.cuda.matmul.allow_tf32 = True (fwd+bwd device
times), and each side's largest error in o against float64, with and
without it.

Peak memory: kdnn's is the most Kokkos held during the phase in the C++
benchmark (inputs, outputs, what the forward keeps, the phase's
allocations); PyTorch's is the growth of the process's peak resident memory
from just before the inputs exist to the end of one forward (forward) or
forward + backward (backward) (Linux's VmHWM, reset first), measured in a
fresh process per size and phase (on a GPU: torch.cuda.max_memory_allocated).
PyTorch runs on --torch-threads threads (default 2).

  python perf_tests/compare_fused_attention.py --bench build/serial/perf_tests/kdnn_perf_fused_attention
  python perf_tests/compare_fused_attention.py --device cuda --bench build/cuda/perf_tests/kdnn_perf_fused_attention
"""
import argparse
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_timing import (  # noqa: E402
    Times, call_cell, device_and_call, forward_backward, kdnn_package, method_line)
from gbench import median_runs  # noqa: E402
import result_rows  # noqa: E402

PHASES = ("forward", "backward")
ROWS = PHASES + ("fwd+bwd",)  # the training step the targets name: forward + backward


def parse_sizes(text):
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]


def flops(phase, B, H, S, Sk, D):
    return 4.0 * B * H * S * Sk * D * {"forward": 1.0, "backward": 2.5, "fwd+bwd": 3.5}[phase]


def inputs(size, device, dtype=torch.float32):
    """q, k, v (leaves requiring grad) and dout of one size, the same values
    on every call."""
    B, H, S, Sk, D = size
    gen = torch.Generator(device="cpu").manual_seed(0)
    make = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype).to(device)  # noqa: E731
    return (make(B, H, S, D).requires_grad_(), make(B, H, Sk, D).requires_grad_(),
            make(B, H, Sk, D).requires_grad_(), make(B, H, S, D))


def timed(attention, size, device, repeats, dtype=torch.float32):
    """device_timing.Times of the forward and of the backward of
    attention(q, k, v), each phase alone, and their sum (fwd+bwd)."""
    q, k, v, dout = inputs(size, device, dtype)
    times = forward_backward(device, repeats, lambda: attention(q, k, v), dout, (q, k, v))
    times["fwd+bwd"] = Times(*(f + b for f, b in zip(times["forward"], times["backward"])))
    return times


def kdnn_attention(kdnn, allow_tf32=False):
    """kdnn.flash_attention as SDPA's call (None without the package)."""
    if kdnn is None:
        return None
    return lambda q, k, v: kdnn.flash_attention(q, k, v, causal=False, scale=q.shape[-1] ** -0.5,
                                                allow_tf32=allow_tf32)


def tf32_table(kdnn, sizes, device, repeats, rows):
    """The single-pass TF32 rows (see above); nothing without the package."""
    if kdnn is None:
        return
    print("\nsingle-pass TF32 (kdnn allow_tf32=True; PyTorch matmul.allow_tf32 = True):\n")
    print("| B, H, S, Sk, D | kdnn fwd+bwd device | PyTorch fwd+bwd device | PyTorch / kdnn "
          "| kdnn error | kdnn 3xTF32 error | PyTorch error | PyTorch default error |")
    print("|---|---|---|---|---|---|---|---|")
    cuda = torch.backends.cuda.matmul
    default = cuda.allow_tf32
    for size in sizes:
        q, k, v, _ = (x.detach() for x in inputs(size, device))
        exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        error = lambda attention: (attention(q, k, v).double() - exact).abs().max().item()  # noqa: E731
        mine_default = error(kdnn_attention(kdnn))
        ref_default = error(F.scaled_dot_product_attention)
        try:
            cuda.allow_tf32 = True
            mine = timed(kdnn_attention(kdnn, True), size, device, repeats)["fwd+bwd"]
            ref = timed(F.scaled_dot_product_attention, size, device, repeats)["fwd+bwd"]
            mine_error = error(kdnn_attention(kdnn, True))
            ref_error = error(F.scaled_dot_product_attention)
        finally:
            cuda.allow_tf32 = default
        print(f"| {', '.join(map(str, size))} | {mine.device_ms:.3f} | {ref.device_ms:.3f} "
              f"| {ref.device_ms / mine.device_ms:.2f}x | {mine_error:.2e} | {mine_default:.2e} "
              f"| {ref_error:.2e} | {ref_default:.2e} |")
        rows.append(result_rows.row("attention", "fused tf32 fwd+bwd", size, mine,
                                    "PyTorch SDPA float32 allow_tf32", ref))


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
    if device == "cuda":
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    return (resident_kib("VmHWM") - base) / 1024


def resident_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def gflops(phase, size, ms):
    return flops(phase, *size) / (ms * 1e-3) / 1e9


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="kdnn_perf_fused_attention")
    ap.add_argument("--sizes", default="8x4x128x128x64,1x8x2048x2048x64")
    ap.add_argument("--unfused-max-seq", type=int, default=4096,
                    help="skip kdnn's unfused path above this S (its [B,H,S,Sk] tensors)")
    ap.add_argument("--f64-max-seq", type=int, default=2048,
                    help="time the float64 fused attention (kdnn and PyTorch) up to this S")
    ap.add_argument("--repetitions", type=int, default=5,
                    help="of the C++ benchmark (its median; 1 above S·Sk = 2048²)")
    ap.add_argument("--repeats", type=int, default=10,
                    help="timed runs of each Python-side implementation (median; at least 10)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--json", help="also write the rows in result_rows.py's form here")
    ap.add_argument("--peak-of", help=argparse.SUPPRESS)  # internal: SIZE:PHASE in this process
    return ap.parse_args()


def bench_times(args, sizes):
    """The C++ benchmark's (median ms, counters) by (path, phase, size):
    path fused, unfused, fusedhost or fused64, phase each of ROWS."""
    bench = {}
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
            bench[(path, phase, size)] = result
        for path in {p for p, _, s in bench if s == size}:
            (f_ms, f_c), (b_ms, b_c) = (bench[(path, p, size)] for p in PHASES)
            bench[(path, "fwd+bwd", size)] = (f_ms + b_ms, {
                "peak_MiB": max(f_c["peak_MiB"], b_c["peak_MiB"])})
    return bench


def torch_peaks(args, size):
    """PyTorch's peak memory (MiB) by phase of ROWS, each phase measured in
    a fresh process (torch_peak_mib)."""
    peak = {phase: json.loads(subprocess.run(
        [sys.executable, __file__, "--bench", args.bench, "--device", args.device,
         "--torch-threads", str(args.torch_threads),
         "--peak-of", "x".join(map(str, size)) + ":" + phase],
        check=True, capture_output=True, text=True).stdout) for phase in PHASES}
    peak["fwd+bwd"] = max(peak.values())
    return peak


def float32_table(args, sizes, bench, module, rows):
    """The float32 table: kdnn (the package's module, else the C++
    benchmark's times) and its unfused path beside PyTorch."""
    print("| phase | B, H, S, Sk, D | kdnn device | kdnn call | kdnn bench | unfused bench "
          "| PyTorch device | PyTorch call | PyTorch / kdnn | kdnn GFLOP/s | PyTorch GFLOP/s "
          "| kdnn MiB | unfused MiB | PyTorch MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        reference = timed(F.scaled_dot_product_attention, size, args.device, args.repeats)
        kdnn = timed(module, size, args.device, args.repeats) if module else None
        peak = torch_peaks(args, size)
        for phase in ROWS:
            bench_ms, c = bench[("fused", phase, size)]
            mine, ref = kdnn[phase] if kdnn else bench_ms, reference[phase]
            ms = device_and_call(mine)[0]
            unfused = bench.get(("unfused", phase, size))
            u_ms = f"{unfused[0]:.3f}" if unfused else "-"
            u_mib = f"{unfused[1]['peak_MiB']:.0f}" if unfused else "-"
            print(f"| {phase} | {', '.join(map(str, size))} | {ms:.3f} | {call_cell(mine)} "
                  f"| {bench_ms:.3f} | {u_ms} | {ref.device_ms:.3f} | {ref.call_ms:.3f} "
                  f"| {ref.device_ms / ms:.2f}x | {gflops(phase, size, ms):.1f} "
                  f"| {gflops(phase, size, ref.device_ms):.1f} | {c['peak_MiB']:.0f} | {u_mib} "
                  f"| {peak[phase]:.0f} |")
            rows.append(result_rows.row("attention", "fused " + phase, size, mine,
                                        "PyTorch SDPA float32", ref, bench_ms=bench_ms))
            if unfused:
                rows.append(result_rows.row("attention", "unfused " + phase, size, unfused[0],
                                            "PyTorch SDPA float32", ref, bench_ms=unfused[0]))
            host_form = bench.get(("fusedhost", phase, size))
            if host_form:  # the host form pinned (on a GPU: the kernels before the GPU forms)
                rows.append(result_rows.row("attention", "fused host-form " + phase, size,
                                            host_form[0], "PyTorch SDPA float32", ref,
                                            bench_ms=host_form[0]))


def float64_table(args, sizes, bench, module, rows):
    """float64: kdnn's fused attention against PyTorch's float64 SDPA."""
    sizes64 = [s for s in sizes if s[2] <= args.f64_max_seq and ("fused64", "forward", s) in bench]
    if sizes64:
        print("\nfloat64:\n")
        print("| phase | B, H, S, Sk, D | kdnn device | kdnn call | kdnn bench | PyTorch device "
              "| PyTorch call | PyTorch / kdnn | kdnn GFLOP/s | PyTorch GFLOP/s |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    for size in sizes64:
        reference = timed(F.scaled_dot_product_attention, size, args.device, args.repeats,
                          torch.float64)
        kdnn = timed(module, size, args.device, args.repeats, torch.float64) if module else None
        for phase in ROWS:
            bench_ms = bench[("fused64", phase, size)][0]
            mine, ref = kdnn[phase] if kdnn else bench_ms, reference[phase]
            ms = device_and_call(mine)[0]
            print(f"| {phase} | {', '.join(map(str, size))} | {ms:.3f} | {call_cell(mine)} "
                  f"| {bench_ms:.3f} | {ref.device_ms:.3f} | {ref.call_ms:.3f} "
                  f"| {ref.device_ms / ms:.2f}x | {gflops(phase, size, ms):.1f} "
                  f"| {gflops(phase, size, ref.device_ms):.1f} |")
            rows.append(result_rows.row("attention", "fused float64 " + phase, size, mine,
                                        "PyTorch SDPA float64", ref, dtype="float64",
                                        bench_ms=bench_ms))


def main():
    args = parse_args()
    torch.set_num_threads(args.torch_threads)
    if args.peak_of:
        size, phase = args.peak_of.split(":")
        print(json.dumps(torch_peak_mib(parse_sizes(size)[0], phase, args.device)))
        return

    sizes = parse_sizes(args.sizes)
    bench = bench_times(args, sizes)
    module = kdnn_attention(kdnn_package())
    print(method_line(module, "PyTorch", "the unfused path"))
    rows = []
    float32_table(args, sizes, bench, module, rows)
    float64_table(args, sizes, bench, module, rows)
    tf32_table(kdnn_package(), sizes, args.device, args.repeats, rows)
    result_rows.write(args.json, rows)


if __name__ == "__main__":
    main()
