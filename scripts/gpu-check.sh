#!/usr/bin/env bash
# One-call GPU check, for a GPU machine that has the repository and the CUDA
# build (build/cuda, from `cmake --preset cuda && cmake --build build/cuda`)
# but no package registry; PyTorch and Triton must be installed there.
#   scripts/gpu-check.sh OUT_DIR
# Runs the CUDA unit tests and the CLI tests, then perf_tests/compare_sinkhorn.py
# (kdnn benchmarks, the PyTorch formulations, the Triton kernel and the device
# copy bandwidth, all on this GPU), and writes the logs and table.md to OUT_DIR.
# Exits non-zero if any test fails.
set -uo pipefail
out=${1:?usage: scripts/gpu-check.sh OUT_DIR}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KDNN_CUDA_BUILD:-$repo/build/cuda}
mkdir -p "$out"
cd "$repo"
export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KDNN_TEST_DATA_DIR="$repo/unit_tests/data" KDNN_CLI_PATH="$build/examples/kdnn"
python=${PYTHON:-python3}
status=0

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } \
  | tee "$out/device.txt"
echo "== unit tests"
"$build/unit_tests/kdnn_unit_tests" --gtest_output="xml:$out/unit_tests.xml" \
  > "$out/unit_tests.log" 2>&1 || status=1
tail -n 3 "$out/unit_tests.log"
echo "== CLI tests"
"$build/unit_tests/kdnn_cli_tests" > "$out/cli_tests.log" 2>&1 || status=1
tail -n 3 "$out/cli_tests.log"
echo "== Triton kernel self-check"
"$python" perf_tests/sinkhorn_triton.py 2>&1 | tee "$out/triton_check.log" || status=1
echo "== benchmarks (kdnn, PyTorch, Triton on this GPU)"
"$python" perf_tests/compare_sinkhorn.py --device cuda \
  --bench "$build/perf_tests/kdnn_perf_sinkhorn" \
  --sizes 65536x16x100,4096x16x100,10001x4x48 --out "$out" || status=1
exit $status
