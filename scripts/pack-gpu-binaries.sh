#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# Packs what scripts/gpu-check.sh and scripts/gpu-profile.sh run from a CUDA
# build into one compressed tarball, for a GPU node that gets the repository
# but not the build tree (object files make build/cuda* too large to copy):
#   scripts/pack-gpu-binaries.sh BUILD_DIR TARBALL [PYTHON_BUILD_DIR]
# The tarball holds BUILD_DIR's unit tests, examples, benchmarks, the Python
# extension module of PYTHON_BUILD_DIR (default BUILD_DIR; e.g. the
# cuda13-python preset's build/cuda13-python) as python/_kdnn*.so if it has
# one, and
# include/kdnn/config.hpp in the build's layout (stripped of host symbols;
# the GPU code is kept), and in lib/ the shared libraries they need that a
# GPU node with only the CUDA driver and toolkit may lack (Google
# Benchmark's). On the node:
#   mkdir -p B && tar -C B -xzf TARBALL && KDNN_CUDA_BUILD=$PWD/B scripts/gpu-check.sh OUT
set -euo pipefail
build=${1:?usage: scripts/pack-gpu-binaries.sh BUILD_DIR TARBALL}
tarball=${2:?usage: scripts/pack-gpu-binaries.sh BUILD_DIR TARBALL [PYTHON_BUILD_DIR]}
python_build=${3:-$build}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for dir in unit_tests examples perf_tests; do
  mkdir -p "$stage/$dir"
  find "$build/$dir" -maxdepth 1 -type f -perm -u+x -exec cp {} "$stage/$dir/" \;
done
mkdir -p "$stage/include/kdnn" "$stage/lib"
cp "$build/include/kdnn/config.hpp" "$stage/include/kdnn/"
if compgen -G "$python_build/python/_kdnn*.so" > /dev/null; then
  mkdir -p "$stage/python"
  cp "$python_build"/python/_kdnn*.so "$stage/python/"
fi
find "$stage" -type f -perm -u+x -exec strip --strip-unneeded {} \;
# Shared libraries outside the C/C++ runtime, the CUDA driver and cuBLAS.
find "$stage" -type f -perm -u+x -exec ldd {} \; 2>/dev/null |
  awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux|libdl|libpthread|librt|libcuda|libcublas)' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
tar -C "$stage" -czf "$tarball" .
echo "$tarball: $(du -h "$tarball" | cut -f1)"
