// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// C_i = β·C_i + α·op(A_i)·op(B_i) for a batch of row-major matrices of one
// shape laid out one after another (a [B, H, rows, cols] tensor's heads).
//
// On CUDA with Kokkos Kernels' cuBLAS TPL (Kokkos Kernels 4) the batch is one
// cublas{S,D}gemmStridedBatched call on the execution space's stream, through
// the handle Kokkos Kernels' own GEMM uses; everywhere else it is one
// core/impl/gemm.hpp call per matrix (on a host, BLAS parallelises inside
// each). Both keep BLAS semantics: β = 0 ignores C's contents, an empty inner
// dimension still scales C by β (that case always takes the per-matrix path).
#include <Kokkos_Core.hpp>
#include <climits>
#include <cstddef>
#include <type_traits>

#include "kdnn/core/impl/gemm.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSKERNELS_ENABLE_TPL_CUBLAS) && \
    defined(KOKKOSKERNELS_VERSION) && KOKKOSKERNELS_VERSION >= 40000
#include <KokkosBlas_tpl_spec.hpp>
#define KDNN_IMPL_CUBLAS_STRIDED_BATCHED 1
#endif

namespace kdnn::impl {

/// `count` row-major rows×cols matrices, matrix i at data + i·rows·cols.
template <class T, class MemorySpace>
struct MatrixBatch {
  T* data = nullptr;
  std::size_t count = 0, rows = 0, cols = 0;

  std::size_t stride() const { return rows * cols; }
  MatrixView<T, MemorySpace> operator[](std::size_t i) const {
    return MatrixView<T, MemorySpace>(data + i * stride(), rows, cols);
  }
};

/// The matrices of a rank-4 LayoutRight View [B, H, rows, cols], (b, h) at
/// index b·H + h.
template <class View>
MatrixBatch<typename View::value_type, typename View::memory_space> matrices_of(const View& v) {
  return {v.data(), v.extent(0) * v.extent(1), v.extent(2), v.extent(3)};
}

#if defined(KDNN_IMPL_CUBLAS_STRIDED_BATCHED)
/// cublasSgemmStridedBatched or cublasDgemmStridedBatched, by T.
template <class T, class... Args>
cublasStatus_t cublas_gemm_strided_batched(Args... args) {
  if constexpr (std::is_same_v<T, float>) {
    return cublasSgemmStridedBatched(args...);
  } else {
    return cublasDgemmStridedBatched(args...);
  }
}
#endif

/// C[i] = beta C[i] + alpha op(A[i]) op(B[i]) for i < C.count; shapes already
/// checked by the caller (A.count == B.count == C.count).
template <class ExecSpace, class T, class MemorySpace>
void strided_batched_gemm(const ExecSpace& space, bool trans_a, bool trans_b, T alpha,
                          const MatrixBatch<const T, MemorySpace>& A,
                          const MatrixBatch<const T, MemorySpace>& B, T beta,
                          const MatrixBatch<T, MemorySpace>& C) {
  if (C.count == 0 || C.rows == 0 || C.cols == 0) return;
#if defined(KDNN_IMPL_CUBLAS_STRIDED_BATCHED)
  const std::size_t k = trans_a ? A.rows : A.cols;
  constexpr bool cublas_types = std::is_same_v<ExecSpace, Kokkos::Cuda> &&
                                (std::is_same_v<T, float> || std::is_same_v<T, double>);
  if constexpr (cublas_types) {
    const auto fits = [](std::size_t v) { return v <= std::size_t(INT_MAX); };
    if (k > 0 && fits(C.count) && fits(C.rows) && fits(C.cols) && fits(k) && fits(A.cols) &&
        fits(B.cols)) {
      // Row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ: cuBLAS
      // sees each row-major matrix as its column-major transpose, leading
      // dimension = the row-major column count.
      const auto op = [](bool t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; };
      KokkosBlas::Impl::CudaBlasSingleton& s = KokkosBlas::Impl::CudaBlasSingleton::singleton();
      KOKKOSBLAS_IMPL_CUBLAS_SAFE_CALL(cublasSetStream(s.handle, space.cuda_stream()));
      KOKKOSBLAS_IMPL_CUBLAS_SAFE_CALL(cublas_gemm_strided_batched<T>(
          s.handle, op(trans_b), op(trans_a), int(C.cols), int(C.rows), int(k), &alpha, B.data,
          int(B.cols), (long long)B.stride(), A.data, int(A.cols), (long long)A.stride(), &beta,
          C.data, int(C.cols), (long long)C.stride(), int(C.count)));
      KOKKOSBLAS_IMPL_CUBLAS_SAFE_CALL(cublasSetStream(s.handle, nullptr));
      return;
    }
  }
#endif
  for (std::size_t i = 0; i < C.count; ++i) {
    gemm(space, trans_a, trans_b, alpha, A[i], B[i], beta, C[i]);
  }
}

}  // namespace kdnn::impl
