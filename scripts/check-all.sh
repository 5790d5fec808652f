#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# Everything CI checks, on a fresh Debian 12 machine (the README's test
# command): the dependencies, the formatting, the `serial` preset's build,
# clang-tidy and suite, the Python package's check, the whole suite again on
# OpenMP with two threads (the `openmp-ci` preset: the forms' size lists cut
# to their corners, as below), and the compile of every
# target for CUDA (the `cuda-ci` preset: the corners of each form's size
# lists, core/impl/forms.hpp). The OpenMP Kokkos (scripts/build-kokkos-openmp.sh),
# then the CUDA toolchain and its Kokkos (scripts/build-kokkos-cuda.sh,
# mostly downloading) are built beside the serial stages, one after the
# other (they share the Kokkos sources and the package manager). Prints each
# stage's wall time and each build's ten slowest objects, and a summary at
# the end.
#
#   bash scripts/check-all.sh
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"

began=$(date +%s)
summary=()
# stage NAME COMMAND...: runs COMMAND, records and prints its wall time.
stage() {
  local name=$1 start
  shift
  start=$(date +%s)
  echo "check-all: == $name"
  "$@"
  local took=$(($(date +%s) - start))
  summary+=("$(printf '%-34s %5d s' "$name" "$took")")
  echo "check-all: == $name: ${took} s (total $(($(date +%s) - began)) s)"
}

# slowest BUILD_DIR: the ten objects of the last build that took longest
# (Ninja's log: start and end in ms, then the output; its last entry per
# output).
slowest() {
  echo "check-all: the ten slowest objects of $1"
  awk -F '\t' '!/^#/ && $4 ~ /\.o$/ { took[$4] = ($2 - $1) / 1000 }
    END { for (o in took) printf "%7.1f s  %s\n", took[o], o }' "$1/.ninja_log" |
    sort -rn | head -n 10 || true
}

stage "dependencies" bash scripts/install-deps.sh
mkdir -p build
kokkos_openmp_log=build/kokkos-openmp.log
kokkos_openmp_rc=build/kokkos-openmp.rc
kokkos_cuda_log=build/kokkos-cuda.log
rm -f "$kokkos_openmp_rc"
(
  rc=0
  bash scripts/build-kokkos-openmp.sh > "$kokkos_openmp_log" 2>&1 || rc=$?
  echo "$rc" > "$kokkos_openmp_rc"
  exec bash scripts/build-kokkos-cuda.sh > "$kokkos_cuda_log" 2>&1
) &
kokkos_cuda=$!

stage "format" bash scripts/check-format.sh
stage "serial: configure" cmake --preset serial
stage "serial: build" cmake --build build/serial
slowest build/serial
stage "serial: clang-tidy" bash scripts/check-tidy.sh
stage "serial: tests" ctest --preset serial -j "$(nproc)"
stage "python" bash scripts/check-python.sh --reuse-build build/serial

wait_kokkos_openmp() {
  while [[ ! -f $kokkos_openmp_rc ]]; do
    if ! kill -0 "$kokkos_cuda" 2>/dev/null; then break; fi
    sleep 5
  done
  if [[ $(cat "$kokkos_openmp_rc" 2>/dev/null) != 0 ]]; then
    cat "$kokkos_openmp_log" >&2
    echo "check-all: scripts/build-kokkos-openmp.sh failed (above)" >&2
    return 1
  fi
  tail -n 1 "$kokkos_openmp_log"
}
stage "openmp: Kokkos (waited for)" wait_kokkos_openmp
stage "openmp: configure" cmake --preset openmp-ci
stage "openmp: build" cmake --build build/openmp-ci
slowest build/openmp-ci
stage "openmp: tests" ctest --preset openmp-ci -j "$(nproc)"

wait_kokkos_cuda() {
  if ! wait "$kokkos_cuda"; then
    cat "$kokkos_cuda_log" >&2
    echo "check-all: scripts/build-kokkos-cuda.sh failed (above)" >&2
    return 1
  fi
  tail -n 1 "$kokkos_cuda_log"
}
stage "cuda: toolchain and Kokkos (waited for)" wait_kokkos_cuda
stage "cuda: configure" cmake --preset cuda-ci
stage "cuda: build" cmake --build build/cuda-ci
slowest build/cuda-ci

echo "check-all: passed in $(($(date +%s) - began)) s"
printf '  %s\n' "${summary[@]}"
