// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Force-included by scripts/cuda-cxx in CUDA compilations (nvcc -include).
//
// Kokkos 3.4.01's Cuda/Kokkos_Cuda_Half.hpp converts its half_t with calls
// such as __half2float(val) and __half2double(val) inside function
// templates. The nvcc front end of CUDA >= 11.3 checks those calls where the
// templates are defined, and fails: half_t converts to __half only
// explicitly, and CUDA has no __half2double. These overloads, declared
// before any Kokkos header and restricted to half_t, make the calls resolve
// (to the CUDA intrinsic on the __half value) without changing Kokkos.
#pragma once
#if defined(__CUDACC__)
#include <cuda_fp16.h>

#include <type_traits>

namespace Kokkos {
namespace Experimental {
class half_t;
}  // namespace Experimental
}  // namespace Kokkos

namespace kdnn_cuda_shim {
template <class H>
using if_half_t = std::enable_if_t<std::is_same<H, Kokkos::Experimental::half_t>::value, int>;
}  // namespace kdnn_cuda_shim

#define KDNN_HALF_T_SHIM(RET, NAME, EXPR)              \
  template <class H, kdnn_cuda_shim::if_half_t<H> = 0> \
  __host__ __device__ inline RET NAME(const H& h) {    \
    const __half x = static_cast<__half>(h);           \
    return EXPR;                                       \
  }

KDNN_HALF_T_SHIM(float, __half2float, __half2float(x))
KDNN_HALF_T_SHIM(double, __half2double, static_cast<double>(__half2float(x)))
KDNN_HALF_T_SHIM(short, __half2short_rz, __half2short_rz(x))
KDNN_HALF_T_SHIM(unsigned short, __half2ushort_rz, __half2ushort_rz(x))
KDNN_HALF_T_SHIM(int, __half2int_rz, __half2int_rz(x))
KDNN_HALF_T_SHIM(unsigned int, __half2uint_rz, __half2uint_rz(x))
KDNN_HALF_T_SHIM(long long, __half2ll_rz, __half2ll_rz(x))
KDNN_HALF_T_SHIM(unsigned long long, __half2ull_rz, __half2ull_rz(x))

#undef KDNN_HALF_T_SHIM
#endif  // __CUDACC__
