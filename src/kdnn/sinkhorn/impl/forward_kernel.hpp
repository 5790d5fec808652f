#pragma once
// Sinkhorn forward: a team thread per matrix, the matrix kept in team scratch
// for all iterations, vector lanes over its rows or columns.
//
// Iteration 1 runs in the log domain, in double: with g_j = −lse_i X_ij and
// f_i = −lse_j (X_ij + g_j), R_ij = exp(X_ij + g_j + f_i) equals exp(X)
// divided by its column sums and then by its row sums, without forming
// exp(X). From then on every row and every column keeps an entry >= 1/n², so
// the plain divisions of later iterations can neither overflow nor divide by
// zero, whatever the range of X.
#include "kdnn/core/compat.hpp"
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

  static std::size_t scratch_bytes(int n, int tile) {
    return scratch_vec_bytes<T, ExecSpace>(std::size_t(tile) * n * scratch_ld(n)) +
           scratch_vec_bytes<double, ExecSpace>(std::size_t(tile) * 2 * n);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const int ld = scratch_ld(n);
    ScratchVec<T, ExecSpace> mats(team.team_scratch(level), std::size_t(tile) * n * ld);
    ScratchVec<double, ExecSpace> aux(team.team_scratch(level), std::size_t(tile) * 2 * n);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tile), [&](int t) {
      const int b = team.league_rank() * tile + t;
      if (b < batch) one_matrix(team, b, &mats(std::size_t(t) * n * ld), &aux(std::size_t(t) * 2 * n));
    });
  }

  /// Normalises matrix b. M: n×ld scratch; col, row: n doubles each.
  KOKKOS_INLINE_FUNCTION void one_matrix(const Member& team, int b, T* M, double* aux) const {
    const int ld = scratch_ld(n);
    double* col = aux;
    double* row = aux + n;
    const auto lanes = Kokkos::ThreadVectorRange(team, n);

    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) { M[i * ld + j] = X(b, i, j); });
    }
    // Iteration 1 in the log domain: col = g, row = f.
    Kokkos::parallel_for(lanes, [&](int j) {
      double m = double(M[j]);
      for (int i = 1; i < n; ++i) m = m > double(M[i * ld + j]) ? m : double(M[i * ld + j]);
      double s = 0;
      for (int i = 0; i < n; ++i) s += compat::exp(double(M[i * ld + j]) - m);
      col[j] = -(m + compat::log(s));
    });
    Kokkos::parallel_for(lanes, [&](int i) {
      const T* Mi = M + i * ld;
      double m = double(Mi[0]) + col[0];
      for (int j = 1; j < n; ++j) m = m > double(Mi[j]) + col[j] ? m : double(Mi[j]) + col[j];
      double s = 0;
      for (int j = 0; j < n; ++j) s += compat::exp(double(Mi[j]) + col[j] - m);
      row[i] = -(m + compat::log(s));
    });
    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) {
        M[i * ld + j] = T(compat::exp(double(M[i * ld + j]) + col[j] + row[i]));
      });
    }

    // Iterations 2..iters; each starts from the column sums (kept in col).
    int used = iters;
    double error = 0;
    for (int it = 1;; ++it) {
      Kokkos::parallel_for(lanes, [&](int j) {
        T s = 0;
        for (int i = 0; i < n; ++i) s += M[i * ld + j];
        col[j] = double(s);
      });
      if (tol > 0 || it == iters) {
        Kokkos::parallel_reduce(
            lanes,
            [&](int j, double& e) {
              const double d = compat::fabs(col[j] - 1.0);
              e = e > d ? e : d;
            },
            Kokkos::Max<double>(error));
      }
      if (it == iters) break;
      if (tol > 0 && error <= tol) {
        used = it;
        break;
      }
      // Divide by the column sums, then by the row sums, one row per lane.
      Kokkos::parallel_for(lanes, [&](int i) {
        T* Mi = M + i * ld;
        T s = 0;
        for (int j = 0; j < n; ++j) {
          Mi[j] /= T(col[j]);
          s += Mi[j];
        }
        for (int j = 0; j < n; ++j) Mi[j] /= s;
      });
    }

    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) { R(b, i, j) = M[i * ld + j]; });
    }
    Kokkos::single(Kokkos::PerThread(team), [&]() {
      if (iters_out.extent(0) > 0) iters_out(b) = used;
      if (error_out.extent(0) > 0) error_out(b) = error;
    });
  }
};

}  // namespace kdnn::sinkhorn::impl
