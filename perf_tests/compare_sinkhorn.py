#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Run the kdnn Sinkhorn benchmark and the PyTorch formulation (and, on a GPU,
the Triton kernel) at the same sizes in one go, and print one table:
operator, size, kdnn time, reference time, ratio (reference / kdnn; > 1 means
kdnn is faster), achieved GB/s and, on a GPU, the fraction of the measured
device copy bandwidth.

  CPU: /usr/bin/python3 perf_tests/compare_sinkhorn.py --bench build/serial/perf_tests/kdnn_perf_sinkhorn
  GPU: python3 perf_tests/compare_sinkhorn.py --device cuda --bench build/cuda/perf_tests/kdnn_perf_sinkhorn \\
         --sizes 65536x16x100,4096x16x100,10001x4x48 --out results/

Pairs (float32): kdnn forward vs torch forward loop (no autograd); kdnn
implicit / block / unrolled backward vs torch autograd backward; kdnn implicit
vs the torch implicit-CG formulation and (GPU) the Triton kernel.
GB/s counts the bytes an operation must move once: forward reads X and writes
R; the backwards read two inputs and write dX.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # sinkhorn_triton, gbench
sys.path.insert(0, os.path.join(HERE, "..", "unit_tests", "reference"))  # kdnn_reference
from gbench import median_times_ms  # noqa: E402
import result_rows  # noqa: E402

# kdnn's ops with the reference each is compared with; the *_host ops pin the
# host kernel shape (on a GPU the plain ops run the GPU shape), so that one
# run times both shapes against the same reference.
PAIRS = [("forward", "torch forward"), ("forward_host", "torch forward"),
         ("implicit", "torch autograd_backward"), ("block", "torch autograd_backward"),
         ("block_host", "torch autograd_backward"), ("unrolled", "torch autograd_backward"),
         ("unrolled_host", "torch autograd_backward"),
         ("implicit", "torch implicit_cg_backward"), ("implicit", "triton implicit"),
         ("implicit_host", "triton implicit")]


def run_kdnn(bench, sizes, repetitions):
    results = {}
    for parts, ms in median_times_ms(bench, [f"--kdnn_sizes={sizes}"], repetitions).items():
        # sinkhorn_f32/<op>/<B>/<n>/<iters>/real_time
        results[(parts[1], tuple(int(p) for p in parts[2:5]))] = ms
    return results


def run_torch(sizes, threads, repeats, device):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, os.path.join(HERE, "sinkhorn_torch.py"), "--sizes", sizes,
                        "--threads", str(threads), "--repeats", str(repeats), "--device", device,
                        "--json", out.name], check=True, stdout=subprocess.DEVNULL)
        data = json.load(open(out.name))
    return {("torch " + r["variant"], (r["B"], r["n"], r["iters"])): r["time_ms"] for r in data}


def cuda_time_ms(fn, repeats):
    """Median of `repeats` timed calls (CUDA events), after two warm-up calls."""
    import torch
    fn(), fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def run_triton(sizes, repeats):
    import torch
    import sinkhorn_triton
    from kdnn_reference import sinkhorn
    results = {}
    for size in sizes:
        batch, n, iters = size
        x = torch.rand(batch, n, n, device="cuda") * 4
        g = torch.randn(batch, n, n, device="cuda")
        r = sinkhorn.forward(x, iters)
        results[("triton implicit", size)] = cuda_time_ms(
            lambda: sinkhorn_triton.implicit_backward(r, g), repeats)
    return results


def copy_bandwidth_gbs(repeats):
    """Device-to-device copy of 1 GiB: bytes read + written per second."""
    import torch
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    ms = cuda_time_ms(lambda: dst.copy_(src), repeats)
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True, help="path of kdnn_perf_sinkhorn")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--sizes", default="4096x16x100,16384x4x20,10001x4x48", help="BxNxITERS,...")
    ap.add_argument("--threads", type=int, default=2, help="PyTorch CPU threads")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="directory for results.json and table.md")
    ap.add_argument("--json", help="also write the rows in result_rows.py's form here")
    args = ap.parse_args()
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]

    kdnn = run_kdnn(args.bench, args.sizes, args.repeats)
    ref = run_torch(args.sizes, args.threads, args.repeats, args.device)
    copy_gbs = None
    if args.device == "cuda":
        ref.update(run_triton(sizes, max(args.repeats, 20)))
        copy_gbs = copy_bandwidth_gbs(20)

    rows = []
    for size in sizes:
        batch, n, _ = size
        for op, ref_name in PAIRS:
            if (op, size) not in kdnn or (ref_name, size) not in ref:
                continue
            ms, ref_ms = kdnn[(op, size)], ref[(ref_name, size)]
            gbs = (2 if op.startswith("forward") else 3) * batch * n * n * 4 / (ms * 1e-3) / 1e9
            rows.append(dict(op=op, B=batch, n=n, iters=size[2], kdnn_ms=ms, reference=ref_name,
                             reference_ms=ref_ms, ratio=ref_ms / ms, gbs=gbs,
                             copy_fraction=gbs / copy_gbs if copy_gbs else None))

    lines = []
    if copy_gbs:
        lines.append(f"measured device copy bandwidth: {copy_gbs:.0f} GB/s\n")
    lines.append("| op | B, n, iters | kdnn ms | reference | reference ms | ratio | kdnn GB/s |"
                 + (" of copy BW |" if copy_gbs else ""))
    lines.append("|---|---|---|---|---|---|---|" + ("---|" if copy_gbs else ""))
    for r in rows:
        line = (f"| {r['op']} | {r['B']}, {r['n']}, {r['iters']} | {r['kdnn_ms']:.3f} | {r['reference']} "
                f"| {r['reference_ms']:.3f} | {r['ratio']:.2f}x | {r['gbs']:.1f} |")
        if copy_gbs:
            line += f" {100 * r['copy_fraction']:.0f}% |"
        lines.append(line)
    table = "\n".join(lines)
    print(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(table + "\n")
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(dict(copy_gbs=copy_gbs, rows=rows), f, indent=1)
    result_rows.write(args.json, [
        result_rows.row("sinkhorn", r["op"], (r["B"], r["n"], r["iters"]), r["kdnn_ms"],
                        r["reference"], r["reference_ms"], copy_gbps=copy_gbs,
                        traffic_bytes=r["gbs"] * 1e9 * r["kdnn_ms"] * 1e-3)
        for r in rows])


if __name__ == "__main__":
    main()
