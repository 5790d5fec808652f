#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Time the PyTorch formulation of Sinkhorn-Knopp (mHC reference) for comparison.

Variants, per size (B, n, iters), each timed alone with device_timing.py's
PhaseTimer (device time and call time, medians of --repeats runs, at least
10, after 2 warm-ups; on the CPU both are the wall time):
  forward   : P = exp(X), `iters` x (column- then row-normalise), under no_grad
  autograd  : loss.backward() only (loss = (R * G).sum(), forward recorded with
              requires_grad), i.e. backward through the unrolled iterations
  implicit  : reference "rank-0 CG" backward from (R, G), for reference only
The formulations are those of unit_tests/reference/kdnn_reference/sinkhorn.py.
compare_sinkhorn.py calls timed() in its own process.

Example:
  python3 perf_tests/sinkhorn_torch.py --threads 2 --json /tmp/sinkhorn_torch.json
  python3 perf_tests/sinkhorn_torch.py --sizes 4096x16x100,10001x4x48 --dtype float64
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # device_timing
sys.path.insert(0, os.path.join(HERE, "..", "unit_tests", "reference"))
from device_timing import PhaseTimer  # noqa: E402
from kdnn_reference import sinkhorn  # noqa: E402  (the formulations timed here)

VARIANTS = ("forward", "autograd_backward", "implicit_cg_backward")


def inputs(B, n, device, dtype=torch.float32):
    """X (logits in [0, 4)) and G of one size, the same values on every device and dtype."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.rand(B, n, n, generator=gen, dtype=torch.float64) * 4.0
    g = torch.randn(B, n, n, generator=gen, dtype=torch.float64)
    return x.to(device, dtype), g.to(device, dtype)


def timed(x, g, iters, repeats=10):
    """{variant: device_timing.Times} of the PyTorch formulation at (X, G, iters)."""
    with torch.no_grad():
        r = sinkhorn.forward(x, iters)

    def one_run(phase):
        with torch.no_grad():
            with phase("forward"):
                sinkhorn.forward(x, iters)
            with phase("implicit_cg_backward"):
                sinkhorn.implicit_cg_backward(r, g)
        _, loss = sinkhorn.loss(x.detach().requires_grad_(True), g, iters)
        with phase("autograd_backward"):
            loss.backward()

    return PhaseTimer(x.device, repeats).run(one_run)


def parse_sizes(text):
    return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4096x16x100,10001x4x48", help="BxNxITERS,...")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10, help="timed runs (median; at least 10)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json", help="also write results to this JSON file")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("CUDA not available, falling back to cpu")
        args.device = "cpu"
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)

    results = []
    for B, n, iters in parse_sizes(args.sizes):
        x, g = inputs(B, n, dev, dtype)
        times = timed(x, g, iters, args.repeats)
        for variant in VARIANTS:
            t = times[variant]
            results.append(dict(B=B, n=n, iters=iters, dtype=args.dtype, threads=args.threads,
                                variant=variant, time_ms=t.device_ms, call_ms=t.call_ms,
                                device=dev.type))
            print(f"torch sinkhorn B={B} n={n} iters={iters} dtype={args.dtype} "
                  f"threads={args.threads} device={dev.type} variant={variant} "
                  f"device_ms={t.device_ms:.3f} call_ms={t.call_ms:.3f}", flush=True)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
