#pragma once
// Sinkhorn backward by exact reverse mode through the forward iterations, in
// double. The forward is replayed in scratch, keeping only the n column sums
// σ_k and n row sums ρ_k of every iteration; going backwards, the state
// before each division is rebuilt from the state after it (Z = Y∘ρ), so no
// iterate is stored. For a step Y = Z / ρ (row-wise),
//   dZ_ij = (dY_ij − Σ_l dY_il Y_il) / ρ_i,
// and likewise column-wise; the first column step of exp(X) is a column
// softmax, whose reverse is dX_ij = Y_ij (dY_ij − Σ_l dY_lj Y_lj).
#include "kdnn/core/compat.hpp"
#include "kdnn/sinkhorn/impl/launch.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T>
struct UnrolledBackwardKernel {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;

  Batch<const T, ExecSpace> X, G;
  Batch<T, ExecSpace> dX;
  int batch = 0, n = 0, tile = 1, level = 0, iters = 1;

  /// Per matrix: Y and dY (n×ld each) and 2·iters vectors of sums.
  KOKKOS_INLINE_FUNCTION static std::size_t matrix_elems(int n, int iters) {
    return std::size_t(n) * (2 * scratch_ld(n) + 2 * std::size_t(iters));
  }
  static std::size_t scratch_bytes(int n, int iters, int tile) {
    return scratch_vec_bytes<double, ExecSpace>(tile * matrix_elems(n, iters));
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::size_t per = matrix_elems(n, iters);
    ScratchVec<double, ExecSpace> work(team.team_scratch(level), tile * per);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tile), [&](int t) {
      const int b = team.league_rank() * tile + t;
      if (b < batch) one_matrix(team, b, &work(t * per));
    });
  }

  KOKKOS_INLINE_FUNCTION void one_matrix(const Member& team, int b, double* work) const {
    const int ld = scratch_ld(n);
    double* Y = work;
    double* dY = Y + n * ld;
    double* col_sums = dY + n * ld;       // σ_k, k = 1..iters−1 (k = 0 unused)
    double* row_sums = col_sums + n * iters;  // ρ_k, k = 0..iters−1
    const auto lanes = Kokkos::ThreadVectorRange(team, n);

    // Forward replay. Iteration 0: column softmax of X, then rows.
    Kokkos::parallel_for(lanes, [&](int j) {
      double m = double(X(b, 0, j));
      for (int i = 1; i < n; ++i) m = m > double(X(b, i, j)) ? m : double(X(b, i, j));
      double s = 0;
      for (int i = 0; i < n; ++i) {
        Y[i * ld + j] = compat::exp(double(X(b, i, j)) - m);
        s += Y[i * ld + j];
      }
      for (int i = 0; i < n; ++i) Y[i * ld + j] *= 1 / s;
    });
    for (int k = 0; k < iters; ++k) {
      if (k > 0) {
        Kokkos::parallel_for(lanes, [&](int j) {
          double s = 0;
          for (int i = 0; i < n; ++i) s += Y[i * ld + j];
          col_sums[k * n + j] = s;
          for (int i = 0; i < n; ++i) Y[i * ld + j] *= 1 / s;
        });
      }
      Kokkos::parallel_for(lanes, [&](int i) {
        double s = 0;
        for (int j = 0; j < n; ++j) s += Y[i * ld + j];
        row_sums[k * n + i] = s;
        for (int j = 0; j < n; ++j) Y[i * ld + j] *= 1 / s;
      });
    }

    // Reverse sweep.
    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) { dY[i * ld + j] = double(G(b, i, j)); });
    }
    for (int k = iters - 1; k >= 0; --k) {
      Kokkos::parallel_for(lanes, [&](int i) {
        const double rho = row_sums[k * n + i];
        double d = 0;
        for (int j = 0; j < n; ++j) d += dY[i * ld + j] * Y[i * ld + j];
        for (int j = 0; j < n; ++j) {
          dY[i * ld + j] = (dY[i * ld + j] - d) * (1 / rho);
          Y[i * ld + j] *= rho;
        }
      });
      Kokkos::parallel_for(lanes, [&](int j) {
        double d = 0;
        for (int i = 0; i < n; ++i) d += dY[i * ld + j] * Y[i * ld + j];
        if (k > 0) {
          const double sigma = col_sums[k * n + j];
          for (int i = 0; i < n; ++i) {
            dY[i * ld + j] = (dY[i * ld + j] - d) * (1 / sigma);
            Y[i * ld + j] *= sigma;
          }
        } else {
          for (int i = 0; i < n; ++i) dY[i * ld + j] = Y[i * ld + j] * (dY[i * ld + j] - d);
        }
      });
    }
    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) { dX(b, i, j) = T(dY[i * ld + j]); });
    }
  }
};

}  // namespace kdnn::sinkhorn::impl
