#pragma once
// Sinkhorn backward by exact reverse mode through the forward iterations
// (columns first; rows first on the transposed matrices), in double.
//
// The forward is replayed in scaling-vector form (forward_kernel.hpp): after
// the first iteration P, the state after iteration k + 1 is
// R_k = diag(u_k) P diag(v_k), u_0 = v_0 = 1, with
//   c_k = Pᵀu_{k−1},  v_k = v_{k−1} / (v_{k−1}∘c_k + eps),
//   r_k = P v_k,      u_k = u_{k−1} / (u_{k−1}∘r_k + eps),
// and R = R_{K−1} for K = iters. Only the 2K scaling vectors are stored.
// Reverse, from du = (G∘P) v_{K−1}, dv = (G∘P)ᵀ u_{K−1}, for k = K−1 .. 1:
//   dr_k = −du∘u_k²,   dv += Pᵀdr_k,   du ← du∘eps (u_k/u_{k−1})²
//   dc_k = −dv∘v_k²,   du += P dc_k,   dv ← dv∘eps (v_k/v_{k−1})²
// (for eps = 0 the carried terms vanish: u_k depends on u_{k−1} only through
// r_k). Each step contributes a rank-1 term to dP = dL/dP, summed at the end
// as one product of an n×2(K−1) and a 2(K−1)×n matrix:
//   dP = G∘(u_{K−1} v_{K−1}ᵀ) + Σ_k (dr_k v_kᵀ + u_{k−1} dc_kᵀ).
// The first iteration is reversed by first_iteration_reverse, which needs no
// division by its row sums (they may underflow).
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/col_dot.hpp"
#include "kdnn/sinkhorn/impl/first_iteration.hpp"
#include "kdnn/sinkhorn/impl/launch.hpp"
#include "kdnn/sinkhorn/impl/rescale.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T>
struct UnrolledBackwardKernel
    : PerMatrixKernel<UnrolledBackwardKernel<ExecSpace, T>, ExecSpace> {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using C = double;  // the replay and reverse sweep

  Batch<const T, ExecSpace> X, G;
  Batch<T, ExecSpace> dX;
  int iters = 1;
  double eps = 0;

  /// One matrix's working set, in double: the first iteration's P and dP,
  /// Pᵀ (n×ld each) and statistics; the scaling vectors U = [u_0 .. u_{K−1}]
  /// (K×n), then V = [v_0 .. v_{K−1}] followed by DC = [dc_1 .. dc_{K−1}]
  /// (2K−1 rows of n, so that [v_1 .. v_{K−1}, dc_1 .. dc_{K−1}] is one
  /// 2(K−1)×n matrix); DRU, n×2(K−1), whose row i is
  /// [dr_1 .. dr_{K−1}, u_0 .. u_{K−2}]_i; du, dv and two work vectors.
  struct Work {
    double *P, *PT, *dP, *U, *V, *DRU, *du, *dv, *a, *b;
    FirstIteration fi;
  };
  KOKKOS_INLINE_FUNCTION int steps() const { return 2 * (iters - 1); }
  KOKKOS_INLINE_FUNCTION Work carve(ScratchCarver& s) const {
    const int n = this->n;
    const int ld = scratch_ld(n);
    const std::size_t K = std::size_t(iters);
    Work w;
    w.P = s.take<double>(n * ld);
    w.PT = s.take<double>(n * ld);
    w.dP = s.take<double>(n * ld);
    w.U = s.take<double>(K * n);
    w.V = s.take<double>((2 * K - 1) * n);
    w.DRU = s.take<double>(std::size_t(n) * std::size_t(steps()));
    w.fi.shift = s.take<double>(n);
    w.fi.inv_colsum = s.take<double>(n);
    w.fi.row_eps = s.take<double>(n);
    w.du = s.take<double>(n);
    w.dv = s.take<double>(n);
    w.a = s.take<double>(n);
    w.b = s.take<double>(n);
    return w;
  }
  KOKKOS_INLINE_FUNCTION void one_matrix(const Member& team, int b, const Work& w) const {
    const int n = this->n;
    const int ld = scratch_ld(n);
    const int K = iters, M = steps();
    double* P = w.P;
    double* PT = w.PT;
    double* du = w.du;
    double* dv = w.dv;
    auto u = [&](int k) { return w.U + k * n; };
    auto v = [&](int k) { return w.V + k * n; };
    auto dc = [&](int k) { return w.V + (K - 1 + k) * n; };  // k >= 1
    const auto lanes = Kokkos::ThreadVectorRange(team, n);
    const auto x = [&](int i, int j) { return double(this->at(X, b, i, j)); };

    // Forward replay.
    first_iteration(team, n, x, eps, P, ld, w.fi);
    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) { PT[j * ld + i] = P[i * ld + j]; });
    }
    Kokkos::parallel_for(lanes, [&](int k) { u(0)[k] = v(0)[k] = 1; });
    for (int k = 1; k < K; ++k) {
      rescale<ExecSpace>(team, n, P, ld, u(k - 1), v(k - 1), v(k), eps);
      rescale<ExecSpace>(team, n, PT, ld, v(k), u(k - 1), u(k), eps);
    }

    // du = W v, dv = Wᵀu at the output, W = G∘P (in dP for now).
    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) {
        w.dP[i * ld + j] = double(this->at(G, b, i, j)) * P[i * ld + j];
      });
    }
    Kokkos::parallel_for(lanes, [&](int i) {
      double s = 0;
      for (int j = 0; j < n; ++j) s += w.dP[i * ld + j] * v(K - 1)[j];
      du[i] = s;
    });
    kdnn::impl::col_dot<ExecSpace>(team, n, w.dP, ld, u(K - 1),
                                   [&](int j, double s) { dv[j] = s; });

    // Reverse sweep; dr_k goes to DRU's column k − 1 and to `a` (contiguous).
    double* dr = w.a;
    for (int k = K - 1; k >= 1; --k) {
      Kokkos::parallel_for(lanes, [&](int i) {
        const double uk = u(k)[i], uprev = u(k - 1)[i];
        dr[i] = -du[i] * uk * uk;
        w.DRU[i * M + k - 1] = dr[i];
        w.DRU[i * M + K - 1 + k - 1] = uprev;
        du[i] = eps == 0 ? 0.0 : du[i] * eps * (uk / uprev) * (uk / uprev);
      });
      kdnn::impl::col_dot<ExecSpace>(team, n, P, ld, dr, [&](int j, double s) { dv[j] += s; });
      Kokkos::parallel_for(lanes, [&](int j) {
        const double vk = v(k)[j], vprev = v(k - 1)[j];
        dc(k)[j] = -dv[j] * vk * vk;
        dv[j] = eps == 0 ? 0.0 : dv[j] * eps * (vk / vprev) * (vk / vprev);
      });
      kdnn::impl::col_dot<ExecSpace>(team, n, PT, ld, dc(k), [&](int i, double s) { du[i] += s; });
    }

    // dP = G∘(u vᵀ) + DRU · [v_1 .. v_{K−1}, dc_1 .. dc_{K−1}], row by row.
    for (int i = 0; i < n; ++i) {
      const double ui = u(K - 1)[i];
      const auto store = [&](int j, double s) {
        w.dP[i * ld + j] = double(this->at(G, b, i, j)) * ui * v(K - 1)[j] + s;
      };
      if (M == 0) {
        Kokkos::parallel_for(lanes, [&](int j) { store(j, 0.0); });
      } else {
        kdnn::impl::col_dot<ExecSpace>(team, M, n, v(1), n, w.DRU + i * M, store);
      }
    }
    first_iteration_reverse(team, n, x, P, w.dP, ld, w.fi, w.a, w.b,
                            [&](int i, int j, double value) { this->at(dX, b, i, j) = T(value); });
  }
};

}  // namespace kdnn::sinkhorn::impl
