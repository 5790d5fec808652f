#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# Builds Kokkos and Kokkos Kernels 3.4.01 with the OpenMP backend (plus
# Serial; OpenMP is the default space) into an ignored prefix (default
# .deps/kokkos-openmp), from the distribution only: the sources of Debian's
# `trilinos` source package (scripts/kokkos-sources.sh), unmodified, built by
# the system's g++, position independent (the Python extension links it),
# Kokkos Kernels' BLAS through the system BLAS as Debian's build does. The
# `openmp` preset and `pip install .` (KDNN_KOKKOS_ROOT, docs/python.md)
# use it. Idempotent: with the prefix complete it does nothing.
# Environment: KDNN_KOKKOS_OPENMP_PREFIX (install prefix), KDNN_DEPS_DIR
# (work dir).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${KDNN_KOKKOS_OPENMP_PREFIX:-$repo/.deps/kokkos-openmp}
work=${KDNN_DEPS_DIR:-$repo/.deps/work}
stamp=$prefix/.kdnn-kokkos-openmp-complete

if [[ -f $stamp ]]; then
  echo "build-kokkos-openmp: $prefix is complete"
  exit 0
fi
src=$(bash "$repo/scripts/kokkos-sources.sh" "$work")
cmake -S "$src/kokkos" -B "$work/build-kokkos-openmp" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
  -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON >/dev/null
cmake --build "$work/build-kokkos-openmp"
cmake --install "$work/build-kokkos-openmp" >/dev/null
cmake -S "$src/kokkos-kernels" -B "$work/build-kokkos-kernels-openmp" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DKokkos_ROOT="$prefix" \
  -DKokkosKernels_ADD_DEFAULT_ETI=OFF -DKokkosKernels_ENABLE_TPL_BLAS=ON >/dev/null
cmake --build "$work/build-kokkos-kernels-openmp"
cmake --install "$work/build-kokkos-kernels-openmp" >/dev/null
touch "$stamp"
echo "build-kokkos-openmp: installed into $prefix"
