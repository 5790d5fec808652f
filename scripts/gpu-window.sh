#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# One call that spends a short GPU window well (docs/building.md, "A GPU
# window"): a smoke stage first, then scripts/gpu-check.sh's steps, each
# under its own time limit and all under one overall limit, then everything
# packed into at most eight files.
#
#   scripts/gpu-window.sh OUT_DIR
#
# 1. smoke (at most KDNN_SMOKE_LIMIT s, default 60): the device, the tensor
#    cores' products against their emulation, one unit test per family (Sinkhorn
#    and its GPU forms, fused attention, the attention layer, the causal conv,
#    the SSD forward and backward) and the concurrent-calls
#    tests on the GPU, and, when the build has the Python module, one kdnn
#    call made first from a new thread and a backward on autograd's thread.
#    A smoke failure is reported and the later steps still run.
# 2. scripts/gpu-check.sh OUT_DIR/check, with the environment given (its
#    KDNN_GPU_TESTS, KDNN_GPU_BENCH, sizes, ...), under what is left of
#    KDNN_WINDOW_LIMIT (s, default 420) after the smoke stage.
# 3. OUT_DIR then holds summary.md (the smoke results, each step's last
#    lines), results.json (the benchmark rows, when any ran) and logs.tgz
#    (every log, table and XML report): three files, within the eight a
#    call may bring back.
# KDNN_CUDA_BUILD (default build/cuda) is the build, as for gpu-check.sh.
# Exits non-zero when a smoke test or a check failed, or a limit cut a step.
set -uo pipefail
out=${1:?usage: scripts/gpu-window.sh OUT_DIR}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KDNN_CUDA_BUILD:-$repo/build/cuda}
python=${PYTHON:-python3}
window=${KDNN_WINDOW_LIMIT:-420}
smoke_limit=${KDNN_SMOKE_LIMIT:-60}
started=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out" "$work/logs"
summary="$out/summary.md"
status=0
cd "$repo" || exit 2
export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# One smoke step: NAME LIMIT COMMAND...; its output in logs/smoke_NAME.log.
smoke() {
  local name=$1 limit=$2
  shift 2
  local begin=$SECONDS rc=0
  timeout "$limit" "$@" > "$work/logs/smoke_$name.log" 2>&1 || rc=$?
  local verdict=passed
  ((rc == 124)) && verdict="cut at ${limit} s"
  ((rc != 0 && rc != 124)) && verdict="FAILED (exit $rc)"
  ((rc != 0)) && status=1
  echo "| $name | $verdict | $((SECONDS - begin)) s |" >> "$summary"
}

{
  echo "# GPU window: $(date -u +%FT%TZ)"
  echo
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1
  echo
  echo "| smoke step | result | time |"
  echo "|---|---|---|"
} > "$summary"
# First the tensor cores against their emulation (mma.sync and the quad
# shuffles), items claimed in order waiting on lower ones (the backward's
# dQ turns: a hang here is a deadlock, cut by the step's limit), then the
# attention built on them, the lanes' butterfly shuffles, the 16-byte
# matrix accesses and the lanes' 16-byte reads of shared vectors against
# their emulation, then one test per family (the SSD's with its state pass
# and its scores shared by a group's heads).
families='TeamMma.*:TeamQuads.*:TeamPlan.ItemsClaimedInOrderMayWaitOnLowerOnes:FusedAttentionMma.*'
families+=':LaneButterfly*:MatrixCopy*:LaneDot*:ProjectedCG.*'
families+=':SinkhornTyped/0.ForwardMatchesPlainFormula:SinkhornGpuForm*:SinkhornThreadArithmetic*'
families+=':FusedAttention/0.BackwardMatchesTheUnfusedPathAndIsReproducible'
families+=':Mha/0.ForwardMatchesTheDoubleReference:CausalConv1d/0.BackwardMatchesDoubleLoops'
families+=':Ssd/0.ForwardMatchesTheRecurrence:Ssd/0.BackwardMatchesTheAdjointRecurrence'
families+=':SsdStatePass*:Ssd/*.SharedGroupScoresAreTheHeadsOwnProducts:Ssd/*.GpuFormsMatchTheHostForms:Ssd/*.TensorCore*'
families+=':ConcurrentCalls/*'
per_step=$(((smoke_limit + 1) / 2))
smoke unit-tests "$per_step" "$build/unit_tests/kdnn_unit_tests" --gtest_filter="$families"
module=$(compgen -G "$build/python/_kdnn*.so" | head -n 1)
if [[ -n $module ]]; then
  package="$work/package"
  mkdir -p "$package" && cp -r python/kdnn "$package/" && cp "$module" "$package/kdnn/"
  PYTHONPATH="$package" smoke python-threads "$per_step" "$python" -m pytest -q -x \
    -p no:cacheprovider --capture=sys python/tests/test_threads.py -k "first_gpu_call or cuda"
else
  echo "| python-threads | skipped: $build/python has no _kdnn module | 0 s |" >> "$summary"
fi

left=$((window - (SECONDS - started)))
echo >> "$summary"
if ((left < 30)); then
  echo "gpu-check: not run, $left s of the window left" >> "$summary"
  status=1
else
  echo "## gpu-check.sh (limit $left s)" >> "$summary"
  rc=0
  timeout "$left" bash scripts/gpu-check.sh "$work/check" > "$work/logs/gpu_check.log" 2>&1 || rc=$?
  ((rc == 124)) && echo "cut at the window's limit" >> "$summary"
  ((rc != 0)) && status=1
  { echo '```'; tail -n 60 "$work/logs/gpu_check.log"; echo '```'; } >> "$summary"
  [[ -f $work/check/results.json ]] && cp "$work/check/results.json" "$out/results.json"
fi
for log in "$work"/logs/smoke_*.log; do
  if grep -qE 'FAILED|Error|error:|Abort|Segmentation' "$log"; then
    { echo; echo "## $(basename "$log")"; echo '```'; tail -n 30 "$log"; echo '```'; } >> "$summary"
  fi
done
echo "window: $((SECONDS - started)) s, exit $status" >> "$summary"
tar -czf "$out/logs.tgz" -C "$work" logs $([[ -d $work/check ]] && echo check)
exit $status
