// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Sinkhorn forward, thread form (matrix_forms.hpp), for a compile-time n = N
// in ThreadMatrixSizes (1 … 4, mHC's sizes): one thread per matrix, all of
// it in registers; consecutive threads take consecutive matrices, so a
// warp's loads and stores cover one contiguous span of the batch, a
// matrix moving whole (matrix_copy.hpp: 16-byte accesses where it is
// contiguous and aligned).
//
// Numerics are ForwardKernel's, operation for operation: the first
// iteration in double through first_column and first_row
// (first_iteration.hpp), then R = diag(u) P diag(v) with P in T, every sum
// in index order, the same rescaled() and the same marginal error. On a
// host that does not contract a·b + c the forms agree bitwise (the tests
// assert it); elsewhere to rounding.
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/matrix_copy.hpp"
#include "kdnn/core/impl/unroll.hpp"
#include "kdnn/core/nan_max.hpp"
#include "kdnn/sinkhorn/impl/first_iteration.hpp"
#include "kdnn/sinkhorn/impl/forward_data.hpp"
#include "kdnn/sinkhorn/impl/rescale.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T, int N>
struct ForwardThreadKernel : ForwardData<ExecSpace, T> {
  using Data = ForwardData<ExecSpace, T>;
  int batch = 0;
  bool transpose = false;  ///< rows first: the columns-first iteration on Xᵀ

  void run(const ExecSpace& space) const {
    Kokkos::parallel_for("kdnn::sinkhorn::forward[thread]",
                         Kokkos::RangePolicy<ExecSpace>(space, 0, batch), *this);
  }

  KOKKOS_INLINE_FUNCTION void operator()(int b) const {
    if (transpose) {
      oriented<true>(b);
    } else {
      oriented<false>(b);
    }
  }

  /// Matrix b, columns first on X (or on Xᵀ if Tr: rows first).
  template <bool Tr>
  KOKKOS_INLINE_FUNCTION void oriented(int b) const {
    const T* x = this->X.data() + std::size_t(b) * this->X.stride(0);
    T* r = this->R.data() + std::size_t(b) * this->R.stride(0);
    const int ldx = int(this->X.stride(1)), ldr = int(this->R.stride(1));
    const T e = T(this->eps);

    // Iteration 1, in double; x as T first, as the host form reads it.
    double xd[N][N], p1[N][N], shift[N], inv_colsum[N];
    {
      T xm[N][N];
      kdnn::impl::load_matrix<N>(x, ldx, xm);
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) {
        KDNN_IMPL_UNROLL
        for (int j = 0; j < N; ++j) xd[i][j] = double(Tr ? xm[j][i] : xm[i][j]);
      }
    }
    KDNN_IMPL_UNROLL
    for (int j = 0; j < N; ++j) {
      first_column(
          N, [&](int i) { return xd[i][j]; }, [&](int i, double v) { p1[i][j] = v; }, shift[j],
          inv_colsum[j]);
    }
    KDNN_IMPL_UNROLL
    for (int i = 0; i < N; ++i) {
      first_row(
          N, [&](int j) { return p1[i][j]; }, [&](int j) { return xd[i][j]; },
          [&](int j) { return shift[j]; }, [&](int j) { return inv_colsum[j]; }, this->eps,
          [&](int j, double v) { p1[i][j] = v; });
    }
    T p[N][N], u[N], v[N];
    KDNN_IMPL_UNROLL
    for (int i = 0; i < N; ++i) {
      u[i] = v[i] = T(1);
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) p[i][j] = T(p1[i][j]);
    }

    // Σ_i P_ij u_i and Σ_j P_ij v_j, in index order (col_dot_one's).
    const auto col_sum = [&](int j) {
      T s = p[0][j] * u[0];
      KDNN_IMPL_UNROLL
      for (int i = 1; i < N; ++i) s += p[i][j] * u[i];
      return s;
    };
    const auto row_sum = [&](int i) {
      T s = p[i][0] * v[0];
      KDNN_IMPL_UNROLL
      for (int j = 1; j < N; ++j) s += p[i][j] * v[j];
      return s;
    };

    // Iterations 2..iters. With tol, each first checks the column sums v∘c,
    // c = Pᵀu, of the current R (its rows were just normalised).
    int used = this->iters;
    for (int it = 1; it < this->iters; ++it) {
      T c[N];
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) c[j] = col_sum(j);
      if (this->tol > 0) {
        const double error =
            thread_nan_max(N, [&](int j) { return compat::fabs(double(v[j] * c[j]) - 1.0); });
        if (error <= this->tol) {
          used = it;
          break;
        }
      }
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) v[j] = rescaled(v[j], c[j], e);
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) u[i] = rescaled(u[i], row_sum(i), e);
    }

    {
      T rm[N][N];
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) {
        KDNN_IMPL_UNROLL
        for (int j = 0; j < N; ++j) (Tr ? rm[j][i] : rm[i][j]) = u[i] * p[i][j] * v[j];
      }
      kdnn::impl::store_matrix<N>(rm, r, ldr);
    }
    if (this->iters_out.extent(0) == 0 && this->error_out.extent(0) == 0) return;
    // Marginal error: row sums u∘(Pv), then column sums v∘(Pᵀu).
    T sums[2 * N];
    KDNN_IMPL_UNROLL
    for (int k = 0; k < N; ++k) {
      sums[k] = u[k] * row_sum(k);
      sums[N + k] = v[k] * col_sum(k);
    }
    const double error =
        thread_nan_max(2 * N, [&](int k) { return compat::fabs(double(sums[k]) - 1.0); });
    if (this->iters_out.extent(0) > 0) this->iters_out(b) = used;
    if (this->error_out.extent(0) > 0) this->error_out(b) = error;
  }
};

}  // namespace kdnn::sinkhorn::impl
