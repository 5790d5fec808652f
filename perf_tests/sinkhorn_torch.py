#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Time the PyTorch formulation of Sinkhorn-Knopp (mHC reference) for comparison.

Variants, per size (B, n, iters), median of --repeats runs after 1 warm-up:
  forward   : P = exp(X), `iters` x (column- then row-normalise), under no_grad
  autograd  : loss.backward() only (loss = (R * G).sum(), forward recorded with
              requires_grad), i.e. backward through the unrolled iterations
  implicit  : reference "rank-0 CG" backward from (R, G), for reference only
The formulations are those of unit_tests/reference/kdnn_reference/sinkhorn.py.

Example:
  python3 perf_tests/sinkhorn_torch.py --threads 2 --json /tmp/sinkhorn_torch.json
  python3 perf_tests/sinkhorn_torch.py --sizes 4096x16x100,10001x4x48 --dtype float64
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "unit_tests", "reference"))
from kdnn_reference import sinkhorn  # noqa: E402  (the formulations timed here)


def bench(fn, repeats, sync):
    """fn(timed) runs one trial; it calls timed(op) around the part to measure."""
    def run_once():
        out = []

        def timed(op):
            sync()
            t0 = time.perf_counter()
            val = op()
            sync()
            out.append(time.perf_counter() - t0)
            return val

        fn(timed)
        return out[0]

    run_once()  # warm-up
    return 1e3 * statistics.median(run_once() for _ in range(repeats))


def parse_sizes(text):
    return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4096x16x100,10001x4x48", help="BxNxITERS,...")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json", help="also write results to this JSON file")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("CUDA not available, falling back to cpu")
        args.device = "cpu"
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)

    results = []
    for B, n, iters in parse_sizes(args.sizes):
        x = (torch.rand(B, n, n, dtype=torch.float64) * 4.0).to(dev, dtype)
        g = torch.randn(B, n, n, dtype=torch.float64).to(dev, dtype)
        with torch.no_grad():
            r = sinkhorn.forward(x, iters)

        def forward(timed):
            with torch.no_grad():
                timed(lambda: sinkhorn.forward(x, iters))

        def autograd(timed):
            _, loss = sinkhorn.loss(x.detach().requires_grad_(True), g, iters)
            timed(loss.backward)

        def implicit(timed):
            with torch.no_grad():
                timed(lambda: sinkhorn.implicit_cg_backward(r, g))

        for variant, fn in (("forward", forward), ("autograd_backward", autograd),
                            ("implicit_cg_backward", implicit)):
            ms = bench(fn, args.repeats, sync)
            results.append(dict(B=B, n=n, iters=iters, dtype=args.dtype, threads=args.threads,
                                variant=variant, time_ms=ms, device=dev.type))
            print(f"torch sinkhorn B={B} n={n} iters={iters} dtype={args.dtype} "
                  f"threads={args.threads} device={dev.type} variant={variant} "
                  f"time_ms={ms:.3f}", flush=True)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
