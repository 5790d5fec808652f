# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The machine-readable form of a comparison: one row per (family, op, size,
dtype) with kdnn's time, the reference's and, where the operator is
memory-bound, the fraction of the device's copy bandwidth it reaches.
Each compare_*.py writes its rows with --json; collect_results.py merges the
families' files and adds what identifies the run (date, commit, Kokkos
version, device).

Times (device_timing.py): kdnn_ms and reference_ms are device times, the
figures the ratios use, and kdnn_call_ms and reference_call_ms the call times
of the same runs; `timing` says "device+call". A side given as one number
(kdnn's Google Benchmark time where the package is not importable) leaves
its call time empty and makes `timing` "single". kdnn_bench_ms is the Google
Benchmark time of the C++ call, kept beside as a cross-check."""
import json

from device_timing import device_and_call

FIELDS = ("family", "op", "size", "dtype", "kdnn_ms", "reference", "reference_ms", "timing",
          "kdnn_call_ms", "reference_call_ms", "kdnn_bench_ms", "copy_gbps", "fraction_of_copy")


def row(family, op, size, kdnn, reference, reference_time, dtype="float32",
        traffic_bytes=None, copy_gbps=None, bench_ms=None):
    """A row; `kdnn` and `reference_time` are device_timing.Times (or single
    numbers of ms); `traffic_bytes` (the bytes the operator must move at
    least) and `copy_gbps` (the same device's copy bandwidth, bytes read +
    written per second / 1e9) give fraction_of_copy when both are known."""
    kdnn_ms, kdnn_call_ms = device_and_call(kdnn)
    reference_ms, reference_call_ms = device_and_call(reference_time)
    fraction = None
    if traffic_bytes is not None and copy_gbps and kdnn_ms:
        fraction = traffic_bytes / (kdnn_ms * 1e-3) / 1e9 / copy_gbps
    both = kdnn_call_ms is not None and reference_call_ms is not None
    return dict(family=family, op=op, size="x".join(map(str, size)), dtype=dtype,
                kdnn_ms=kdnn_ms, reference=reference, reference_ms=reference_ms,
                timing="device+call" if both else "single", kdnn_call_ms=kdnn_call_ms,
                reference_call_ms=reference_call_ms, kdnn_bench_ms=bench_ms,
                copy_gbps=copy_gbps, fraction_of_copy=fraction)


def write(path, rows):
    """Writes `rows` (a list of row()s) as JSON to `path`, if a path is given."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
