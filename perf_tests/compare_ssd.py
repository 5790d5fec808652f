#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Time kdnn's SSD chunked scan and PyTorch's chunked formulation of it
(kdnn_reference.ssd.ssd_chunked, after Mamba-2's minimal SSD) at the same
sizes in one process, and print one markdown table: phase, size, kdnn's
device and call times (through the kdnn package where it is importable) and
its C++ benchmark time (perf_tests/bench_ssd.cpp) as a cross-check, GFLOP/s,
the reference's device and call times and the ratio reference / kdnn by
device time (> 1: kdnn faster; device_timing.py says how each is measured),
and the bytes a rank sends with the sequence split over 4 ranks (kdnn's
state passing) against re-sharding by heads with all-to-alls.

float32, one group (G = 1), D given, no initial state; the backward is
autograd's y.backward(dy) giving dx, ddt, dA, dB, dC and dD, timed alone.
PyTorch runs on --torch-threads threads (default 2).

  python perf_tests/compare_ssd.py --bench build/serial/perf_tests/kdnn_perf_ssd
  python perf_tests/compare_ssd.py --device cuda --bench build/cuda/perf_tests/kdnn_perf_ssd

With --mamba-root, also mamba's own Triton kernels (mamba_chunk_scan_combined,
perf_tests/mamba_triton.py) on the same inputs, as further reference rows; with
--accuracy, each implementation's error against float64 at the first size.
"""
import argparse
import functools
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # gbench
sys.path.insert(0, os.path.join(HERE, "..", "unit_tests", "reference"))  # kdnn_reference
from device_timing import (  # noqa: E402
    call_cell, device_and_call, forward_backward, kdnn_package, method_line)
from gbench import median_runs  # noqa: E402
import mamba_triton  # noqa: E402
import result_rows  # noqa: E402
from kdnn_reference.ssd import ssd_chunked  # noqa: E402

PHASES = ("forward", "backward")


def inputs(size, device, dtype=torch.float32):
    """x, dt, A, B, C, D (leaves requiring grad) and dy of one size, the
    same values on every device and in every dtype."""
    B, L, H, P, N, Q = size
    g = torch.Generator(device="cpu").manual_seed(0)

    def make(lo, hi, *shape):
        t = lo + (hi - lo) * torch.rand(*shape, generator=g, dtype=torch.float64)
        return t.to(device=device, dtype=dtype).requires_grad_()

    x, Bm, Cm = make(-1, 1, B, L, H, P), make(-1, 1, B, L, 1, N), make(-1, 1, B, L, 1, N)
    dt, A, D = make(0.001, 0.1, B, L, H), make(-8, -1, H), make(-1, 1, H)
    dy = torch.rand(B, L, H, P, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    return (x, dt, A, Bm, Cm, D), dy


def run(ssd, size, operands, dy):
    """y and the gradients (dx, ddt, dA, dB, dC, dD) of one forward and backward."""
    x, dt, A, Bm, Cm, D = operands
    y, _ = ssd(x, dt, A, Bm, Cm, size[5], D)
    y.backward(dy)
    grads = [t.grad for t in operands]
    for t in operands:
        t.grad = None
    return y.detach(), grads


def timed(ssd, size, device, repeats):
    """device_timing.Times of the forward and of the backward of `ssd`
    (ssd_chunked's arguments and result), each phase alone."""
    operands, dy = inputs(size, device)
    x, dt, A, Bm, Cm, D = operands
    return forward_backward(device, repeats, lambda: ssd(x, dt, A, Bm, Cm, size[5], D)[0], dy,
                            operands)


def accuracy(size, device, implementations):
    """Prints each float32 implementation's largest error, relative to the
    largest magnitude, in y and in the gradients, against the same
    formulation in float64 (equal to the recurrence to rounding)."""
    operands, dy = inputs(size, device, torch.float64)
    y64, grads64 = run(ssd_chunked, size, operands, dy)
    print(f"\nAccuracy at (B, L, H, P, N, Q) = {size}, float32 against float64 "
          "(max |error| / max |reference|):\n")
    print("| implementation | y | dx | ddt | dA | dB | dC | dD |")
    print("|---|---|---|---|---|---|---|---|")
    for name, ssd in implementations.items():
        operands, dy = inputs(size, device)
        y, grads = run(ssd, size, operands, dy)
        ey, egrads = mamba_triton.relative_errors(y, grads, y64, grads64)
        print(f"| {name} | " + " | ".join(f"{e:.1e}" for e in [ey] + egrads) + " |")


def kdnn_ssd(kdnn):
    """kdnn.ssd in ssd_chunked's form (None without the package)."""
    if kdnn is None:
        return None
    return lambda x, dt, A, Bm, Cm, Q, D: (kdnn.ssd(x, dt, A, Bm, Cm, D, chunk_size=Q), None)


def print_forms(forms):
    """The benchmark's time of each kernel form (bench_ssd.cpp: FMAs, tensor
    cores with 3×TF32, one TF32 pass) where it ran more than one."""
    names = ["automatic", "gpu", "tensor_cores", "tf32"]
    if not any(len(by_form) > 1 for by_form in forms.values()):
        return
    print("\nkdnn's forms (Google Benchmark, ms, fenced):\n")
    print("| phase | B, L, H, P, N, Q | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for (phase, size), by_form in forms.items():
        cells = [f"{by_form[n][0]:.3f}" if n in by_form else "-" for n in names]
        print(f"| {phase} | {', '.join(map(str, size))} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="kdnn_perf_ssd")
    ap.add_argument("--sizes", default="2x4096x8x64x64x64,2x16384x8x64x64x64",
                    help="BxLxHxPxNxQ,...")
    ap.add_argument("--repetitions", type=int, default=3,
                    help="of the C++ benchmark (its median)")
    ap.add_argument("--repeats", type=int, default=10,
                    help="timed runs of each Python-side implementation (median; at least 10)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--json", help="also write the rows in result_rows.py's form here")
    ap.add_argument("--mamba-root", help="a state-spaces/mamba checkout: also time its Triton "
                    "mamba_chunk_scan_combined (CUDA) on the same inputs")
    ap.add_argument("--accuracy", action="store_true",
                    help="also print each implementation's error against float64 at the "
                    "first size (kdnn's through the kdnn package, where importable)")
    args = ap.parse_args()
    torch.set_num_threads(args.torch_threads)

    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",") if s]
    bench, forms = {}, {}
    for size in sizes:
        arg = "--kdnn_sizes=" + "x".join(map(str, size))
        for parts, result in median_runs(args.bench, [arg], args.repetitions).items():
            # ssd_f32/<phase>/<form>/B/L/H/P/N/Q/real_time
            forms.setdefault((parts[1], size), {})[parts[2]] = result
            if parts[2] == "automatic":
                bench[(parts[1], size)] = result
    module = kdnn_ssd(kdnn_package())
    implementations = {"PyTorch chunked": ssd_chunked}
    if args.mamba_root:
        combined = mamba_triton.load(args.mamba_root)
        implementations["mamba Triton"] = functools.partial(mamba_triton.ssd, combined)
    print(method_line(module))
    print("| phase | B, L, H, P, N, Q | kdnn device | kdnn call | kdnn bench | kdnn GFLOP/s "
          "| reference | reference device | reference call | reference / kdnn "
          "| state bytes / rank (R=4) | all-to-all bytes / rank (R=4) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for size in sizes:
        kdnn = timed(module, size, args.device, args.repeats) if module else None
        for name, ssd in implementations.items():
            times = timed(ssd, size, args.device, args.repeats)
            for phase in PHASES:
                bench_ms, c = bench[(phase, size)]
                mine = kdnn[phase] if kdnn else bench_ms
                mine_device = device_and_call(mine)[0]
                flops = c["GFLOP/s"] * bench_ms / mine_device
                print(f"| {phase} | {', '.join(map(str, size))} | {mine_device:.3f} "
                      f"| {call_cell(mine)} | {bench_ms:.3f} | {flops:.1f} | {name} "
                      f"| {times[phase].device_ms:.3f} "
                      f"| {times[phase].call_ms:.3f} "
                      f"| {times[phase].device_ms / mine_device:.2f}x "
                      f"| {int(c['state_bytes_r4'])} | {int(c['a2a_bytes_r4'])} |")
                rows.append(result_rows.row("ssd", phase, size, mine, name, times[phase],
                                            bench_ms=bench_ms))
    print_forms(forms)
    if args.accuracy and sizes:
        if module is not None:
            implementations["kdnn"] = module
        accuracy(sizes[0], args.device, implementations)
    result_rows.write(args.json, rows)


if __name__ == "__main__":
    main()
