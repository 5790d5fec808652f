#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Time kdnn's Sinkhorn (kdnn.sinkhorn, through the kdnn package where it is
importable), the PyTorch formulation (sinkhorn_torch.py) and, on a GPU, the
Triton kernel on the same inputs in one process, and print one table:
operator, size, kdnn's device and call times and its C++ benchmark time
(perf_tests/bench_sinkhorn.cpp) as a cross-check, the reference's device and
call times, the ratio reference / kdnn by device time (> 1: kdnn faster;
device_timing.py says how each is measured), kdnn's GB/s from its device
time and, on a GPU, its fraction of the device copy bandwidth (a 1 GiB
dst.copy_(src), timed the same way).

  CPU: /usr/bin/python3 perf_tests/compare_sinkhorn.py --bench build/serial/perf_tests/kdnn_perf_sinkhorn
  GPU: python3 perf_tests/compare_sinkhorn.py --device cuda --bench build/cuda/perf_tests/kdnn_perf_sinkhorn \\
         --sizes 65536x16x100,4096x16x100,10001x4x48 --out results/

Pairs (float32): kdnn forward (no autograd) vs torch forward loop (no_grad);
kdnn implicit / block / unrolled backward (r.backward(g), each alone) vs torch
autograd backward; kdnn implicit vs the torch implicit-CG formulation and
(GPU) the Triton kernel. The *_host ops pin the host kernel form; the
package does not expose them, so they have the benchmark's time alone.
GB/s counts the bytes an operation must move once: forward reads X and writes
R; the backwards read two inputs and write dX.

With --te-root (a NVIDIA/TransformerEngine checkout, sinkhorn_te.py) on a
GPU, a second table sets TransformerEngine's Triton mhc_fused_sinkhorn
beside kdnn at every size with n = 4, like for like: kdnn's
order="rows_first", eps=0 forward and its unrolled backward (the gradient of
the iterations as run, which TransformerEngine's backward computes), with
each side's largest error against the float64 iterations.
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # sinkhorn_torch, sinkhorn_triton, gbench
sys.path.insert(0, os.path.join(HERE, "..", "unit_tests", "reference"))  # kdnn_reference
from device_timing import (  # noqa: E402
    PhaseTimer, call_cell, device_and_call, kdnn_package, method_line)
from gbench import median_times_ms  # noqa: E402
import result_rows  # noqa: E402
import sinkhorn_torch  # noqa: E402
from kdnn_reference import sinkhorn  # noqa: E402

# kdnn's ops with the reference each is compared with; the *_host ops pin the
# host kernel form (on a GPU the plain ops run the GPU form), so that one
# run times both forms against the same reference.
PAIRS = [("forward", "torch forward"), ("forward_host", "torch forward"),
         ("implicit", "torch autograd_backward"), ("block", "torch autograd_backward"),
         ("block_host", "torch autograd_backward"), ("unrolled", "torch autograd_backward"),
         ("unrolled_host", "torch autograd_backward"),
         ("implicit", "torch implicit_cg_backward"), ("implicit", "triton implicit"),
         ("implicit_host", "triton implicit")]
BACKWARDS = ("implicit", "block", "unrolled")  # kdnn.sinkhorn's, as the benchmark's ops


def run_bench(bench, sizes, repetitions):
    results = {}
    for parts, ms in median_times_ms(bench, [f"--kdnn_sizes={sizes}"], repetitions).items():
        # sinkhorn_f32/<op>/<B>/<n>/<iters>/real_time
        results[(parts[1], tuple(int(p) for p in parts[2:5]))] = ms
    return results


def kdnn_times(kdnn, x, g, iters, repeats):
    """{op: device_timing.Times} of kdnn.sinkhorn's forward (no autograd) and
    of each of its backwards (r.backward(g)), each alone."""
    xg = x.detach().requires_grad_()

    def one_run(phase):
        with torch.no_grad(), phase("forward"):
            kdnn.sinkhorn(x, iters=iters)
        for method in BACKWARDS:
            r = kdnn.sinkhorn(xg, iters=iters, backward=method)
            with phase(method):
                r.backward(g)
            xg.grad = None

    return PhaseTimer(x.device, repeats).run(one_run)


def triton_times(x, g, iters, repeats):
    """device_timing.Times of the Triton implicit backward from (R, G)."""
    import sinkhorn_triton
    r = sinkhorn.forward(x, iters)

    def one_run(phase):
        with phase("implicit"):
            sinkhorn_triton.implicit_backward(r, g)

    return PhaseTimer(x.device, repeats).run(one_run)["implicit"]


def te_table(te, kdnn, x, g, iters, repeats, emit, rows, copy_gbs):
    """TransformerEngine's forward and backward beside kdnn's rows-first
    forward and unrolled backward at one size with n = 4; errors against the
    float64 iterations (rows first, then columns) and their autograd."""
    import sinkhorn_te
    x64 = x.double().requires_grad_()
    r64 = torch.exp(x64)
    for _ in range(iters):
        r64 = r64 / r64.sum(-1, keepdim=True)
        r64 = r64 / r64.sum(-2, keepdim=True)
    (dx64,) = torch.autograd.grad(r64, x64, g.double())
    r64 = r64.detach()

    def error(a, b):
        return (a.double() - b).abs().max().item()

    r_te = sinkhorn_te.forward(te, x, iters)
    dx_te = sinkhorn_te.backward(te, x, r_te, g, iters)
    xg = x.detach().requires_grad_()
    r_kd = kdnn.sinkhorn(xg, iters=iters, order="rows_first", eps=0.0, backward="unrolled")
    r_kd.backward(g)
    errors = {"forward": (error(r_kd, r64), error(r_te, r64)),
              "unrolled": (error(xg.grad, dx64), error(dx_te, dx64))}

    def te_run(phase):
        with phase("forward"):
            r = sinkhorn_te.forward(te, x, iters)
        with phase("unrolled"):
            sinkhorn_te.backward(te, x, r, g, iters)

    def kdnn_run(phase):
        with torch.no_grad(), phase("forward"):
            kdnn.sinkhorn(x, iters=iters, order="rows_first", eps=0.0)
        r = kdnn.sinkhorn(xg, iters=iters, order="rows_first", eps=0.0, backward="unrolled")
        with phase("unrolled"):
            r.backward(g)
        xg.grad = None

    theirs = PhaseTimer(x.device, repeats).run(te_run)
    mine = PhaseTimer(x.device, repeats).run(kdnn_run)
    batch, n = x.shape[0], x.shape[1]
    for op in ("forward", "unrolled"):
        kd, r = mine[op], theirs[op]
        traffic = (2 if op == "forward" else 3) * batch * n * n * 4
        gbs = traffic / (kd.device_ms * 1e-3) / 1e9
        emit(f"| {op} | {batch}, {n}, {iters} | {kd.device_ms:.4f} | {kd.call_ms:.3f} "
             f"| {r.device_ms:.4f} | {r.call_ms:.3f} | {r.device_ms / kd.device_ms:.2f}x "
             f"| {errors[op][0]:.1e} | {errors[op][1]:.1e} | {gbs:.0f} |")
        rows.append(result_rows.row("sinkhorn", op + "_rows_first", (batch, n, iters), kd,
                                    "transformer_engine " + ("forward" if op == "forward"
                                                             else "backward"), r,
                                    traffic_bytes=traffic, copy_gbps=copy_gbs))


def copy_bandwidth_gbs(repeats):
    """Device-to-device copy of 1 GiB, by device time: bytes read + written per second."""
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)

    def one_run(phase):
        with phase("copy"):
            dst.copy_(src)

    ms = PhaseTimer("cuda", repeats).run(one_run)["copy"].device_ms
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True, help="path of kdnn_perf_sinkhorn")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--sizes", default="4096x16x100,16384x4x20,10001x4x48", help="BxNxITERS,...")
    ap.add_argument("--threads", type=int, default=2, help="PyTorch CPU threads")
    ap.add_argument("--repetitions", type=int, default=5,
                    help="of the C++ benchmark (its median)")
    ap.add_argument("--repeats", type=int, default=10,
                    help="timed runs of each Python-side implementation (median; at least 10)")
    ap.add_argument("--out", help="directory for results.json and table.md")
    ap.add_argument("--json", help="also write the rows in result_rows.py's form here")
    ap.add_argument("--te-root", help="a NVIDIA/TransformerEngine checkout: its Triton Sinkhorn "
                    "beside kdnn's at every n = 4 size (GPU, with the kdnn package)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]

    bench = run_bench(args.bench, args.sizes, args.repetitions)
    kdnn = kdnn_package()
    copy_gbs = copy_bandwidth_gbs(args.repeats) if args.device == "cuda" else None
    lines = []

    def emit(line):
        lines.append(line)
        print(line, flush=True)

    emit(method_line(kdnn, bench_only="the *_host ops"))
    if copy_gbs:
        emit(f"measured device copy bandwidth: {copy_gbs:.0f} GB/s\n")
    emit("| op | B, n, iters | kdnn device | kdnn call | kdnn bench | reference "
         "| reference device | reference call | reference / kdnn | kdnn GB/s |"
         + (" of copy BW |" if copy_gbs else ""))
    emit("|---|---|---|---|---|---|---|---|---|---|" + ("---|" if copy_gbs else ""))
    rows = []
    for size in sizes:
        batch, n, iters = size
        x, g = sinkhorn_torch.inputs(batch, n, args.device)
        ref = {"torch " + v: t for v, t in sinkhorn_torch.timed(x, g, iters, args.repeats).items()}
        if args.device == "cuda":
            ref["triton implicit"] = triton_times(x, g, iters, args.repeats)
        mine = kdnn_times(kdnn, x, g, iters, args.repeats) if kdnn else {}
        for op, ref_name in PAIRS:
            if (op, size) not in bench or ref_name not in ref:
                continue
            bench_ms, r = bench[(op, size)], ref[ref_name]
            kd = mine.get(op, bench_ms)
            ms = device_and_call(kd)[0]
            traffic = (2 if op.startswith("forward") else 3) * batch * n * n * 4
            gbs = traffic / (ms * 1e-3) / 1e9
            emit(f"| {op} | {batch}, {n}, {iters} | {ms:.3f} | {call_cell(kd)} "
                 f"| {bench_ms:.3f} | {ref_name} | {r.device_ms:.3f} | {r.call_ms:.3f} "
                 f"| {r.device_ms / ms:.2f}x "
                 f"| {gbs:.1f} |" + (f" {100 * gbs / copy_gbs:.0f}% |" if copy_gbs else ""))
            rows.append(result_rows.row("sinkhorn", op, size, kd, ref_name, r,
                                        traffic_bytes=traffic, copy_gbps=copy_gbs,
                                        bench_ms=bench_ms))
    if args.te_root and args.device == "cuda" and kdnn:
        import sinkhorn_te
        te = sinkhorn_te.load(args.te_root)
        emit("\nTransformerEngine's mhc_fused_sinkhorn (Triton, n = 4) against kdnn's "
             "order=\"rows_first\", eps=0 forward and unrolled backward; errors: largest "
             "|difference| from the float64 iterations and their autograd gradient\n")
        emit("| op | B, n, iters | kdnn device | kdnn call | TE device | TE call | TE / kdnn "
             "| kdnn error | TE error | kdnn GB/s |")
        emit("|---|---|---|---|---|---|---|---|---|---|")
        for batch, n, iters in sizes:
            if n == sinkhorn_te.N:
                x, g = sinkhorn_torch.inputs(batch, n, args.device)
                te_table(te, kdnn, x, g, iters, args.repeats, emit, rows, copy_gbs)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(dict(copy_gbs=copy_gbs, rows=rows), f, indent=1)
    result_rows.write(args.json, rows)


if __name__ == "__main__":
    main()
