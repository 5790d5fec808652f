#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# The Python package's check: installs it (pip install ., which builds the
# extension from this CMake project) into a virtual environment that sees
# the system's PyTorch, runs its pytest suite (the context-parallel tests on
# 1 and 2 MPI ranks when kdnn has MPI and mpi4py is there) and trains the
# example model.
#
#   bash scripts/check-python.sh [--reuse-build DIR] [pip install option...]
#
# --reuse-build DIR: pip builds the extension in the CMake build directory
# DIR (the serial preset's, already built: CI), which keeps its options, so
# that only the extension's own sources are compiled; without it, pip builds
# in its own directory (pyproject.toml), as `pip install .` does for users.
#
# e.g. --config-settings=cmake.define.Kokkos_ROOT=/path/to/kokkos
#   --config-settings=build-dir=build/python-other
# to build against another Kokkos. The environment: build/venv (KDNN_VENV),
# made by Debian's Python, whose site packages hold python3-torch
# (KDNN_PYTHON to use another interpreter that has PyTorch).
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
venv="${KDNN_VENV:-build/venv}"
if [[ ! -x "$venv/bin/python" ]]; then
  "${KDNN_PYTHON:-/usr/bin/python3}" -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -c "import torch" 2>/dev/null || {
  echo "check-python: PyTorch not importable (Debian: apt-get install python3-torch)" >&2
  exit 2
}
pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
if [[ ${1:-} == --reuse-build ]]; then
  build=${2:?check-python: --reuse-build needs a directory}
  shift 2
  [[ -f $build/CMakeCache.txt ]] || {
    echo "check-python: $build is no CMake build directory" >&2
    exit 2
  }
  # Its own cache's options, not pyproject.toml's, and the environment's
  # build tools (no isolated environment, whose paths would vanish).
  options=()
  for option in kdnn_ENABLE_TESTS kdnn_ENABLE_EXAMPLES kdnn_ENABLE_BENCHMARK; do
    value=$(sed -n "s/^$option:BOOL=//p" "$build/CMakeCache.txt")
    options+=("--config-settings=cmake.define.$option=${value:-OFF}")
  done
  "${pip[@]}" "scikit-build-core>=0.10" "nanobind>=2.0" pytest
  pip+=(--no-build-isolation "--config-settings=build-dir=$build" "${options[@]}")
fi
"${pip[@]}" "$@" ".[test]"
"$venv/bin/python" -m pytest -q python/tests
if "$venv/bin/python" -c "import mpi4py, kdnn; assert kdnn.cp.available" 2>/dev/null; then
  mapfile -t mpi_environment < <(grep "^[A-Za-z_]" cmake/mpi-test-environment)  # as ctest's
  for ranks in 1 2 4; do
    echo "check-python: context-parallel tests on $ranks rank(s)"
    env "${mpi_environment[@]}" timeout 600 mpiexec -n "$ranks" "$venv/bin/python" -m pytest -q \
      --color=no -p no:cacheprovider python/tests/mpi
  done
else
  echo "check-python: no context-parallel tests (kdnn without MPI, or no mpi4py)"
fi
"$venv/bin/python" python/examples/train_hybrid.py --steps 300
