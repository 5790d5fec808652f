#pragma once
// Sinkhorn forward: a team thread per matrix, kept in team scratch for all
// iterations, vector lanes over its rows or columns.
//
// Iteration 1 runs in double with shifted exponentials (first_iteration.hpp),
// so any finite X is safe.
//
// Iterations 2..iters keep R = diag(u) P diag(v) and update only the scaling
// vectors: dividing R by its column sums v∘(Pᵀu) is v = 1/(Pᵀu), dividing by
// its row sums is u = 1/(Pv). That is the reference iteration exactly (up to
// rounding) at two matrix-vector products per iteration, and P is never
// rewritten. Pᵀ is kept beside P so that both products are col_dot calls.
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/col_dot.hpp"
#include "kdnn/sinkhorn/impl/first_iteration.hpp"
#include "kdnn/sinkhorn/impl/launch.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T>
struct ForwardKernel : PerMatrixKernel<ForwardKernel<ExecSpace, T>, ExecSpace> {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;

  Batch<const T, ExecSpace> X;
  Batch<T, ExecSpace> R;
  Kokkos::View<int*, typename ExecSpace::memory_space> iters_out;
  Kokkos::View<double*, typename ExecSpace::memory_space> error_out;
  int iters = 1;
  double tol = 0;

  /// One matrix's working set: P and Pᵀ (n×ld), the scaling vectors u, v
  /// and the column sums c in T; the first iteration's P and column
  /// statistics in double.
  struct Work {
    T *P, *PT, *u, *v, *c;
    double* P1;
    ColumnSoftmax cs;
  };
  KOKKOS_INLINE_FUNCTION Work carve(ScratchCarver& s) const {
    const int n = this->n;
    const int ld = scratch_ld(n);
    Work w;
    w.P = s.take<T>(n * ld);
    w.PT = s.take<T>(n * ld);
    w.u = s.take<T>(n);
    w.v = s.take<T>(n);
    w.c = s.take<T>(n);
    w.P1 = s.take<double>(n * ld);
    w.cs.shift = s.take<double>(n);
    w.cs.inv_colsum = s.take<double>(n);
    return w;
  }
  KOKKOS_INLINE_FUNCTION void one_matrix(const Member& team, int b, const Work& w) const {
    const int n = this->n;
    const int ld = scratch_ld(n);
    T* P = w.P;
    T* PT = w.PT;
    T* u = w.u;
    T* v = w.v;
    T* c = w.c;
    const auto lanes = Kokkos::ThreadVectorRange(team, n);

    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) { P[i * ld + j] = X(b, i, j); });
    }
    first_iteration(team, n, [&](int i, int j) { return double(P[i * ld + j]); }, w.P1, ld,
                    w.cs);
    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) {
        P[i * ld + j] = T(w.P1[i * ld + j]);
        PT[j * ld + i] = P[i * ld + j];
      });
    }
    Kokkos::parallel_for(lanes, [&](int k) { u[k] = v[k] = T(1); });

    // Iterations 2..iters. Each starts from c = Pᵀu: the column sums of the
    // current R are v∘c (its row sums are 1); v = 1/c, then u = 1/(Pv).
    int used = iters;
    double error = 0;
    for (int it = 1;; ++it) {
      if (tol > 0 || it == iters) {
        kdnn::impl::col_dot<ExecSpace>(team, n, P, ld, u, [&](int j, T s) { c[j] = s; });
        Kokkos::parallel_reduce(
            lanes,
            [&](int j, double& e) {
              const double d = compat::fabs(double(v[j] * c[j]) - 1.0);
              e = e > d ? e : d;
            },
            Kokkos::Max<double>(error));
        if (it == iters) break;
        if (error <= tol) {
          used = it;
          break;
        }
        Kokkos::parallel_for(lanes, [&](int j) { v[j] = T(1) / c[j]; });
      } else {
        kdnn::impl::col_dot<ExecSpace>(team, n, P, ld, u, [&](int j, T s) { v[j] = T(1) / s; });
      }
      kdnn::impl::col_dot<ExecSpace>(team, n, PT, ld, v, [&](int i, T s) { u[i] = T(1) / s; });
    }

    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) { R(b, i, j) = u[i] * P[i * ld + j] * v[j]; });
    }
    Kokkos::single(Kokkos::PerThread(team), [&]() {
      if (iters_out.extent(0) > 0) iters_out(b) = used;
      if (error_out.extent(0) > 0) error_out(b) = error;
    });
  }
};

}  // namespace kdnn::sinkhorn::impl
