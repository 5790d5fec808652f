#pragma once
// Sinkhorn backward by exact reverse mode through the forward iterations, in
// double. The forward is replayed in scratch — the first iteration by the
// forward's own first_iteration (shifted exponentials, log-domain fallback) —
// keeping only the n column sums σ_k and n row sums ρ_k of iterations
// k = 1..iters−1; going backwards, the state before each of their divisions
// is rebuilt from the state after it (Z = Y∘ρ), so no iterate is stored. For
// a step Y = Z / ρ (row-wise),
//   dZ_ij = (dY_ij − Σ_l dY_il Y_il) / ρ_i,
// and likewise column-wise. The first iteration is reversed by
// first_iteration_reverse, which needs no division by its row sums (they may
// underflow).
#include "kdnn/core/compat.hpp"
#include "kdnn/sinkhorn/impl/first_iteration.hpp"
#include "kdnn/sinkhorn/impl/launch.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T>
struct UnrolledBackwardKernel
    : PerMatrixKernel<UnrolledBackwardKernel<ExecSpace, T>, ExecSpace> {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;

  Batch<const T, ExecSpace> X, G;
  Batch<T, ExecSpace> dX;
  int iters = 1;

  /// One matrix's working set, in double: Y and dY (n×ld), the column and
  /// row sums of iterations 1..iters−1 (n each per iteration), the first
  /// iteration's column statistics and two work vectors (n each).
  struct Work {
    double *Y, *dY, *col_sums, *row_sums, *a, *b;
    ColumnSoftmax cs;
  };
  KOKKOS_INLINE_FUNCTION Work carve(ScratchCarver& s) const {
    const int n = this->n;
    const int ld = scratch_ld(n);
    const std::size_t sums = std::size_t(n) * std::size_t(iters - 1);
    Work w;
    w.Y = s.take<double>(n * ld);
    w.dY = s.take<double>(n * ld);
    w.col_sums = s.take<double>(sums);
    w.row_sums = s.take<double>(sums);
    w.cs.shift = s.take<double>(n);
    w.cs.inv_colsum = s.take<double>(n);
    w.a = s.take<double>(n);
    w.b = s.take<double>(n);
    return w;
  }
  KOKKOS_INLINE_FUNCTION void one_matrix(const Member& team, int b, const Work& w) const {
    const int n = this->n;
    const int ld = scratch_ld(n);
    double* Y = w.Y;
    double* dY = w.dY;
    // Sums of iteration k (1 <= k < iters) at offset (k − 1)·n.
    auto col_sum = [&](int k) { return w.col_sums + (k - 1) * n; };
    auto row_sum = [&](int k) { return w.row_sums + (k - 1) * n; };
    const auto lanes = Kokkos::ThreadVectorRange(team, n);
    const auto x = [&](int i, int j) { return double(X(b, i, j)); };

    // Forward replay.
    first_iteration(team, n, x, Y, ld, w.cs);
    for (int k = 1; k < iters; ++k) {
      Kokkos::parallel_for(lanes, [&](int j) {
        double s = 0;
        for (int i = 0; i < n; ++i) s += Y[i * ld + j];
        col_sum(k)[j] = s;
        for (int i = 0; i < n; ++i) Y[i * ld + j] *= 1 / s;
      });
      Kokkos::parallel_for(lanes, [&](int i) {
        double s = 0;
        for (int j = 0; j < n; ++j) s += Y[i * ld + j];
        row_sum(k)[i] = s;
        for (int j = 0; j < n; ++j) Y[i * ld + j] *= 1 / s;
      });
    }

    // Reverse sweep.
    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) { dY[i * ld + j] = double(G(b, i, j)); });
    }
    for (int k = iters - 1; k >= 1; --k) {
      Kokkos::parallel_for(lanes, [&](int i) {
        const double rho = row_sum(k)[i];
        double d = 0;
        for (int j = 0; j < n; ++j) d += dY[i * ld + j] * Y[i * ld + j];
        for (int j = 0; j < n; ++j) {
          dY[i * ld + j] = (dY[i * ld + j] - d) * (1 / rho);
          Y[i * ld + j] *= rho;
        }
      });
      Kokkos::parallel_for(lanes, [&](int j) {
        const double sigma = col_sum(k)[j];
        double d = 0;
        for (int i = 0; i < n; ++i) d += dY[i * ld + j] * Y[i * ld + j];
        for (int i = 0; i < n; ++i) {
          dY[i * ld + j] = (dY[i * ld + j] - d) * (1 / sigma);
          Y[i * ld + j] *= sigma;
        }
      });
    }
    first_iteration_reverse(team, n, x, Y, dY, ld, w.cs, w.a, w.b,
                            [&](int i, int j, double v) { dX(b, i, j) = T(v); });
  }
};

}  // namespace kdnn::sinkhorn::impl
