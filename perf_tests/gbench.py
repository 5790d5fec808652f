# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Running a Google Benchmark executable and reading its medians."""
import json
import subprocess
import tempfile


def median_times_ms(bench, args, repetitions):
    """Runs `bench args...` with `repetitions` repetitions and returns
    {run_name split at '/': median real time in ms} (a single run's time
    when repetitions is 1)."""
    return {name: ms for name, (ms, _) in median_runs(bench, args, repetitions).items()}


def median_runs(bench, args, repetitions):
    """As median_times_ms, with each run's user counters:
    {run_name split at '/': (median real time in ms, {counter: median})}."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([bench, *args, f"--benchmark_out={out.name}",
                        "--benchmark_out_format=json", f"--benchmark_repetitions={repetitions}",
                        "--benchmark_report_aggregates_only=true"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        data = json.load(open(out.name))
    results = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") not in (None, "median"):
            continue
        scale = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1e3}[b["time_unit"]]
        counters = {k: v for k, v in b.items() if isinstance(v, float) and k not in (
            "real_time", "cpu_time", "iterations")}
        results[tuple(b["run_name"].split("/"))] = (b["real_time"] * scale, counters)
    return results
