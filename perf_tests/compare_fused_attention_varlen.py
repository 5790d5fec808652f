#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Time kdnn's fused attention over packed variable-length sequences
(kdnn.flash_attention_varlen, causal, float32) against the same sequences as
a PyTorch user runs them without a varlen kernel: one
F.scaled_dot_product_attention call per sequence (the explicit softmax
formulation where PyTorch predates it), the outputs concatenated (autograd
for the backward); and against kdnn on one sequence of the longest
length (kdnn.flash_attention), whose rate the packed call is measured by.
All in one process, on the same inputs, timed as device_timing.py says, and
printed as one markdown table with kdnn's C++ benchmark
(perf_tests/bench_fused_attention_varlen.cpp) beside as a cross-check.

A size is TxHxDxMINxMAX: lengths drawn uniformly from [MIN, MAX] until they
total T tokens, the last cut to fit (packed_lengths.py: the same packing as
the C++ benchmark's packed_lengths.hpp). GFLOP/s count only the pairs
the causal mask leaves, L·(L + 1)/2 per sequence of L tokens, 4·D flops each
forward, 2.5 times that backward. The targets (issue 44): the packed rate at
least 0.8× the one-sequence rate; the packed call ahead of the per-sequence
PyTorch loop.

  python perf_tests/compare_fused_attention_varlen.py --bench build/serial/perf_tests/kdnn_perf_fused_attention_varlen
  python perf_tests/compare_fused_attention_varlen.py --device cuda --bench build/cuda/perf_tests/kdnn_perf_fused_attention_varlen
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_timing import Times, call_cell, forward_backward, kdnn_package, method_line  # noqa: E402
from gbench import median_runs  # noqa: E402
from packed_lengths import packed_lengths  # noqa: E402
import result_rows  # noqa: E402

PHASES = ("forward", "backward")
ROWS = PHASES + ("fwd+bwd",)
FLOPS_PER_PAIR = {"forward": 4.0, "backward": 10.0, "fwd+bwd": 14.0}  # times D


def causal_flops(lengths, H, D, phase):
    pairs = sum(0.5 * L * (L + 1) for L in lengths)
    return FLOPS_PER_PAIR[phase] * D * H * pairs


def leaves(shape, device, seed):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device).requires_grad_()


def timed(forward, grad, inputs, device, repeats):
    times = forward_backward(device, repeats, forward, grad, inputs)
    times["fwd+bwd"] = Times(*(f + b for f, b in zip(times["forward"], times["backward"])))
    return times


def causal_attention(q, k, v):
    """PyTorch's causal attention on [1, H, L, D]: SDPA, or before PyTorch 2
    (no SDPA) the explicit softmax formulation."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    L = q.shape[-2]
    hidden = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(s.masked_fill(hidden, float("-inf")), dim=-1) @ v


def per_sequence(q, k, v, cu):
    """causal_attention on each sequence of the packed q, k, v [T, H, D],
    the outputs concatenated back into [T, H, D]."""
    out = []
    for s0, s1 in zip(cu[:-1], cu[1:]):
        view = lambda x: x[s0:s1].transpose(0, 1).unsqueeze(0)  # noqa: E731  [1, H, L, D]
        out.append(causal_attention(view(q), view(k), view(v))[0].transpose(0, 1))
    return torch.cat(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="kdnn_perf_fused_attention_varlen")
    ap.add_argument("--sizes", default="32768x8x64x64x4096", help="TxHxDxMINxMAX,...")
    ap.add_argument("--repetitions", type=int, default=1, help="of the C++ benchmark (median)")
    ap.add_argument("--repeats", type=int, default=10,
                    help="timed runs of each Python-side implementation (median; at least 10)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--json", help="also write the rows in result_rows.py's form here")
    args = ap.parse_args()
    torch.set_num_threads(args.torch_threads)
    kdnn = kdnn_package()
    sdpa = hasattr(F, "scaled_dot_product_attention")
    reference_name = "PyTorch SDPA float32 per sequence" if sdpa else \
        "PyTorch softmax formulation float32 per sequence (no SDPA before PyTorch 2)"
    print(method_line(kdnn, reference_name))
    print("| phase | T, H, D, MIN, MAX | sequences | kdnn packed device | kdnn packed call "
          "| kdnn packed bench | kdnn one sequence device | packed / one sequence rate "
          "| PyTorch per sequence device | PyTorch per sequence call | PyTorch / kdnn "
          "| kdnn packed GFLOP/s | PyTorch GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for size in [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",") if s]:
        T, H, D, lo, hi = size
        lengths = packed_lengths(T, lo, hi)
        cu = [0]
        for L in lengths:
            cu.append(cu[-1] + L)
        bench = median_runs(args.bench, ["--kdnn_sizes=" + "x".join(map(str, size))],
                            args.repetitions)
        bench_ms = {p: r[0] for parts, r in bench.items() for p in PHASES
                    if parts[1] == "packed_" + p}
        bench_ms["fwd+bwd"] = sum(bench_ms.values())

        q, k, v = (leaves((T, H, D), args.device, seed) for seed in (1, 2, 3))
        dout = torch.randn(T, H, D, generator=torch.Generator().manual_seed(4)).to(args.device)
        reference = timed(lambda: per_sequence(q, k, v, cu), dout, (q, k, v), args.device,
                          args.repeats)
        packed = one = None
        if kdnn is not None:
            offsets = torch.tensor(cu, dtype=torch.int32, device=args.device)
            packed = timed(lambda: kdnn.flash_attention_varlen(q, k, v, offsets, offsets,
                                                               causal=True),
                           dout, (q, k, v), args.device, args.repeats)
            q1, k1, v1 = (leaves((1, H, hi, D), args.device, seed) for seed in (5, 6, 7))
            dout1 = torch.randn(1, H, hi, D, generator=torch.Generator().manual_seed(8)).to(
                args.device)
            one = timed(lambda: kdnn.flash_attention(q1, k1, v1, causal=True), dout1,
                        (q1, k1, v1), args.device, args.repeats)
        for phase in ROWS:
            ref = reference[phase]
            ms = packed[phase].device_ms if packed else bench_ms[phase]
            rate = causal_flops(lengths, H, D, phase) / (ms * 1e-3) / 1e9
            ref_rate = causal_flops(lengths, H, D, phase) / (ref.device_ms * 1e-3) / 1e9
            if one:
                one_rate = causal_flops([hi], H, D, phase) / (one[phase].device_ms * 1e-3) / 1e9
                one_cells = f"{one[phase].device_ms:.3f} | {rate / one_rate:.2f}x"
            else:
                one_cells = "- | -"
            print(f"| {phase} | {', '.join(map(str, size))} | {len(lengths)} | {ms:.3f} "
                  f"| {call_cell(packed[phase] if packed else None)} | {bench_ms[phase]:.3f} "
                  f"| {one_cells} | {ref.device_ms:.3f} | {ref.call_ms:.3f} "
                  f"| {ref.device_ms / ms:.2f}x | {rate:.1f} | {ref_rate:.1f} |")
            rows.append(result_rows.row("attention", "fused varlen " + phase, size,
                                        packed[phase] if packed else ms,
                                        reference_name, ref,
                                        bench_ms=bench_ms[phase]))
    result_rows.write(args.json, rows)


if __name__ == "__main__":
    main()
