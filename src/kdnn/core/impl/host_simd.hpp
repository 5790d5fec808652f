// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Host SIMD, in one place: GCC and Clang vector extensions and loop pragmas,
// used by the host forms of kdnn's kernels (a GPU form never sees them).
//
//  * KDNN_IMPL_HOST_SIMD is 1 where vector extensions exist (GCC or Clang,
//    a host compilation pass), else 0; code under it has a plain fallback.
//  * HostVector<T, Bytes>::type is Bytes of T as one vector value.
//  * KDNN_IMPL_INDEPENDENT_ITERATIONS before a loop says that its
//    iterations are independent (GCC's ivdep, Clang's assume_safety).
//  * KDNN_IMPL_HOST_FLATTEN on a function inlines every call in it on a
//    host (GCC's and Clang's flatten): an element loop whose body is a
//    caller's lambda is vectorised only if the lambda is inlined, which a
//    compiler may decline inside a large kernel (measured: the fused
//    attention backward's per-pair lambda called out of line).
//  * kHostGemmVectorBytes, the width of team_gemm's host tile vectors, is
//    fixed when kdnn is configured (config.hpp: 32 if the library's flags
//    enable AVX, else 16), never by the flags of the file that includes
//    this header: a layout that changed with a consumer's -m flags would
//    differ between the library and the consumer's own instantiations
//    (an ODR violation). A consumer compiled without AVX against an AVX
//    configuration gets the same results, each vector split in two.
#include "kdnn/config.hpp"

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__) && \
    !defined(__HIP_DEVICE_COMPILE__) && !defined(__SYCL_DEVICE_ONLY__)
#define KDNN_IMPL_HOST_SIMD 1
#else
#define KDNN_IMPL_HOST_SIMD 0
#endif

#if KDNN_IMPL_HOST_SIMD
#define KDNN_IMPL_HOST_FLATTEN __attribute__((flatten))
#else
#define KDNN_IMPL_HOST_FLATTEN
#endif

#if defined(__clang__)
#define KDNN_IMPL_INDEPENDENT_ITERATIONS _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define KDNN_IMPL_INDEPENDENT_ITERATIONS _Pragma("GCC ivdep")
#else
#define KDNN_IMPL_INDEPENDENT_ITERATIONS
#endif

namespace kdnn::impl {

constexpr int kHostGemmVectorBytes = KDNN_HOST_GEMM_VECTOR_BYTES;
/// Rows of team_gemm's host tile, fixed when kdnn is configured as the
/// width is (config.hpp: 8 with AVX-512's 32 vector registers, else 4).
constexpr int kHostGemmRows = KDNN_HOST_GEMM_ROWS;

#if KDNN_IMPL_HOST_SIMD
template <class T, int Bytes>
struct HostVector {
  typedef T type __attribute__((vector_size(Bytes)));
  static constexpr int width = Bytes / int(sizeof(T));
};
#endif

}  // namespace kdnn::impl
