// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// y = Aᵀx for one small rows×cols matrix A in scratch (row stride ld),
// computed by one team thread and its vector lanes: s_j = Σ_i A_ij x_i
// (j < cols), summed over i < rows in
// order on every backend, then handed to finish(j, s_j) (store it, store its
// reciprocal, ...). Only the loop nest differs between backends: on a host
// backend the i loop is outside and blocks of columns accumulate in
// registers, so the fixed-width inner loops vectorise; on a GPU each lane j
// keeps its own sum in a register and walks column j (lanes read consecutive
// addresses, no synchronisation inside). Kernels that need Ax keep Aᵀ in
// scratch as well and call col_dot on it.
#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/lanes.hpp"

namespace kdnn::impl {

/// Column j alone: Σ_i A_ij x_i, in order.
template <class T>
KOKKOS_FORCEINLINE_FUNCTION T col_dot_one(int rows, const T* A, int ld, const T* x, int j) {
  T s = A[j] * x[0];
  for (int i = 1; i < rows; ++i) s += A[i * ld + j] * x[i];
  return s;
}

/// Host helper of col_dot: columns j0 .. j0+W−1 (A already offset by j0).
/// With GCC or Clang on the host the W accumulators are explicit 16-byte
/// vectors: left to the auto-vectoriser, they stay scalar once inlined into a
/// large kernel (GCC 12, measured 3× slower in the unrolled backward). If T
/// is a lanes vector (lanes.hpp), it holds W vectors: W independent sums.
template <int W, class T, class Finish>
KOKKOS_INLINE_FUNCTION void col_dot_block(int rows, const T* A, int ld, const T* x, int j0,
                                          const Finish& finish) {
#if KDNN_IMPL_HOST_SIMD
  if constexpr (!is_lanes_v<T>) {
    using Vec = typename HostVector<T, 16>::type;
    constexpr int L = HostVector<T, 16>::width;
    static_assert(W % L == 0, "col_dot_block: W must be a multiple of the vector width");
    Vec acc[W / L];
    const auto load = [](const T* p) {
      Vec v;
      __builtin_memcpy(&v, p, sizeof v);
      return v;
    };
    for (int k = 0; k < W / L; ++k) acc[k] = load(A + k * L) * x[0];
    for (int i = 1; i < rows; ++i) {
      const T xi = x[i];
      const T* Ai = A + i * ld;
      for (int k = 0; k < W / L; ++k) acc[k] += load(Ai + k * L) * xi;
    }
    for (int k = 0; k < W / L; ++k)
      for (int l = 0; l < L; ++l) finish(j0 + k * L + l, acc[k][l]);
    return;
  }
#endif
  T acc[W];
  for (int jj = 0; jj < W; ++jj) acc[jj] = A[jj] * x[0];
  for (int i = 1; i < rows; ++i) {
    const T xi = x[i];
    const T* Ai = A + i * ld;
    for (int jj = 0; jj < W; ++jj) acc[jj] += Ai[jj] * xi;
  }
  for (int jj = 0; jj < W; ++jj) finish(j0 + jj, acc[jj]);
}

/// rows >= 1.
template <class ExecSpace, class Member, class T, class Finish>
KOKKOS_INLINE_FUNCTION void col_dot(const Member& team, int rows, int cols, const T* A, int ld,
                                    const T* x, const Finish& finish) {
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename ExecSpace::memory_space>::accessible) {
    // A host backend runs a thread's vector lanes as a plain loop; it is
    // written out here because Kokkos' host vector loop does not vectorise
    // under GCC (runtime stride). Blocks of 16, 8, then 4 columns accumulate in
    // registers (independent chains); the rest go one by one. If T already
    // holds one system per SIMD lane (lanes.hpp), blocks of 4 columns.
    int j0 = 0;
    if constexpr (!is_lanes_v<T>) {
      for (; j0 + 16 <= cols; j0 += 16) col_dot_block<16>(rows, A + j0, ld, x, j0, finish);
      for (; j0 + 8 <= cols; j0 += 8) col_dot_block<8>(rows, A + j0, ld, x, j0, finish);
    }
    for (; j0 + 4 <= cols; j0 += 4) col_dot_block<4>(rows, A + j0, ld, x, j0, finish);
    for (int j = j0; j < cols; ++j) finish(j, col_dot_one(rows, A, ld, x, j));
  } else {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, cols),
                         [&](int j) { finish(j, col_dot_one(rows, A, ld, x, j)); });
  }
}

/// The square case, n×n.
template <class ExecSpace, class Member, class T, class Finish>
KOKKOS_INLINE_FUNCTION void col_dot(const Member& team, int n, const T* A, int ld, const T* x,
                                    const Finish& finish) {
  col_dot<ExecSpace>(team, n, n, A, ld, x, finish);
}

}  // namespace kdnn::impl
