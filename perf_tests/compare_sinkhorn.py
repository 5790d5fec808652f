#!/usr/bin/env python3
"""Run the kdnn Sinkhorn benchmark and the PyTorch formulation in one go and
print the ratios (PyTorch time / kdnn time; > 1 means kdnn is faster).

  /usr/bin/python3 perf_tests/compare_sinkhorn.py --bench build/serial/perf_tests/kdnn_perf_sinkhorn

Pairs compared at each size (B, n, iters), float32:
  forward   kdnn forward                  vs torch forward loop (no autograd)
  implicit  kdnn implicit backward        vs torch autograd backward
  block     kdnn block backward           vs torch autograd backward
  unrolled  kdnn unrolled backward        vs torch autograd backward
  implicit  kdnn implicit backward        vs torch implicit-CG formulation
Needs PyTorch (KDNN_WITH_TORCH=1 bash scripts/install-deps.sh).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = "4096x16x100,10001x4x48"
PAIRS = [("forward", "forward"), ("implicit", "autograd_backward"), ("block", "autograd_backward"),
         ("unrolled", "autograd_backward"), ("implicit", "implicit_cg_backward")]


def run_kdnn(bench, repetitions):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([bench, f"--benchmark_out={out.name}", "--benchmark_out_format=json",
                        f"--benchmark_repetitions={repetitions}",
                        "--benchmark_report_aggregates_only=true"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        data = json.load(open(out.name))
    results = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") not in (None, "median"):
            continue
        # sinkhorn_f32/<op>/<B>/<n>/<iters>/real_time[_median]
        parts = b["run_name"].split("/")
        op, size = parts[1], tuple(int(p) for p in parts[2:5])
        ms = b["real_time"] * {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]
        results[(op, size)] = (ms, b.get("bytes_per_second", 0.0) / 1e9)
    return results


def run_torch(threads, repeats, device):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, os.path.join(HERE, "sinkhorn_torch.py"), "--sizes", SIZES,
                        "--threads", str(threads), "--repeats", str(repeats), "--device", device,
                        "--json", out.name], check=True, stdout=subprocess.DEVNULL)
        data = json.load(open(out.name))
    return {(r["variant"], (r["B"], r["n"], r["iters"])): r["time_ms"] for r in data}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True, help="path of kdnn_perf_sinkhorn")
    ap.add_argument("--threads", type=int, default=2, help="PyTorch threads")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()

    kdnn = run_kdnn(args.bench, args.repeats)
    torch = run_torch(args.threads, args.repeats, args.device)
    print(f"| op | B, n, iters | kdnn ms | kdnn GB/s | torch variant | torch ms | torch/kdnn |")
    print("|---|---|---|---|---|---|---|")
    for size in sorted({s for _, s in kdnn}, reverse=True):
        for op, variant in PAIRS:
            if (op, size) not in kdnn or (variant, size) not in torch:
                continue
            ms, gbs = kdnn[(op, size)]
            tms = torch[(variant, size)]
            print(f"| {op} | {size[0]}, {size[1]}, {size[2]} | {ms:.2f} | {gbs:.2f} | {variant} "
                  f"| {tms:.2f} | {tms / ms:.1f}x |")


if __name__ == "__main__":
    main()
