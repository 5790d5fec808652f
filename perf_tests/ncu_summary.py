#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""One markdown row per profiled kernel from Nsight Compute's CSV
(`ncu --csv --page details`, as scripts/gpu-profile.sh writes it): time,
DRAM and SM throughput, registers, occupancy, shared memory, bank
conflicts, local-memory (spill) traffic and issue activity. Metrics a
profile lacks are shown as "-".

  python3 perf_tests/ncu_summary.py OUT/ncu_*.csv
"""
import csv
import os
import sys

# (column, ncu's metric names in order of preference)
COLUMNS = [
    ("time", ["Duration"]),
    ("DRAM %", ["DRAM Throughput"]),
    ("SM %", ["Compute (SM) Throughput", "SM Throughput"]),
    ("regs", ["Registers Per Thread"]),
    ("block", ["Block Size"]),
    ("smem/block", ["Dynamic Shared Memory Per Block", "Shared Memory Configuration Size"]),
    ("occupancy theor. / achieved", ["Theoretical Occupancy", "Achieved Occupancy"]),
    ("bank conflicts", ["Shared Load Bank Conflicts", "L1/TEX Shared Load Bank Conflicts",
                        "Bank Conflicts"]),
    ("local (spill) requests", ["Local Memory Spilling Requests", "Local Load Sectors"]),
    ("issued / cycle", ["Issue Slots Busy", "Executed Ipc Active"]),
]


def kernels(path):
    """{(id, kernel name): {metric name: "value unit"}} of one CSV file."""
    out = {}
    try:
        with open(path, newline="") as f:
            rows = [r for r in csv.reader(f) if r]
    except OSError:
        return out
    header = next((i for i, r in enumerate(rows) if "Metric Name" in r), None)
    if header is None:
        return out
    cols = {name: k for k, name in enumerate(rows[header])}
    for r in rows[header + 1:]:
        if len(r) < len(cols):
            continue
        key = (r[cols["ID"]], r[cols["Kernel Name"]])
        metrics = out.setdefault(key, {"Block Size": r[cols["Block Size"]]}
                                 if "Block Size" in cols else {})
        unit = r[cols["Metric Unit"]] if "Metric Unit" in cols else ""
        metrics[r[cols["Metric Name"]]] = (r[cols["Metric Value"]] + " " + unit).strip()
    return out


def cell(metrics, names):
    if names == ["Theoretical Occupancy", "Achieved Occupancy"]:
        return " / ".join(metrics.get(n, "-") for n in names)
    return next((metrics[n] for n in names if n in metrics), "-")


def main():
    print("| profile | kernel | " + " | ".join(c for c, _ in COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for path in sys.argv[1:]:
        name = os.path.basename(path)
        name = name[len("ncu_"):] if name.startswith("ncu_") else name
        name = name[:-len(".csv")] if name.endswith(".csv") else name
        found = kernels(path)
        if not found:
            print(f"| {name} | (no kernel profiled) |" + " |" * len(COLUMNS))
        for (_, kernel), metrics in found.items():
            short = kernel[:60]
            for marker in ("FusedForwardGpuKernel", "FusedBackwardKVGpuKernel",
                           "FusedBackwardQGpuKernel", "ForwardGpuKernel", "CGBackwardGpuKernel",
                           "UnrolledBackwardGpuKernel", "ConvForwardKernel"):
                if marker in kernel:
                    short = marker
                    break
            print(f"| {name} | {short} | " + " | ".join(cell(metrics, n) for _, n in COLUMNS)
                  + " |")


if __name__ == "__main__":
    main()
