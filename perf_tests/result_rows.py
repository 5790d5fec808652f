# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The machine-readable form of a comparison: one row per (family, op, size,
dtype) with kdnn's time, the reference's and, where the operator is
memory-bound, the fraction of the device's copy bandwidth it reaches.
Each compare_*.py writes its rows with --json; collect_results.py merges the
families' files and adds what identifies the run (date, commit, Kokkos
version, device)."""
import json

FIELDS = ("family", "op", "size", "dtype", "kdnn_ms", "reference", "reference_ms",
          "copy_gbps", "fraction_of_copy")


def row(family, op, size, kdnn_ms, reference, reference_ms, dtype="float32",
        traffic_bytes=None, copy_gbps=None):
    """A row; `traffic_bytes` (the bytes the operator must move at least)
    and `copy_gbps` (the same device's copy bandwidth, bytes read + written
    per second / 1e9) give fraction_of_copy when both are known."""
    fraction = None
    if traffic_bytes is not None and copy_gbps and kdnn_ms:
        fraction = traffic_bytes / (kdnn_ms * 1e-3) / 1e9 / copy_gbps
    return dict(family=family, op=op, size="x".join(map(str, size)), dtype=dtype,
                kdnn_ms=kdnn_ms, reference=reference, reference_ms=reference_ms,
                copy_gbps=copy_gbps, fraction_of_copy=fraction)


def write(path, rows):
    """Writes `rows` (a list of row()s) as JSON to `path`, if a path is given."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
