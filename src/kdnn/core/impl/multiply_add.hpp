// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// a·b + c with the same rounding wherever it is inlined. Compilers may
// contract a·b + c into one FMA (CUDA's always may, a host's when it targets
// FMA instructions) and decide so differently for two copies of the same
// sum, so two kernels that must compute bitwise the same dot product (the
// fused attention's forward and backward scores: at a huge scale one
// rounding step of a score is a large error in its exponent) cannot leave
// that choice to them. Here it is made once: an FMA where the target has
// the instruction, else a product and a sum, which no compiler fuses
// without it.
#include <Kokkos_Core.hpp>

#if !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#include <cmath>
#endif

namespace kdnn::impl {

template <class T>
KOKKOS_FORCEINLINE_FUNCTION T multiply_add(T a, T b, T c) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return ::fma(a, b, c);  // float and double overloads in device code
#elif defined(__FMA__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

}  // namespace kdnn::impl
