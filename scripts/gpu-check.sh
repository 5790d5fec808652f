#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# One-call GPU check, for a GPU machine that has the repository and the CUDA
# build (build/cuda, from `cmake --preset cuda && cmake --build build/cuda`)
# but no package registry; PyTorch and Triton must be installed there.
#   scripts/gpu-check.sh OUT_DIR
# Runs the CUDA unit tests (and the same tests on the build's host execution
# space), the CLI tests and the examples, then the
# benchmarks against their references on this GPU: perf_tests/compare_sinkhorn.py
# (PyTorch, the Triton kernel, the device copy bandwidth; table.md) and
# perf_tests/compare_mha.py (PyTorch float32; mha_table.md),
# perf_tests/compare_fused_attention.py (PyTorch's scaled_dot_product_attention,
# PyTorch >= 2; fused_attention_table.md),
# perf_tests/compare_fused_attention_varlen.py (packed sequences against SDPA
# per sequence and kdnn on one sequence; fused_attention_varlen_table.md),
# perf_tests/compare_ssm_conv.py
# (Mamba-2's causal conv1d + SiLU against PyTorch's F.conv1d; ssm_conv_table.md),
# perf_tests/compare_ssd.py (Mamba-2's SSD against the chunked PyTorch
# formulation; ssd_table.md), and writes the logs and tables to OUT_DIR, and
# every family's rows in one machine-readable list, OUT_DIR/results.json
# (perf_tests/collect_results.py: perf_tests/result_rows.py's fields, device
# and call times among them, with date, commit, kokkos_version and device),
# to be committed as perf_tests/results/h100.json beside h100.md.
# scripts/gpu-window.sh runs this after a smoke stage, within one time limit.
# KDNN_COMMIT names the commit when the copy has no git history.
# KDNN_GPU_BENCH="sinkhorn fused-attention varlen-attention attention ssm-conv
# ssd" (the default)
# picks the benchmark families and their order; KDNN_GPU_TESTS="unit host cli
# examples python cp" (the default; set and empty: none) the test steps ("cp":
# the context-parallel tests and the Mamba-2 block example on 2 ranks sharing
# the GPU, for a build with kdnn::cp, with the mpiexec of KDNN_MPI_RUNTIME, an
# Open MPI packed by scripts/pack-mpi-runtime.sh, or else of the PATH; "python":
# the Python package's tests, python/tests, and the example model's training
# on the GPU with kdnn's and PyTorch's operators, with the build's extension
# module, python/_kdnn*.so, when the build has one: a CUDA build configured
# with kdnn_ENABLE_PYTHON=ON for this node's Python; see docs/python.md);
# KDNN_MAMBA_ROOT (a state-spaces/mamba checkout; PyTorch, Triton, einops
# and packaging importable) adds mamba's Triton SSD to the SSD comparison;
# KDNN_TE_ROOT (a NVIDIA/TransformerEngine checkout; only its Triton mHC
# kernels are loaded) adds its Sinkhorn at n = 4 to the Sinkhorn comparison;
# KDNN_{SINKHORN,FUSED,VARLEN,MHA,SSM_CONV,SSD}_SIZES
# replace a family's default sizes (KDNN_FUSED_TIMEOUT, KDNN_FUSED_REPETITIONS:
# the fused attention's limit per size and C++ benchmark repetitions), KDNN_UNIT_TIMEOUT the unit tests' limit (s).
# A cuda13 build's cuBLAS is the system's libcublas.so.13 or, where there is
# none, the one PyTorch's CUDA wheels carry; device.txt records which.
# Exits non-zero if any test fails.
set -uo pipefail
out=${1:?usage: scripts/gpu-check.sh OUT_DIR}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KDNN_CUDA_BUILD:-$repo/build/cuda}
mkdir -p "$out"
cd "$repo" || exit 2
export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KDNN_TEST_DATA_DIR="$repo/unit_tests/data" KDNN_CLI_PATH="$build/examples/kdnn"
python=${PYTHON:-python3}
status=0
commit=${KDNN_COMMIT:-$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)}
kokkos_version=$(sed -n 's/^#define KDNN_KOKKOS_VERSION_STRING "\(.*\)"/\1/p' \
  "$build/include/kdnn/config.hpp" 2>/dev/null)
# Merges the families' rows (those that ran) into OUT_DIR/results.json.
collect_rows() {
  compgen -G "$out/rows_*.json" > /dev/null || return 0
  "$python" perf_tests/collect_results.py "$out"/rows_*.json --out "$out/results.json" \
    --commit "$commit" --kokkos-version "${kokkos_version:-unknown}" \
    --device "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" || status=1
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } \
  | tee "$out/device.txt"
# Each step has a time limit, so that a hung kernel costs minutes, not the lease.
# A build linked against cuBLAS (the cuda13 preset) needs libcublas.so.13 at
# run time: the system's, else the one in PyTorch's CUDA wheels (nvidia-cublas).
if ldd "$build/unit_tests/kdnn_unit_tests" 2>/dev/null | grep -q 'libcublas.*not found'; then
  wheel_cublas=$("$python" - <<'PY' 2>/dev/null
import glob, os, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
hits = [h for d in dirs for h in glob.glob(os.path.join(d, "nvidia", "**", "libcublas.so.*"), recursive=True)]
print(os.path.dirname(sorted(hits)[0]) if hits else "")
PY
)
  [[ -n $wheel_cublas ]] && export LD_LIBRARY_PATH="$wheel_cublas:$LD_LIBRARY_PATH"
fi
{ echo "cuBLAS as loaded:"
  ldd "$build/unit_tests/kdnn_unit_tests" | grep -iE 'cublas|cudart' || echo "  (not linked)"
} | tee -a "$out/device.txt"
tests=${KDNN_GPU_TESTS-unit host cli examples python cp}  # set and empty: no test step
if [[ " $tests " == *" unit "* ]]; then
  echo "== unit tests"
  timeout "${KDNN_UNIT_TIMEOUT:-300}" "$build/unit_tests/kdnn_unit_tests" \
    --gtest_output="xml:$out/unit_tests.xml" > "$out/unit_tests.log" 2>&1 || status=1
  grep -E '^\[  (FAILED|PASSED|SKIPPED) ' "$out/unit_tests.log" | head -n 40
fi
if [[ " $tests " == *" host "* && -x "$build/unit_tests/kdnn_unit_tests_host" ]]; then
  echo "== unit tests on the host execution space of the same build"
  timeout 300 "$build/unit_tests/kdnn_unit_tests_host" \
    --gtest_output="xml:$out/unit_tests_host.xml" > "$out/unit_tests_host.log" 2>&1 || status=1
  grep -E '^\[  (FAILED|PASSED|SKIPPED) ' "$out/unit_tests_host.log" | head -n 40
fi
if [[ " $tests " == *" cli "* ]]; then
  echo "== CLI tests"
  timeout 120 "$build/unit_tests/kdnn_cli_tests" > "$out/cli_tests.log" 2>&1 || status=1
  grep -E '^\[  (FAILED|PASSED|SKIPPED) ' "$out/cli_tests.log" | head -n 20
fi
if [[ " $tests " == *" examples "* ]]; then
  echo "== demo (examples/mhc_sinkhorn, one process) and Kokkos' view of the device"
  timeout 60 "$build/examples/mhc_sinkhorn" 16384 4 48 --kokkos-print-configuration \
    > "$out/demo.log" 2>&1 || status=1
  grep -iE 'cuda|arch|device|error|fail' "$out/demo.log" | head -n 20; tail -n 5 "$out/demo.log"
  echo "== example: one attention layer trained by SGD"
  timeout 60 "$build/examples/mha_training" > "$out/mha_training.log" 2>&1 || status=1
  tail -n 2 "$out/mha_training.log"
fi
# The build's Python module, as the package python/kdnn beside it (for the
# python step and the SSD accuracy table), when the build has one.
package=
module=$(compgen -G "$build/python/_kdnn*.so" | head -n 1)
if [[ -n $module ]]; then
  package=$(mktemp -d)
  trap 'rm -rf "$package"' EXIT
  cp -r python/kdnn "$package/" && cp "$module" "$package/kdnn/"
  # Every comparison times kdnn through this package (device_timing.py).
  export PYTHONPATH="$package${PYTHONPATH:+:$PYTHONPATH}"
fi
if [[ " $tests " == *" python "* ]]; then
  if [[ -z $package ]]; then
    echo "== Python tests: skipped ($build/python has no _kdnn module)"
  else
    echo "== Python tests (python/tests, CUDA tensors included) with $(basename "$module")"
    # --capture=sys: what C++ writes to stderr before an abort reaches the log.
    PYTHONPATH="$package" timeout 600 "$python" -m pytest -q -p no:cacheprovider --capture=sys python/tests \
      --ignore=python/tests/mpi > "$out/python_tests.log" 2>&1 || status=1
    tail -n 5 "$out/python_tests.log"
    # The example model's training step on this GPU, kdnn's operators and
    # PyTorch's (as perf_tests/results/cpu-python.md on the CPU).
    for length in 64 256 1024; do
      for ops in kdnn torch; do
        PYTHONPATH="$package" timeout 300 "$python" python/examples/train_hybrid.py --device cuda \
          --ops "$ops" --length "$length" --steps 100 >> "$out/python_example.log" 2>&1 || status=1
      done
    done
    grep -E 'ops=|per step' "$out/python_example.log"
  fi
fi
if [[ " $tests " == *" cp "* ]]; then
  cp_tests="$build/unit_tests/kdnn_cp_tests"
  runtime=${KDNN_MPI_RUNTIME:-}
  mpiexec=$([[ -n $runtime ]] && echo "$runtime/bin/mpiexec" || command -v mpiexec || true)
  if [[ ! -x $cp_tests ]]; then
    echo "== context-parallel tests: skipped (the build has no kdnn::cp: kdnn_ENABLE_MPI=ON and an MPI)"
  elif [[ -z $mpiexec ]]; then
    echo "== context-parallel tests: skipped (no mpiexec here; KDNN_MPI_RUNTIME: scripts/pack-mpi-runtime.sh)"
  else
    echo "== context-parallel tests and examples/mamba2_cp_block, 2 ranks sharing this GPU"
    # The tests' MPI environment, and a packed Open MPI's own paths.
    mapfile -t mpi_env < <(grep -E '^[A-Za-z_]' cmake/mpi-test-environment)
    [[ -n $runtime ]] && mpi_env+=("OPAL_PREFIX=$runtime"
      "PMIX_MCA_mca_base_component_path=$runtime/pmix/lib/pmix"
      "LD_LIBRARY_PATH=$runtime/lib:$LD_LIBRARY_PATH")
    env "${mpi_env[@]}" timeout 300 "$mpiexec" -n 2 "$cp_tests" --gtest_color=no > "$out/cp_tests.log" 2>&1 || status=1
    grep -E '^\[  (FAILED|PASSED) ' "$out/cp_tests.log" | head -n 20
    env "${mpi_env[@]}" timeout 120 "$mpiexec" -n 2 "$build/examples/mamba2_cp_block" 4099 2 4 64 64 64 \
      > "$out/mamba2_cp_block.log" 2>&1 || status=1
    tail -n 3 "$out/mamba2_cp_block.log"
  fi
fi
bench=${KDNN_GPU_BENCH-sinkhorn fused-attention varlen-attention attention ssm-conv ssd}  # empty: none
bench_ssd() {
  echo "== SSD benchmarks (kdnn, the chunked PyTorch formulation float32 on this GPU)"
  local mamba=()
  [[ -n ${KDNN_MAMBA_ROOT:-} ]] && mamba=(--mamba-root "$KDNN_MAMBA_ROOT")
  timeout 420 "$python" perf_tests/compare_ssd.py \
    --device cuda --bench "$build/perf_tests/kdnn_perf_ssd" "${mamba[@]}" --accuracy \
    --sizes "${KDNN_SSD_SIZES:-2x4096x8x64x64x64,2x4096x8x64x64x128,2x16384x8x64x64x64,8x4096x32x64x128x64}" \
    --json "$out/rows_ssd.json" | tee "$out/ssd_table.md" || status=1
}
bench_ssm_conv() {
  echo "== causal conv1d + SiLU benchmarks (kdnn, PyTorch float32 on this GPU)"
  timeout 300 "$python" perf_tests/compare_ssm_conv.py --device cuda \
    --bench "$build/perf_tests/kdnn_perf_ssm_conv" \
    --sizes "${KDNN_SSM_CONV_SIZES:-8x4096x1024x4,2x16384x2048x4,4x8192x4096x4}" \
    --json "$out/rows_ssm_conv.json" | tee "$out/ssm_conv_table.md" || status=1
}
bench_fused_attention() {
  echo "== fused attention benchmarks (kdnn fused and unfused, PyTorch SDPA float32 on this GPU)"
  # One size per run, each with its own limit (KDNN_FUSED_TIMEOUT s, default
  # 140), so that one slow size (the C++ benchmark runs first) leaves the
  # others their tables; the C++ benchmark repeats KDNN_FUSED_REPETITIONS
  # times (default 2).
  local sizes=${KDNN_FUSED_SIZES:-8x4x128x128x64,1x8x2048x2048x64,1x8x8192x8192x64}
  : > "$out/fused_attention_table.md"
  for size in ${sizes//,/ }; do
    timeout "${KDNN_FUSED_TIMEOUT:-140}" "$python" perf_tests/compare_fused_attention.py \
      --device cuda --bench "$build/perf_tests/kdnn_perf_fused_attention" --sizes "$size" \
      --repetitions "${KDNN_FUSED_REPETITIONS:-2}" --unfused-max-seq 2048 \
      --json "$out/rows_fused_attention_$size.json" | tee -a "$out/fused_attention_table.md" ||
      status=1
  done
}
bench_varlen_attention() {
  echo "== packed-sequence attention benchmarks (kdnn varlen, PyTorch SDPA per sequence on this GPU)"
  timeout 180 "$python" perf_tests/compare_fused_attention_varlen.py --device cuda \
    --bench "$build/perf_tests/kdnn_perf_fused_attention_varlen" \
    --sizes "${KDNN_VARLEN_SIZES:-32768x8x64x64x4096}" \
    --json "$out/rows_fused_attention_varlen.json" | tee "$out/fused_attention_varlen_table.md" ||
    status=1
}
bench_attention() {
  echo "== attention benchmarks (kdnn, PyTorch float32 on this GPU)"
  timeout 300 "$python" perf_tests/compare_mha.py --device cuda \
    --bench "$build/perf_tests/kdnn_perf_mha" \
    --sizes "${KDNN_MHA_SIZES:-8x4x128x128x64,2x4x1024x1024x64,1x8x2048x2048x64}" \
    --json "$out/rows_mha.json" | tee "$out/mha_table.md" || status=1
}
bench_sinkhorn() {
  echo "== Triton kernel self-check"
  "$python" perf_tests/sinkhorn_triton.py 2>&1 | tee "$out/triton_check.log" || status=1
  echo "== Sinkhorn benchmarks (kdnn, PyTorch, Triton on this GPU)"
  timeout 420 "$python" perf_tests/compare_sinkhorn.py --device cuda \
    --bench "$build/perf_tests/kdnn_perf_sinkhorn" \
    --sizes "${KDNN_SINKHORN_SIZES:-65536x16x100,65536x4x20,4096x16x100,16384x4x20,10001x4x48}" \
    ${KDNN_TE_ROOT:+--te-root "$KDNN_TE_ROOT"} \
    --out "$out" --json "$out/rows_sinkhorn.json" || status=1
}
# The families run in the order KDNN_GPU_BENCH names them; the rows of those
# that ran are merged after each one, so a call cut short keeps what it measured.
for family in $bench; do
  case $family in
    sinkhorn) bench_sinkhorn ;;
    fused-attention) bench_fused_attention ;;
    varlen-attention) bench_varlen_attention ;;
    attention) bench_attention ;;
    ssm-conv) bench_ssm_conv ;;
    ssd) bench_ssd ;;
    *) echo "gpu-check: unknown family '$family' in KDNN_GPU_BENCH" >&2; status=1 ;;
  esac
  collect_rows
done
exit $status
