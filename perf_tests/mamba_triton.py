# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Mamba-2's own Triton SSD kernels (mamba_chunk_scan_combined, from the
state-spaces/mamba sources; never part of this repository) as a peer for
perf_tests/compare_ssd.py.

load(root) imports mamba_ssm.ops.triton.ssd_combined from a checkout `root`
without running mamba_ssm/__init__.py, which needs mamba's compiled CUDA
extensions; the Triton kernels need only PyTorch, Triton, einops and
packaging. Its tl.dot products take float32 operands on TF32 tensor cores,
so its results are compared with the float64 formulation here as kdnn's
are, rather than assumed exact."""
import os
import sys
import types


def load(root):
    """mamba_chunk_scan_combined from the mamba checkout at `root`."""
    package = os.path.join(os.path.abspath(root), "mamba_ssm")
    if not os.path.isdir(os.path.join(package, "ops", "triton")):
        raise SystemExit(f"--mamba-root={root}: expected a state-spaces/mamba checkout "
                         f"(no {package}/ops/triton)")
    if "mamba_ssm" not in sys.modules:
        stub = types.ModuleType("mamba_ssm")  # the package, without its __init__
        stub.__path__ = [package]
        sys.modules["mamba_ssm"] = stub
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    return mamba_chunk_scan_combined


def ssd(combined, x, dt, A, B, C, chunk, D):
    """kdnn_reference.ssd.ssd_chunked's (y, None) through mamba's kernels: the
    same arguments (dt as given, no softplus or bias, no initial state)."""
    return combined(x, dt, A, B, C, chunk, D=D), None


def relative_errors(y, grads, y64, grads64):
    """max |a - b| / max |b| of the output and of each gradient."""
    def rel(a, b):
        return ((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()
    return rel(y, y64), [rel(g, g64) for g, g64 in zip(grads, grads64)]
