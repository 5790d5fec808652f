// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Sinkhorn forward: a team thread per matrix, kept in team scratch for all
// iterations, vector lanes over its rows or columns. Written for the
// columns-first order; rows first runs it on the transposed matrix
// (PerMatrixKernel::transpose).
//
// Iteration 1 runs in double with shifted exponentials (first_iteration.hpp),
// so any finite X is safe.
//
// Iterations 2..iters keep R = diag(u) P diag(v) and update only the scaling
// vectors (rescale.hpp): v from the column sums v∘(Pᵀu), then u from the row
// sums u∘(Pv). That is the reference iteration exactly (up to rounding) at two
// matrix-vector products per iteration, and P is never rewritten. Pᵀ is kept
// beside P so that both products are col_dot calls.
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/col_dot.hpp"
#include "kdnn/core/nan_max.hpp"
#include "kdnn/sinkhorn/impl/first_iteration.hpp"
#include "kdnn/sinkhorn/impl/forward_data.hpp"
#include "kdnn/sinkhorn/impl/launch.hpp"
#include "kdnn/sinkhorn/impl/marginal_error.hpp"
#include "kdnn/sinkhorn/impl/rescale.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T>
struct ForwardKernel : PerMatrixKernel<ForwardKernel<ExecSpace, T>, ExecSpace>,
                       ForwardData<ExecSpace, T> {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Data = ForwardData<ExecSpace, T>;
  using Data::eps;
  using Data::error_out;
  using Data::iters;
  using Data::iters_out;
  using Data::R;
  using Data::tol;
  using Data::X;

  /// One matrix's working set: P and Pᵀ (n×ld), the scaling vectors u, v
  /// and the column and row sums c, r in T; the first iteration's P and
  /// statistics in double.
  struct Work {
    T *P, *PT, *u, *v, *c, *r;
    double* P1;
    FirstIteration fi;
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
    w.r = s.take<T>(n);
    w.P1 = s.take<double>(n * ld);
    w.fi.shift = s.take<double>(n);
    w.fi.inv_colsum = s.take<double>(n);
    w.fi.row_eps = s.take<double>(n);
    w.fi.S = nullptr;
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
    T* r = w.r;
    const T e = T(eps);
    const auto lanes = Kokkos::ThreadVectorRange(team, n);

    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) { P[i * ld + j] = this->at(X, b, i, j); });
    }
    first_iteration(
        team, n, [&](int i, int j) { return double(P[i * ld + j]); }, eps, w.P1, ld, w.fi);
    start_scaling(
        team, n, [&](int i, int j) { return T(w.P1[i * ld + j]); }, P, PT, ld, u, v);

    // Iterations 2..iters. With tol, each first checks the column sums v∘c,
    // c = Pᵀu, of the current R (its rows were just normalised).
    int used = iters;
    for (int it = 1; it < iters; ++it) {
      if (tol > 0) {
        kdnn::impl::col_dot<ExecSpace>(team, n, P, ld, u, [&](int j, T s) { c[j] = s; });
        const double error =
            lane_nan_max(team, n, [&](int j) { return compat::fabs(double(v[j] * c[j]) - 1.0); });
        if (error <= tol) {
          used = it;
          break;
        }
        Kokkos::parallel_for(lanes, [&](int j) { v[j] = rescaled(v[j], c[j], e); });
      } else {
        rescale<ExecSpace>(team, n, P, ld, u, v, v, e);
      }
      rescale<ExecSpace>(team, n, PT, ld, v, u, u, e);
    }

    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes,
                           [&](int j) { this->at(R, b, i, j) = u[i] * P[i * ld + j] * v[j]; });
    }
    if (iters_out.extent(0) == 0 && error_out.extent(0) == 0) return;
    // Marginal error: column sums v∘(Pᵀu), row sums u∘(Pv).
    kdnn::impl::col_dot<ExecSpace>(team, n, P, ld, u, [&](int j, T s) { c[j] = v[j] * s; });
    kdnn::impl::col_dot<ExecSpace>(team, n, PT, ld, v, [&](int i, T s) { r[i] = u[i] * s; });
    const double error = marginal_error(team, n, r, c);
    Kokkos::single(Kokkos::PerThread(team), [&]() {
      if (iters_out.extent(0) > 0) iters_out(b) = used;
      if (error_out.extent(0) > 0) error_out(b) = error;
    });
  }
};

}  // namespace kdnn::sinkhorn::impl
