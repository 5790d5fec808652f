#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# Installs kdnn's build and test dependencies from the distribution (Debian 12):
# Kokkos + Kokkos Kernels 3.4 (Serial backend) with OpenBLAS as the system BLAS,
# Open MPI, GoogleTest, Google Benchmark, CLI11, CMake, Ninja, a C++17
# compiler, clang-format 14 and clang-tidy 14, and Python with PyTorch and NumPy
# (CPU, Debian's python3-torch: the Python package and its tests, the golden
# data generators, perf_tests/*.py). Idempotent: when everything is already
# installed it returns without touching apt.
set -euo pipefail

packages=(
  g++ cmake ninja-build
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev
  liblapack-dev libblas-dev  # named by Debian's Kokkos Kernels CMake target, not pulled in
  # becomes libblas.so.3 (alternatives): Kokkos Kernels' GEMMs reach OpenBLAS. Its OpenMP
  # build, so that with an OpenMP Kokkos the GEMMs run on the same thread pool (its
  # pthread build keeps a second pool that spins beside Kokkos' threads).
  libopenblas0-openmp
  libopenmpi-dev openmpi-bin
  libgtest-dev libbenchmark-dev
  libcli11-dev  # the kdnn tool's option parsing
  clang-format-14  # scripts/check-format.sh
  clang-tidy-14  # scripts/check-tidy.sh
  python3-dev python3-venv python3-pip python3-torch python3-numpy python3-mpi4py  # Python package
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
echo "install-deps: done"
