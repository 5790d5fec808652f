#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# The Python package's check: installs it (pip install ., which builds the
# extension from this CMake project) into a virtual environment that sees
# the system's PyTorch, runs its pytest suite and trains the example model.
#
#   bash scripts/check-python.sh [pip install option...]
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
"$venv/bin/pip" install --quiet --disable-pip-version-check "$@" ".[test]"
"$venv/bin/python" -m pytest -q python/tests
"$venv/bin/python" python/examples/train_hybrid.py --steps 300
