// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Whether an execution space instance multiplies on tensor cores
// (warp_mma_device.hpp): a CUDA device of compute capability 8.0 or later,
// in a build whose device code is for such a device (Kokkos' architecture
// flag; nvcc compiles mma.sync only for sm_80 and later). Asked on the host
// at each call, of the instance's own device. Every other backend: no; its
// tensor-core forms run, emulated, only where a launch asks for them.
#include <Kokkos_Core.hpp>
#include <type_traits>

namespace kdnn::impl {

#if defined(KOKKOS_ENABLE_CUDA) &&                                     \
    (defined(KOKKOS_ARCH_AMPERE80) || defined(KOKKOS_ARCH_AMPERE86) || \
     defined(KOKKOS_ARCH_ADA89) || defined(KOKKOS_ARCH_HOPPER90) ||    \
     defined(KOKKOS_ARCH_BLACKWELL100) || defined(KOKKOS_ARCH_BLACKWELL120))
#define KDNN_IMPL_CUDA_TENSOR_CORES 1
#endif

template <class ExecSpace>
bool has_tensor_cores([[maybe_unused]] const ExecSpace& space) {
#if defined(KDNN_IMPL_CUDA_TENSOR_CORES)
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda>) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, space.cuda_device()) !=
        cudaSuccess) {
      return false;
    }
    return major >= 8;
  }
#endif
  return false;
}

}  // namespace kdnn::impl
