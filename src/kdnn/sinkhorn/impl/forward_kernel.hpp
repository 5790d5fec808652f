#pragma once
// Sinkhorn forward: a team thread per matrix, kept in team scratch for all
// iterations, vector lanes over its rows or columns.
//
// Iteration 1 runs in double with shifted exponentials (a column softmax,
// then the row division, falling back to the log domain for a row that
// underflows): P equals exp(X) divided by its column sums and then by its row
// sums, without forming exp(X). Every row of P then has an entry >= 1/n and
// every column one >= 1/n², so nothing below can overflow or divide by zero,
// whatever the range of X.
//
// Iterations 2..iters keep R = diag(u) P diag(v) and update only the scaling
// vectors: dividing R by its column sums v∘(Pᵀu) is v = 1/(Pᵀu), dividing by
// its row sums is u = 1/(Pv). That is the reference iteration exactly (up to
// rounding) at two matrix-vector products per iteration, and P is never
// rewritten. Pᵀ is kept beside P so that both products are col_dot calls.
#include "kdnn/core/compat.hpp"
#include "kdnn/sinkhorn/impl/col_dot.hpp"
#include "kdnn/sinkhorn/impl/launch.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T>
struct ForwardKernel {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;

  Batch<const T, ExecSpace> X;
  Batch<T, ExecSpace> R;
  Kokkos::View<int*, typename ExecSpace::memory_space> iters_out;
  Kokkos::View<double*, typename ExecSpace::memory_space> error_out;
  int batch = 0, n = 0, tile = 1, iters = 1, level = 0;
  double tol = 0;

  /// Per matrix: P and Pᵀ (n×ld each) and the vectors u, v, c of n in T;
  /// the first iteration's E (n×ld) and two vectors of n in double.
  KOKKOS_INLINE_FUNCTION static std::size_t matrix_elems(int n) { return std::size_t(n) * (2 * scratch_ld(n) + 3); }
  KOKKOS_INLINE_FUNCTION static std::size_t aux_elems(int n) { return std::size_t(n) * (scratch_ld(n) + 2); }
  static std::size_t scratch_bytes(int n, int tile) {
    return scratch_vec_bytes<T, ExecSpace>(tile * matrix_elems(n)) +
           scratch_vec_bytes<double, ExecSpace>(tile * aux_elems(n));
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    ScratchVec<T, ExecSpace> mats(team.team_scratch(level), tile * matrix_elems(n));
    ScratchVec<double, ExecSpace> aux(team.team_scratch(level), tile * aux_elems(n));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tile), [&](int t) {
      const int b = team.league_rank() * tile + t;
      if (b < batch) one_matrix(team, b, &mats(t * matrix_elems(n)), &aux(t * aux_elems(n)));
    });
  }

  KOKKOS_INLINE_FUNCTION void one_matrix(const Member& team, int b, T* P, double* aux) const {
    const int ld = scratch_ld(n);
    T* PT = P + n * ld;
    T* u = PT + n * ld;
    T* v = u + n;
    T* c = v + n;
    double* shift = aux;
    double* inv_colsum = aux + n;
    double* E = aux + 2 * n;
    const auto lanes = Kokkos::ThreadVectorRange(team, n);

    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) { P[i * ld + j] = X(b, i, j); });
    }
    // Iteration 1, in double: E_ij = exp(X_ij − m_j) with m_j the column
    // maximum, column sums s_j >= 1, row sums ρ_i of E_ij / s_j, and
    // P_ij = E_ij / (s_j ρ_i). A row whose entries all underflow (ρ_i tiny,
    // only for spreads of X beyond ~600) is redone in the log domain.
    Kokkos::parallel_for(lanes, [&](int j) {
      double m = double(P[j]);
      for (int i = 1; i < n; ++i) m = m > double(P[i * ld + j]) ? m : double(P[i * ld + j]);
      double s = 0;
      for (int i = 0; i < n; ++i) {
        E[i * ld + j] = compat::exp(double(P[i * ld + j]) - m);
        s += E[i * ld + j];
      }
      shift[j] = m;
      inv_colsum[j] = 1 / s;
    });
    Kokkos::parallel_for(lanes, [&](int i) {
      double rho = 0;
      for (int j = 0; j < n; ++j) rho += E[i * ld + j] * inv_colsum[j];
      if (rho > 1e-280) {
        const double inv_rho = 1 / rho;
        for (int j = 0; j < n; ++j) E[i * ld + j] *= inv_colsum[j] * inv_rho;
        return;
      }
      // log P_ij = l_ij − lse_j l_ij with l_ij = X_ij − m_j + log(1/s_j).
      auto l = [&](int j) { return double(P[i * ld + j]) - shift[j] + compat::log(inv_colsum[j]); };
      double lmax = l(0);
      for (int j = 1; j < n; ++j) lmax = lmax > l(j) ? lmax : l(j);
      double sum = 0;
      for (int j = 0; j < n; ++j) sum += compat::exp(l(j) - lmax);
      for (int j = 0; j < n; ++j) E[i * ld + j] = compat::exp(l(j) - lmax - compat::log(sum));
    });
    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) {
        P[i * ld + j] = T(E[i * ld + j]);
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
        col_dot<ExecSpace>(team, n, P, ld, u, [&](int j, T s) { c[j] = s; });
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
        col_dot<ExecSpace>(team, n, P, ld, u, [&](int j, T s) { v[j] = T(1) / s; });
      }
      col_dot<ExecSpace>(team, n, PT, ld, v, [&](int i, T s) { u[i] = T(1) / s; });
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
