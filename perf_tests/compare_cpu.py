#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn beside the current PyTorch (2.x, from PyPI) on the CPU, on the same
cores with equal thread counts, in one process: every operator family's
forward and forward + backward (medians of --repeats runs, timed and fed by
each family's compare_*.py) with its rate (GFLOP/s for the attention's, the
layer's and the SSD's products, GB/s for the memory-bound conv and Sinkhorn,
counted as below) and that rate as a fraction of the machine's ceiling on
that many threads (perf_tests/machine_peak.cpp: the FMA peak, the copy
bandwidth); then the example model's training step
(python/examples/train_hybrid.py, each side in its own process: time and the
growth of peak memory). One markdown table per thread count, then kdnn's
speed-up from the fewest threads to the most; with --sweep,
the fused attention also at S 512, 2048 and 8192, D 64 and 128, causal and
not, float32 and float64 (B·H chosen so that each size does about the same
work).

Counted work: attention 4·B·H·S·Sk·D FLOP forward (half of it causal),
2.5 times that backward; the MHA layer its projections besides
(compare_mha.forward_flops), twice that backward; the SSD's chunk products,
per chunk of Q steps 2·Q²·N (C·Bᵀ, one group) + H·(2·Q²·P + 4·Q·N·P) FLOP
forward (the within-chunk output, the chunk state and the state's output),
twice that backward; the conv 2·B·L·D·4 bytes forward (x read, y written)
and 3·B·L·D·4 backward (x and dy read, dx written); the Sinkhorn 2·B·n²·4
bytes forward (X read, R written) and 3·B·n²·4 backward (R and G read, dX
written). PyTorch's Sinkhorn is its autograd loop over the iterations
(sinkhorn_torch.py); it has no fused kernel.

kdnn runs with Kokkos' threads (an OpenMP Kokkos: OMP_NUM_THREADS, set here
to each thread count before kdnn is imported, so each count runs in its own
process) or on one thread (Serial); PyTorch with torch.set_num_threads.

  OMP_PROC_BIND=false python perf_tests/compare_cpu.py --peak build/serial/perf_tests/kdnn_machine_peak
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

ATTENTION = [  # (B, H, S, D, causal, dtype)
    (1, 8, 2048, 64, True, "float32"), (4, 8, 512, 64, True, "float32"),
    (1, 8, 1024, 128, True, "float32"), (1, 8, 1024, 64, True, "float64"),
    (1, 8, 2048, 64, False, "float32"),
]
MHA = (2, 8, 1024, 1024, 64)     # B, H, S, Sk, D
SSD = (2, 4096, 8, 64, 64, 64)  # B, L, H, P, N, chunk
CONV = (4, 1024, 8192, 4)       # B, L, D, K
SINKHORN = (65536, 16, 20)      # B, n, iterations


def sweep():
    """--sweep's attention sizes: B·H·S²·D about 2^31 (at least one head)."""
    out = []
    for dtype in ("float32", "float64"):
        for causal in (True, False):
            for D in (64, 128):
                for S in (512, 2048, 8192):
                    heads = max(1, 2 ** 31 // (S * S * D))
                    B, H = (heads // 8, 8) if heads >= 8 else (1, heads)
                    out.append((B, H, S, D, causal, dtype))
    return out


def phase_ms(times):
    """(forward ms, forward + backward ms) of a device_timing.forward_backward result."""
    return times["forward"].device_ms, times["forward"].device_ms + times["backward"].device_ms


class Row:
    """One family at one size: each side's (forward, fwd+bwd) ms, the rate's
    unit, the work of the forward and of both, the ceiling's kind."""

    def __init__(self, name, mine, ref, unit, work, ratio_bwd, kind):
        self.name, self.mine, self.ref, self.unit, self.kind = name, mine, ref, unit, kind
        self.work = (work, work * (1 + ratio_bwd))


def attention_rows(kdnn, torch, F, sizes, repeats):
    import compare_fused_attention as attention
    out = []
    for B, H, S, D, causal, dtype in sizes:
        size = (B, H, S, S, D)
        ms = [phase_ms(attention.timed(f, size, "cpu", repeats, getattr(torch, dtype))) for f in (
            lambda q, k, v: kdnn.flash_attention(q, k, v, causal=causal),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal))]
        flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
        name = f"{'causal ' if causal else ''}attention {dtype} ({B}, {H}, {S}, {D})"
        out.append(Row(name, *ms, "GFLOP/s", flops / 1e9, 2.5, dtype))
    return out


def family_rows(kdnn, torch, repeats):
    """The layer, SSD, conv and Sinkhorn rows, each timed by its family's
    compare_*.py (the same inputs)."""
    import compare_mha as mha
    import compare_ssd as ssd
    import device_timing
    import compare_ssm_conv as conv
    import sinkhorn_torch

    out = []
    ms = [phase_ms(mha.timed(f, MHA, "cpu", repeats)) for f in (mha.kdnn_layer(kdnn),
                                                               mha.torch_layer)]
    out.append(Row(f"MHA layer (B, H, S, Sk, D) = {MHA} vs its PyTorch form", *ms, "GFLOP/s",
                   mha.forward_flops(*MHA) / 1e9, 2.0, "float32"))

    Bb, L, H, P, N, Q = SSD
    ms = [phase_ms(ssd.timed(f, SSD, "cpu", repeats)) for f in (ssd.kdnn_ssd(kdnn),
                                                               ssd.ssd_chunked)]
    chunks = Bb * L // Q
    flops = chunks * (2 * Q * Q * N + H * (2 * Q * Q * P + 4 * Q * N * P))
    out.append(Row(f"SSD ({Bb}, {L}, {H}, {P}, N {N}, chunk {Q}) vs the chunked PyTorch form",
                   *ms, "GFLOP/s", flops / 1e9, 2.0, "float32"))

    Bc, Lc, Dc, K = CONV
    ms = [phase_ms(conv.timed(f, CONV, "cpu", repeats)) for f in (conv.kdnn_conv(kdnn),
                                                                 conv.conv)]
    out.append(Row(f"conv + SiLU ({Bc}, {Lc}, {Dc}, K {K}) vs F.conv1d + F.silu", *ms, "GB/s",
                   8.0 * Bc * Lc * Dc / 1e9, 1.5, "copy"))

    Bs, n, iters = SINKHORN
    x, g = sinkhorn_torch.inputs(Bs, n, "cpu")
    xg = x.detach().requires_grad_()
    ms = [phase_ms(device_timing.forward_backward(
        "cpu", repeats, lambda: f(xg), g, [xg])) for f in (
            lambda t: kdnn.sinkhorn(t, iters=iters),
            lambda t: sinkhorn_torch.sinkhorn.forward(t, iters))]
    out.append(Row(f"Sinkhorn ({Bs}, {n}, {n}), {iters} iterations, implicit backward vs "
                   "PyTorch's autograd loop", *ms, "GB/s", 8.0 * Bs * n * n / 1e9, 1.5, "copy"))
    return out


def training_step(ops, threads, steps, length=1024, batch=8):
    """(ms per step, peak MiB grown) of python/examples/train_hybrid.py with
    `ops` (kdnn or torch) on `threads` threads, in its own process."""
    import re
    example = os.path.join(HERE, "..", "python", "examples", "train_hybrid.py")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, example, "--ops", ops, "--steps", str(steps),
                          "--length", str(length), "--batch", str(batch)],
                         capture_output=True, text=True, env=env).stdout
    found = re.search(r"([0-9.]+) ms per step; peak memory grew ([0-9]+) MiB", out)
    return float(found.group(1)), int(found.group(2))


def one_count(args, threads):
    """This process' table for `threads` threads (OMP_NUM_THREADS already set)."""
    import torch
    import torch.nn.functional as F
    import kdnn
    sys.path.insert(0, HERE)
    torch.set_num_threads(threads)
    peak = json.loads(subprocess.run([args.peak, "--threads", str(threads)], check=True,
                                     capture_output=True, text=True).stdout)
    ceiling = {"float32": peak["float32_gflops"][-1], "float64": peak["float64_gflops"][-1],
               "copy": peak["copy_gbs"][-1]}
    print(f"\n{threads} thread(s): PyTorch {torch.__version__} on {torch.get_num_threads()}, "
          f"kdnn {kdnn.backend} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}); "
          f"ceilings: float32 {ceiling['float32']:.0f} GFLOP/s, float64 "
          f"{ceiling['float64']:.0f} GFLOP/s, copy {ceiling['copy']:.1f} GB/s\n")
    print("| | kdnn fwd ms | PyTorch fwd ms | PyTorch / kdnn fwd | kdnn fwd rate | of ceiling "
          "| kdnn fwd+bwd ms | PyTorch fwd+bwd ms | PyTorch / kdnn fwd+bwd | kdnn fwd+bwd rate "
          "| of ceiling | PyTorch fwd+bwd rate | of ceiling |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    sizes = ATTENTION + (sweep() if args.sweep else [])
    kept = {}
    for row in (attention_rows(kdnn, torch, F, sizes, args.repeats) +
                family_rows(kdnn, torch, args.repeats)):
        kept[row.name] = row.mine
        top = ceiling[row.kind]
        cells = []
        for phase in (0, 1):
            mine, ref = row.mine[phase], row.ref[phase]
            rk = row.work[phase] / (mine * 1e-3)
            cells.append(f"{mine:.1f} | {ref:.1f} | {ref / mine:.2f}x | {rk:.1f} {row.unit} "
                         f"| {rk / top:.0%}")
        rt = row.work[1] / (row.ref[1] * 1e-3)
        print(f"| {row.name} | {cells[0]} | {cells[1]} | {rt:.1f} {row.unit} | {rt / top:.0%} |",
              flush=True)
    (mine, mine_mib), (ref, ref_mib) = (training_step(ops, threads, args.steps)
                                        for ops in ("kdnn", "torch"))
    kept["hybrid model training step"] = (mine, mine)
    if args.keep:
        with open(args.keep, "w") as f:
            json.dump(kept, f)
    print(f"| hybrid model training step (train_hybrid.py, L 1024, batch 8; peak memory grew "
          f"{mine_mib} against {ref_mib} MiB) | - | - | - | - | - | {mine:.1f} | {ref:.1f} "
          f"| {ref / mine:.2f}x | - | - | - | - |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peak", required=True, help="kdnn_machine_peak")
    ap.add_argument("--threads", default="1,2", help="thread counts, one process each")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20, help="of each training run")
    ap.add_argument("--sweep", action="store_true", help="the attention at S 512 … 8192 too")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: this count here
    ap.add_argument("--keep", help=argparse.SUPPRESS)  # internal: kdnn's times, as JSON
    args = ap.parse_args()
    if args.one:
        one_count(args, args.one)
        return
    import tempfile
    counts = [int(t) for t in args.threads.split(",")]
    kept = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            env = dict(os.environ, OMP_NUM_THREADS=str(n))
            keep = os.path.join(tmp, f"{n}.json")
            subprocess.run([sys.executable, __file__, "--peak", args.peak, "--repeats",
                            str(args.repeats), "--steps", str(args.steps), "--one", str(n),
                            "--keep", keep] + (["--sweep"] if args.sweep else []),
                           check=True, env=env)
            with open(keep) as f:
                kept[n] = json.load(f)
    if len(counts) > 1:
        one, most = min(counts), max(counts)
        print(f"\nkdnn's speed-up from {one} to {most} threads (its time on {one} over its time "
              f"on {most}, the same build)\n")
        print("| | forward | fwd+bwd |")
        print("|---|---|---|")
        for name, (fwd, both) in kept[one].items():
            fwd_n, both_n = kept[most][name]
            print(f"| {name} | {fwd / fwd_n:.2f}x | {both / both_n:.2f}x |")


if __name__ == "__main__":
    main()
