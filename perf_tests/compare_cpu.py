#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""kdnn beside the current PyTorch (2.x, from PyPI) on the CPU, on the same
cores with equal thread counts, in one process: every operator family's
forward + backward (medians of --repeats runs, timed and fed by each
family's compare_*.py) with its rate (GFLOP/s for the attention's and the
SSD's products, GB/s for the memory-bound conv, counted as below) and that
rate as a fraction of the machine's ceiling on that many threads
(perf_tests/machine_peak.cpp: the FMA peak, the copy bandwidth); then the
example model's training step (python/examples/train_hybrid.py, each side
in its own process: time and the growth of peak memory). One markdown
table per thread count.

Counted work: attention 4·B·H·S·Sk·D FLOP forward (half of it causal),
2.5 times that backward; the SSD's chunk products, per chunk of Q steps
2·Q²·N (C·Bᵀ, one group) + H·(2·Q²·P + 4·Q·N·P) FLOP forward (the
within-chunk output, the chunk state and the state's output), twice that
backward; the conv 2·B·L·D·4 bytes forward (x read, y written) and
3·B·L·D·4 backward (x and dy read, dx written).

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
SSD = (2, 4096, 8, 64, 64, 64)  # B, L, H, P, N, chunk
CONV = (4, 1024, 8192, 4)       # B, L, D, K


def fwd_bwd_ms(times):
    """Forward + backward ms of a device_timing.forward_backward result."""
    return times["forward"].device_ms + times["backward"].device_ms


def rows(kdnn, torch, F, repeats):
    """(name, kdnn ms, PyTorch ms, rate unit, work of fwd+bwd, ceiling) per
    row, each timed by its family's compare_*.py (the same inputs)."""
    import compare_fused_attention as attention
    import compare_ssd as ssd
    import compare_ssm_conv as conv

    out = []
    for B, H, S, D, causal, dtype in ATTENTION:
        size = (B, H, S, S, D)
        ms = [fwd_bwd_ms(attention.timed(f, size, "cpu", repeats, getattr(torch, dtype))) for f in (
            lambda q, k, v: kdnn.flash_attention(q, k, v, causal=causal),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal))]
        flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0) * 3.5
        name = f"{'causal ' if causal else ''}attention {dtype} ({B}, {H}, {S}, {D})"
        out.append((name, *ms, "GFLOP/s", flops / 1e9, dtype))

    Bb, L, H, P, N, Q = SSD
    ms = [fwd_bwd_ms(ssd.timed(f, SSD, "cpu", repeats)) for f in (ssd.kdnn_ssd(kdnn),
                                                                    ssd.ssd_chunked)]
    chunks = Bb * L // Q
    ssd_flops = 3.0 * chunks * (2 * Q * Q * N + H * (2 * Q * Q * P + 4 * Q * N * P))
    out.append((f"SSD ({Bb}, {L}, {H}, {P}, N {N}, chunk {Q}) vs the chunked PyTorch form",
                *ms, "GFLOP/s", ssd_flops / 1e9, "float32"))

    Bc, Lc, Dc, K = CONV
    ms = [fwd_bwd_ms(conv.timed(f, CONV, "cpu", repeats)) for f in (conv.kdnn_conv(kdnn),
                                                                      conv.conv)]
    out.append((f"conv + SiLU ({Bc}, {Lc}, {Dc}, K {K}) vs F.conv1d + F.silu", *ms, "GB/s",
                4.0 * Bc * Lc * Dc * 5 / 1e9, "copy"))
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
    print("| fwd+bwd | kdnn ms | PyTorch ms | PyTorch / kdnn | kdnn rate | of ceiling "
          "| PyTorch rate | of ceiling |")
    print("|---|---|---|---|---|---|---|---|")
    for name, mine, ref, unit, work, kind in rows(kdnn, torch, F, args.repeats):
        rk, rt = work / (mine * 1e-3), work / (ref * 1e-3)
        print(f"| {name} | {mine:.1f} | {ref:.1f} | {ref / mine:.2f}x | {rk:.1f} {unit} "
              f"| {rk / ceiling[kind]:.0%} | {rt:.1f} {unit} | {rt / ceiling[kind]:.0%} |",
              flush=True)
    (mine, mine_mib), (ref, ref_mib) = (training_step(ops, threads, args.steps)
                                        for ops in ("kdnn", "torch"))
    print(f"| hybrid model training step (train_hybrid.py, L 1024, batch 8; peak memory grew "
          f"{mine_mib} against {ref_mib} MiB) | {mine:.1f} | {ref:.1f} | {ref / mine:.2f}x "
          f"| - | - | - | - |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peak", required=True, help="kdnn_machine_peak")
    ap.add_argument("--threads", default="1,2", help="thread counts, one process each")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20, help="of each training run")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: this count here
    args = ap.parse_args()
    if args.one:
        one_count(args, args.one)
        return
    for n in (int(t) for t in args.threads.split(",")):
        env = dict(os.environ, OMP_NUM_THREADS=str(n))
        subprocess.run([sys.executable, __file__, "--peak", args.peak, "--repeats",
                        str(args.repeats), "--steps", str(args.steps), "--one", str(n)],
                       check=True, env=env)


if __name__ == "__main__":
    main()
