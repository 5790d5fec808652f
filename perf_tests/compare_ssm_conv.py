#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Time kdnn's causal depthwise conv1d + SiLU (kdnn.causal_conv1d, through
the kdnn package where it is importable) and PyTorch's formulation of it on
the same inputs in one process, and print one markdown table: phase, size,
kdnn's device and call times and its C++ benchmark time
(perf_tests/bench_ssm_conv.cpp) as a cross-check, kdnn's GB/s from its
device time, that bandwidth as a fraction of the copy bandwidth measured by
the same kdnn binary in the same run (a Kokkos::deep_copy of B·L·C floats),
PyTorch's device and call times and the ratio PyTorch / kdnn by device time
(> 1: kdnn faster; device_timing.py says how each is measured).

PyTorch's formulation is Mamba's reference, from a channel-last x [B, L, C]
(contiguous), transposes included:

  y = F.silu(F.conv1d(F.pad(x.transpose(1, 2), (K - 1, 0)), w.unsqueeze(1),
                      bias, groups=C)).transpose(1, 2)

float32; the backward is autograd's y.backward(dy) giving dx, dw and dbias,
timed alone (the forward before it is not counted). GB/s counts the bytes
each phase must move at least once: forward 2·B·L·C·4 (read x, write y),
backward 3·B·L·C·4 (read x and dy, write dx), plus w. The copy rows show the
reference bandwidth itself (kdnn's: the benchmark's deep_copy alone;
PyTorch's column there: dst.copy_(src)). PyTorch runs on --torch-threads
threads (default 2).

  python perf_tests/compare_ssm_conv.py --bench build/k46/perf_tests/kdnn_perf_ssm_conv
  python perf_tests/compare_ssm_conv.py --device cuda --bench build/cuda/perf_tests/kdnn_perf_ssm_conv

On a GPU the benchmark also times the tiled form (forward_tiled,
backward_tiled: launch.form = host); those rows follow with the benchmark's
time alone, against the same PyTorch times.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_timing import (  # noqa: E402
    PhaseTimer, call_cell, device_and_call, forward_backward, kdnn_package, method_line)
from gbench import median_runs  # noqa: E402
import result_rows  # noqa: E402

PHASES = ("forward", "backward", "copy")


def parse_sizes(text):
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]


def conv(x, w, bias):
    K = w.shape[1]
    return F.silu(F.conv1d(F.pad(x.transpose(1, 2), (K - 1, 0)), w.unsqueeze(1), bias,
                           groups=x.shape[2])).transpose(1, 2)


def timed(op, size, device, repeats, copy=False):
    """device_timing.Times of the forward and of the backward of
    op(x, w, bias), each phase alone, and with `copy` of a copy of dy into a
    tensor of its size (dst.copy_(dy))."""
    B, L, C, K = size
    g = torch.Generator(device="cpu").manual_seed(0)
    make = lambda *shape: (torch.rand(*shape, generator=g) * 2 - 1).to(device)  # noqa: E731
    x = make(B, L, C).requires_grad_()
    w = make(C, K).requires_grad_()
    bias = make(C).requires_grad_()
    dy = make(B, L, C)
    times = forward_backward(device, repeats, lambda: op(x, w, bias), dy, (x, w, bias))
    if copy:
        dst = torch.empty_like(dy)

        def one_copy(phase):
            with phase("copy"):
                dst.copy_(dy)

        times.update(PhaseTimer(device, repeats).run(one_copy))
    return times


def kdnn_conv(kdnn):
    """kdnn.causal_conv1d with SiLU as conv's call (None without the package)."""
    if kdnn is None:
        return None
    return lambda x, w, bias: kdnn.causal_conv1d(x, w, bias, activation="silu")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="kdnn_perf_ssm_conv")
    ap.add_argument("--sizes", default="8x4096x1024x4,2x16384x2048x4", help="BxLxCxK,...")
    ap.add_argument("--repetitions", type=int, default=5,
                    help="of the C++ benchmark (its median)")
    ap.add_argument("--repeats", type=int, default=10,
                    help="timed runs of each Python-side implementation (median; at least 10)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--json", help="also write the rows in result_rows.py's form here")
    args = ap.parse_args()
    torch.set_num_threads(args.torch_threads)

    sizes = parse_sizes(args.sizes)
    bench = {}
    for size in sizes:
        arg = "--kdnn_sizes=" + "x".join(map(str, size))
        for parts, result in median_runs(args.bench, [arg], args.repetitions).items():
            # ssm_conv_<f32|bf16>/<phase>/B/L/C/K/real_time: the float32 rows
            if parts[0] == "ssm_conv_f32":
                bench[(parts[1], size)] = result
    module = kdnn_conv(kdnn_package())
    print(method_line(module, "PyTorch", "the copy and tiled rows"))
    print("| phase | B, L, C, K | kdnn device | kdnn call | kdnn bench | kdnn GB/s "
          "| of copy GB/s | PyTorch device | PyTorch call | PyTorch / kdnn |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for size in sizes:
        reference = timed(conv, size, args.device, args.repeats, copy=True)
        kdnn = timed(module, size, args.device, args.repeats) if module else {}
        copy_gbs = bench[("copy", size)][1]["GB/s"]
        tiled = [p + "_tiled" for p in PHASES[:2] if (p + "_tiled", size) in bench]  # GPU only
        for phase in PHASES + tuple(tiled):
            bench_ms, counters = bench[(phase, size)]
            mine = kdnn.get(phase, bench_ms)
            ref = reference[phase.replace("_tiled", "")]
            ms = device_and_call(mine)[0]
            gbs = counters["bytes"] / (ms * 1e-3) / 1e9
            print(f"| {phase} | {', '.join(map(str, size))} | {ms:.3f} | {call_cell(mine)} "
                  f"| {bench_ms:.3f} | {gbs:.2f} | {gbs / copy_gbs:.3f} | {ref.device_ms:.3f} "
                  f"| {ref.call_ms:.3f} | {ref.device_ms / ms:.2f}x |")
            rows.append(result_rows.row(
                "ssm-conv", phase, size, mine,
                "copy" if phase == "copy" else "PyTorch F.conv1d + SiLU", ref,
                traffic_bytes=counters["bytes"], copy_gbps=copy_gbs, bench_ms=bench_ms))
    result_rows.write(args.json, rows)


if __name__ == "__main__":
    main()
