#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# Builds Kokkos and Kokkos Kernels 3.4.01 with the CUDA backend (plus Serial)
# for sm_90 into an ignored prefix (default .deps/kokkos-cuda), from the
# distribution only:
#   - the CUDA 11.8 toolkit (Debian non-free `nvidia-cuda-toolkit`) and g++-11;
#   - the Kokkos / Kokkos Kernels sources of Debian's `trilinos` source package
#     (the same 3.4.01 the Serial build uses), unmodified.
# Idempotent: with the prefix complete it does nothing. cudart is linked
# statically and the cuBLAS/cuSPARSE TPLs are off, so binaries built with it
# need only glibc and libstdc++ on the GPU machine.
# Environment: KDNN_KOKKOS_CUDA_PREFIX (install prefix), KDNN_DEPS_DIR (work dir).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${KDNN_KOKKOS_CUDA_PREFIX:-$repo/.deps/kokkos-cuda}
work=${KDNN_DEPS_DIR:-$repo/.deps/work}
stamp=$prefix/.kdnn-kokkos-cuda-complete

if [[ -f $stamp ]]; then
  echo "build-kokkos-cuda: $prefix is complete"
  exit 0
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi

# 1. Toolchain: non-free for the CUDA toolkit, deb-src for the sources.
sources=/etc/apt/sources.list.d/kdnn-cuda.sources
if [[ ! -f $sources ]]; then
  $sudo tee "$sources" >/dev/null <<'SRC'
Types: deb deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  $sudo apt-get update -qq
fi
need=()
for p in nvidia-cuda-toolkit g++-11 cmake ninja-build; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [[ ${#need[@]} -gt 0 ]]; then
  echo "build-kokkos-cuda: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

# 2. Sources (scripts/kokkos-sources.sh).
src=$(bash "$repo/scripts/kokkos-sources.sh" "$work")

# 3. Headers of another CUDA under /usr/local/include (searched by the host
# compiler before /usr/include) would shadow the 11.8 ones: a directory of
# links to the 11.8 headers of the same names goes first (scripts/cuda-cxx
# adds it with -I).
farm=$prefix/cuda-include
mkdir -p "$farm"
for entry in /usr/local/include/*; do
  name=$(basename "$entry")
  if [[ -e /usr/include/$name && ! -e $farm/$name ]]; then ln -s "/usr/include/$name" "$farm/$name"; fi
done

# 4. Build and install with scripts/cuda-cxx (nvcc 11.8 environment, sm_90).
# CMake must find this toolkit, not a newer one under /usr/local/cuda.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
unset CUDA_HOME CUDA_PATH LIBRARY_PATH
cxx=$repo/scripts/cuda-cxx
export KDNN_NVCC_WRAPPER=$src/kokkos/bin/nvcc_wrapper
cmake -S "$src/kokkos" -B "$work/build-kokkos" -G Ninja \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=14 \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DCUDAToolkit_ROOT=/usr \
  -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_CUDA_LAMBDA=ON \
  -DKokkos_ARCH_AMPERE80=ON \
  -DCUDA_cudart_LIBRARY=/usr/lib/x86_64-linux-gnu/libcudart_static.a >/dev/null
cmake --build "$work/build-kokkos"
cmake --install "$work/build-kokkos" >/dev/null
unset KDNN_NVCC_WRAPPER  # from here on: the installed nvcc_wrapper
cmake -S "$src/kokkos-kernels" -B "$work/build-kokkos-kernels" -G Ninja \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=14 \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DKokkos_ROOT="$prefix" -DCUDAToolkit_ROOT=/usr \
  -DKokkosKernels_ADD_DEFAULT_ETI=OFF \
  -DKokkosKernels_ENABLE_TPL_CUBLAS=OFF -DKokkosKernels_ENABLE_TPL_CUSPARSE=OFF >/dev/null
cmake --build "$work/build-kokkos-kernels"
cmake --install "$work/build-kokkos-kernels" >/dev/null
touch "$stamp"
echo "build-kokkos-cuda: installed into $prefix"
