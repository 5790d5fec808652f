#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# One-call Nsight Compute profile of the GPU forms' kernels at the sizes of
# the issues' targets (Sinkhorn, fused attention, the causal conv, the SSD), for a GPU machine with the repository, a CUDA build
# (as for scripts/gpu-check.sh) and Nsight Compute (`ncu`):
#   scripts/gpu-profile.sh OUT_DIR
# For each kernel it writes OUT_DIR/ncu_<name>.csv (ncu --csv --page details)
# and its log, then OUT_DIR/ncu_summary.md (perf_tests/ncu_summary.py): time,
# DRAM and SM throughput, registers, occupancy, shared-memory use and bank
# conflicts, local-memory (spill) traffic, issue activity, one row per kernel.
# KDNN_CUDA_BUILD names the build (default build/cuda); each profile has a
# time limit, so that a hung replay costs minutes, not the lease. Exits
# non-zero if a profile fails.
set -uo pipefail
out=${1:?usage: scripts/gpu-profile.sh OUT_DIR}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KDNN_CUDA_BUILD:-$repo/build/cuda}
mkdir -p "$out"
export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
sections=(--section SpeedOfLight --section Occupancy --section LaunchStats
          --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables
          --section WarpStateStats --section ComputeWorkloadAnalysis)
# profile NAME KERNEL_REGEX COUNT BENCH ARGS...: the first COUNT launches of
# the kernels matching KERNEL_REGEX in one benchmark run.
profile() {
  local name=$1 regex=$2 count=$3
  shift 3
  echo "== $name"
  timeout 180 ncu --kernel-name-base demangled -k "regex:$regex" -c "$count" "${sections[@]}" \
    --csv --page details "$@" --benchmark_min_time=0.01 --benchmark_repetitions=1 \
    > "$out/ncu_$name.csv" 2> "$out/ncu_$name.log" || { status=1; tail -n 5 "$out/ncu_$name.log"; }
}
sinkhorn=$build/perf_tests/kdnn_perf_sinkhorn
profile sinkhorn_forward ForwardGpuKernel 1 "$sinkhorn" --kdnn_sizes=65536x16x100 \
  --benchmark_filter='sinkhorn_f32/forward/'
profile sinkhorn_implicit CGBackwardGpuKernel 1 "$sinkhorn" --kdnn_sizes=65536x16x100 \
  --benchmark_filter='sinkhorn_f32/implicit/'
profile sinkhorn_unrolled UnrolledBackwardGpuKernel 1 "$sinkhorn" --kdnn_sizes=65536x16x100 \
  --benchmark_filter='sinkhorn_f32/unrolled/'
fused=$build/perf_tests/kdnn_perf_fused_attention
profile fused_forward FusedForwardGpuKernel 1 "$fused" --kdnn_sizes=1x8x2048x2048x64 \
  --benchmark_filter='sdpa_f32/fused_forward/'
profile fused_backward 'FusedBackward(KV|Q)?(Gpu|Mma)Kernel' 2 "$fused" --kdnn_sizes=1x8x2048x2048x64 \
  --benchmark_filter='sdpa_f32/fused_backward/'
profile ssm_conv_forward ConvForwardKernel 1 "$build/perf_tests/kdnn_perf_ssm_conv" \
  --kdnn_sizes=4x8192x4096x4 --benchmark_filter='ssm_conv_f32/forward/'
# The SSD's GPU forms at the size where the forward trails mamba's Triton
# kernels: the forward's two chunk kernels; the backward's seven (chunk
# states and dstates, da_diag, dX̃, dB, dC, the finish); the tensor-core
# form's three forward kernels (scores, chunk states, output) and seven of
# its backward (chunk states and dstates, C·Bᵀ, dX̃, dY·X̃ᵀ, dB, dC).
ssd=$build/perf_tests/kdnn_perf_ssd
profile ssd_forward 'SsdChunk(State|Output)GpuKernel' 2 "$ssd" --kdnn_sizes=2x16384x8x64x64x64 \
  --benchmark_filter='ssd_f32/forward/gpu/'
profile ssd_backward 'Ssd(ChunkState|DaDiag|Gradient|BackwardFinish)GpuKernel' 7 "$ssd" \
  --kdnn_sizes=2x16384x8x64x64x64 --benchmark_filter='ssd_f32/backward/gpu/'
profile ssd_forward_mma 'SsdChunk(Scores|State|Output)MmaKernel' 3 "$ssd" \
  --kdnn_sizes=2x16384x8x64x64x64 --benchmark_filter='ssd_f32/forward/tensor_cores/'
profile ssd_backward_mma 'Ssd(ChunkScores|ChunkState|Gradient)MmaKernel' 7 "$ssd" \
  --kdnn_sizes=2x16384x8x64x64x64 --benchmark_filter='ssd_f32/backward/tensor_cores/'
python3 "$repo/perf_tests/ncu_summary.py" "$out"/ncu_*.csv | tee "$out/ncu_summary.md" || status=1
exit $status
