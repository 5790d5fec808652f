#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# Builds Kokkos 4.6.01 and Kokkos Kernels 4.6.x with the CUDA backend (plus
# Serial; OpenMP off) for Hopper (Kokkos_ARCH_HOPPER90, sm_90) against
# CUDA 13.0, with Kokkos Kernels' cuBLAS TPL, into an ignored prefix:
#
#   scripts/build-kokkos46-cuda13.sh KOKKOS_SRC KERNELS_SRC [PREFIX]
#
# KOKKOS_SRC / KERNELS_SRC are Kokkos 4.6.01 and Kokkos Kernels 4.6 source
# trees the user provides (release tarballs or checkouts; they are not part
# of this repository). They are left untouched: Kokkos is copied into the
# work directory and scripts/patches/kokkos-4.6.01-cuda13.patch (CUDA 13 API
# changes: cudaGraphAddDependencies' edge-data argument, cudaMemLocation in
# cudaMemAdvise / cudaMemPrefetchAsync) is applied to the copy; Kokkos
# Kernels is built out of tree. PREFIX defaults to .deps/kokkos46-cuda13.
#
# The compiler is scripts/cuda13-cxx (nvcc_wrapper around the CUDA 13 nvcc,
# clean PATH without the distribution's CUDA 11.8 and /usr/local, explicit
# -arch). cudart is linked statically and libcuda is the toolkit's stub
# (the driver's libcuda.so.1 at run time), never the distribution's
# libcuda.so; cuBLAS (libcublas.so.13 / libcublasLt.so.13) is linked
# dynamically from KDNN_CUBLAS_ROOT, so it is needed at run time.
# Only the BLAS component is built, with ETI for float and double (ordinal
# int, offsets int and size_t, LayoutLeft, Cuda/CudaSpace) to keep it short.
#
# Idempotent: with the prefix complete (stamp file) it does nothing; an
# interrupted run resumes in the work directory.
#
# Environment:
#   KDNN_CUDA13_ROOT  CUDA 13 toolkit (default /usr/local/cuda-13.0)
#   KDNN_CUBLAS_ROOT  where lib64/libcublas.so and include/cublas_v2.h are
#                     (default KDNN_CUDA13_ROOT)
#   KDNN_CUDA_ARCH    nvcc architecture (default sm_90, matching HOPPER90)
#   KDNN_HOST_CXX     host compiler of nvcc (default g++)
#   KDNN_KOKKOS46_WORK_DIR  work directory (default .deps/work-kokkos46-cuda13,
#                     or .deps/work-kokkos46-cuda13-pic with KDNN_KOKKOS46_PIC)
#   KDNN_KOKKOS46_PIC 1: position-independent code, for a shared library
#                     such as the Python extension (then PREFIX defaults to
#                     .deps/kokkos46-cuda13-pic)
#   CMAKE_BUILD_PARALLEL_LEVEL  build jobs (CMake's own variable)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
me=build-kokkos46-cuda13
if [[ $# -lt 2 || $# -gt 3 ]]; then
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
kokkos_src=$(cd "$1" && pwd)
kernels_src=$(cd "$2" && pwd)
pic=${KDNN_KOKKOS46_PIC:-0}
[[ $pic == 0 || $pic == 1 ]] || { echo "$me: KDNN_KOKKOS46_PIC=$pic, expected 0 or 1" >&2; exit 2; }
suffix=$([[ $pic == 1 ]] && echo -pic || true)
prefix=${3:-$repo/.deps/kokkos46-cuda13$suffix}
prefix=$(realpath -m "$prefix")
work=${KDNN_KOKKOS46_WORK_DIR:-$repo/.deps/work-kokkos46-cuda13$suffix}
cuda=${KDNN_CUDA13_ROOT:-/usr/local/cuda-13.0}
cublas=${KDNN_CUBLAS_ROOT:-$cuda}
arch=${KDNN_CUDA_ARCH:-sm_90}
host_cxx=${KDNN_HOST_CXX:-g++}
patch_file=$repo/scripts/patches/kokkos-4.6.01-cuda13.patch
stamp=$prefix/.kdnn-kokkos46-cuda13-complete

if [[ -f $stamp ]]; then
  echo "$me: $prefix is complete"
  exit 0
fi

# 1. The trees: Kokkos exactly 4.6.01 (the patch is for it), Kernels 4.6.x.
version_of() {  # version_of CMakeLists.txt VARIABLE_PREFIX -> "M.m.p"
  local f=$1 v=$2 out="" part n
  for part in MAJOR MINOR PATCH; do
    n=$(sed -n "s/^ *[sS][eE][tT] *( *${v}_VERSION_${part} \+\([0-9]\+\) *).*/\1/p" "$f" | head -n 1)
    out+=${out:+.}${n:-?}
  done
  echo "$out"
}
[[ -f $kokkos_src/CMakeLists.txt && -f $kokkos_src/bin/nvcc_wrapper ]] ||
  { echo "$me: $kokkos_src is not a Kokkos source tree" >&2; exit 1; }
[[ -f $kernels_src/CMakeLists.txt ]] ||
  { echo "$me: $kernels_src is not a Kokkos Kernels source tree" >&2; exit 1; }
kv=$(version_of "$kokkos_src/CMakeLists.txt" Kokkos)
kkv=$(version_of "$kernels_src/CMakeLists.txt" KokkosKernels)
if [[ $kv != 4.6.1 ]]; then
  echo "$me: $kokkos_src is Kokkos $kv; this script and its CUDA 13 patch are for Kokkos 4.6.01 only" >&2
  exit 1
fi
if [[ $kkv != 4.6.* ]]; then
  echo "$me: $kernels_src is Kokkos Kernels $kkv; Kokkos 4.6.01 needs Kokkos Kernels 4.6.x (4.6.02 tested)" >&2
  exit 1
fi
[[ -x $cuda/bin/nvcc && -f $cuda/lib64/libcudart_static.a ]] ||
  { echo "$me: no CUDA toolkit at $cuda (set KDNN_CUDA13_ROOT)" >&2; exit 1; }
nvcc_release=$("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
[[ $nvcc_release == 13.* ]] ||
  { echo "$me: $cuda/bin/nvcc is CUDA $nvcc_release, not 13.x" >&2; exit 1; }
[[ -f $cublas/include/cublas_v2.h && -e $cublas/lib64/libcublas.so ]] ||
  { echo "$me: no cuBLAS under $cublas (set KDNN_CUBLAS_ROOT)" >&2; exit 1; }
echo "$me: Kokkos $kv, Kokkos Kernels $kkv, CUDA $nvcc_release ($cuda), $arch -> $prefix"

# 2. A patched copy of Kokkos (the user's tree stays as it is).
mkdir -p "$work" "$prefix"
ksrc=$work/kokkos-4.6.01-cuda13
if [[ ! -f $ksrc/.kdnn-patched ]]; then
  rm -rf "$ksrc"
  mkdir -p "$ksrc"
  (cd "$kokkos_src" && tar cf - --exclude=./.git --exclude='./build*' .) | (cd "$ksrc" && tar xf -)
  if patch -p1 -d "$ksrc" --dry-run -R -s -f <"$patch_file" >/dev/null 2>&1; then
    echo "$me: the Kokkos tree already has the CUDA 13 change"
  else
    patch -p1 -d "$ksrc" --forward --batch <"$patch_file"
  fi
  touch "$ksrc/.kdnn-patched"
fi

# 3. The environment of scripts/cuda13-cxx, recorded for later kdnn builds.
cat >"$prefix/kdnn-cuda13.env" <<ENV
# Written by scripts/$me.sh; read by scripts/cuda13-cxx (unset values only).
: "\${KDNN_CUDA13_ROOT:=$cuda}"
: "\${KDNN_CUDA_ARCH:=$arch}"
: "\${KDNN_HOST_CXX:=$host_cxx}"
ENV
export KDNN_KOKKOS46_CUDA13_PREFIX=$prefix KDNN_CUDA13_ROOT=$cuda KDNN_CUDA_ARCH=$arch KDNN_HOST_CXX=$host_cxx
export PATH=$cuda/bin:/usr/sbin:/usr/bin:/sbin:/bin
unset CUDA_HOME CUDA_PATH LIBRARY_PATH CPATH
cxx=$repo/scripts/cuda13-cxx
# The toolkit's static cudart and stub libcuda, never the distribution's
# (CUDA 11.8) ones in the default search path.
cuda_pins=(
  -DCUDAToolkit_ROOT="$cuda"
  -DCUDA_cudart_LIBRARY="$cuda/lib64/libcudart_static.a"
  -DCUDA_cuda_driver_LIBRARY="$cuda/lib64/stubs/libcuda.so"
  -DCMAKE_POSITION_INDEPENDENT_CODE=$([[ $pic == 1 ]] && echo ON || echo OFF)
)

# 4. Kokkos: CUDA + Serial, Hopper.
export KDNN_NVCC_WRAPPER=$ksrc/bin/nvcc_wrapper
if [[ ! -f $work/build-kokkos/.kdnn-installed ]]; then
  cmake -S "$ksrc" -B "$work/build-kokkos" -G Ninja \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 \
    -DCMAKE_INSTALL_PREFIX="$prefix" "${cuda_pins[@]}" \
    -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=OFF \
    -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_CUDA_LAMBDA=ON \
    -DKokkos_ARCH_HOPPER90=ON \
    -DKokkos_ENABLE_TESTS=OFF -DKokkos_ENABLE_EXAMPLES=OFF >/dev/null
  cmake --build "$work/build-kokkos"
  cmake --install "$work/build-kokkos" >/dev/null
  touch "$work/build-kokkos/.kdnn-installed"
fi
unset KDNN_NVCC_WRAPPER  # from here on: the installed nvcc_wrapper

# 5. Kokkos Kernels: BLAS with the cuBLAS TPL, minimal ETI.
cmake -S "$kernels_src" -B "$work/build-kokkos-kernels" -G Ninja \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DKokkos_ROOT="$prefix" "${cuda_pins[@]}" \
  -DKokkosKernels_ENABLE_ALL_COMPONENTS=OFF -DKokkosKernels_ENABLE_COMPONENT_BLAS=ON \
  -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF \
  -DKokkosKernels_ADD_DEFAULT_ETI=OFF \
  -DKokkosKernels_INST_FLOAT=ON -DKokkosKernels_INST_DOUBLE=ON \
  -DKokkosKernels_INST_COMPLEX_FLOAT=OFF -DKokkosKernels_INST_COMPLEX_DOUBLE=OFF \
  -DKokkosKernels_INST_HALF=OFF -DKokkosKernels_INST_BHALF=OFF \
  -DKokkosKernels_INST_ORDINAL_INT=ON -DKokkosKernels_INST_ORDINAL_INT64_T=OFF \
  -DKokkosKernels_INST_OFFSET_INT=ON -DKokkosKernels_INST_OFFSET_SIZE_T=ON \
  -DKokkosKernels_INST_LAYOUTLEFT=ON -DKokkosKernels_INST_LAYOUTRIGHT=OFF \
  -DKokkosKernels_INST_EXECSPACE_CUDA=ON -DKokkosKernels_INST_MEMSPACE_CUDASPACE=ON \
  -DKokkosKernels_INST_MEMSPACE_CUDAUVMSPACE=OFF \
  -DKokkosKernels_INST_EXECSPACE_SERIAL=OFF -DKokkosKernels_INST_MEMSPACE_HOSTSPACE=OFF \
  -DKokkosKernels_ENABLE_TPL_BLAS=OFF -DKokkosKernels_ENABLE_TPL_LAPACK=OFF \
  -DKokkosKernels_ENABLE_TPL_CUBLAS=ON \
  -DCUBLAS_LIBRARIES="cublas;cublasLt" -DCUBLAS_LIBRARY_DIRS="$cublas/lib64" \
  -DCUBLAS_INCLUDE_DIRS="$cublas/include" \
  -DKokkosKernels_ENABLE_TPL_CUSPARSE=OFF -DKokkosKernels_ENABLE_TPL_CUSOLVER=OFF >/dev/null
cmake --build "$work/build-kokkos-kernels"
cmake --install "$work/build-kokkos-kernels" >/dev/null
touch "$stamp"
echo "$me: installed into $prefix"
