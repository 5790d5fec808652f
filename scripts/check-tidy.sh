#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# Runs clang-tidy (14, the .clang-tidy at the root) on every C++ file the
# build directory compiles (its compile_commands.json; the serial preset
# writes one), except the compile-fail tests, which are meant not to
# compile; fails on any finding.
#
#   bash scripts/check-tidy.sh [build/serial]
set -euo pipefail
root="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
build="$(cd "${1:-$root/build/serial}" && pwd)"
tidy=$(command -v run-clang-tidy-14 || command -v run-clang-tidy || true)
if [[ -z "$tidy" ]]; then
  echo "check-tidy: run-clang-tidy not found (Debian: apt-get install clang-tidy)" >&2
  exit 2
fi
if [[ ! -f "$build/compile_commands.json" ]]; then
  echo "check-tidy: $build/compile_commands.json missing (configure with cmake --preset serial)" >&2
  exit 2
fi
jobs=$(nproc 2>/dev/null || echo 2)
# The files: the repository's sources, not the compile-fail tests.
pattern="^$root/(src|examples|perf_tests|unit_tests/(attention|cli|common|core|cp|io|sinkhorn|ssm))/"
if ! "$tidy" -p "$build" -quiet -j "$jobs" "$pattern" > "$build/clang-tidy.log" 2>&1; then
  grep -E "(warning|error):" "$build/clang-tidy.log" | sort -u >&2 || cat "$build/clang-tidy.log" >&2
  echo "check-tidy: findings above (whole log: $build/clang-tidy.log)" >&2
  exit 1
fi
echo "check-tidy: no findings"
