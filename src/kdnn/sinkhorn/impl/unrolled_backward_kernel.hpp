#pragma once
// Sinkhorn backward by exact reverse mode through the forward iterations
// (columns first; rows first on the transposed matrices). The first iteration
// and its reverse run in double (first_iteration.hpp); the replay and the
// reverse sweep of the later iterations in T, like the forward.
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

  Batch<const T, ExecSpace> X, G;
  Batch<T, ExecSpace> dX;
  int iters = 1;
  double eps = 0;

  /// One matrix's working set: in double the first iteration's P1, dP, S
  /// (n×ld) and statistics and two work vectors; in T, P and Pᵀ (n×ld), the scaling
  /// vectors U = [u_0 .. u_{K−1}]
  /// (K×n), then V = [v_0 .. v_{K−1}] followed by DC = [dc_1 .. dc_{K−1}]
  /// (2K−1 rows of n, so that [v_1 .. v_{K−1}, dc_1 .. dc_{K−1}] is one
  /// 2(K−1)×n matrix); DRU, n×2(K−1), whose row i is
  /// [dr_1 .. dr_{K−1}, u_0 .. u_{K−2}]_i, du, dv and dr.
  struct Work {
    double *P1, *dP, *a, *b;
    T *P, *PT, *U, *V, *DRU, *du, *dv, *dr;
    FirstIteration fi;
  };
  KOKKOS_INLINE_FUNCTION int steps() const { return 2 * (iters - 1); }
  KOKKOS_INLINE_FUNCTION Work carve(ScratchCarver& s) const {
    const int n = this->n;
    const int ld = scratch_ld(n);
    const std::size_t K = std::size_t(iters);
    Work w;
    w.P1 = s.take<double>(n * ld);
    w.dP = s.take<double>(n * ld);
    w.fi.shift = s.take<double>(n);
    w.fi.inv_colsum = s.take<double>(n);
    w.fi.row_eps = s.take<double>(n);
    w.fi.S = s.take<double>(n * ld);  // kept: the reverse needs no exp()
    w.a = s.take<double>(n);
    w.b = s.take<double>(n);
    w.P = s.take<T>(n * ld);
    w.PT = s.take<T>(n * ld);
    w.U = s.take<T>(K * n);
    w.V = s.take<T>((2 * K - 1) * n);
    w.DRU = s.take<T>(std::size_t(n) * std::size_t(steps()));
    w.du = s.take<T>(n);
    w.dv = s.take<T>(n);
    w.dr = s.take<T>(n);
    return w;
  }
  /// Reverse of s_k = s_{k−1} / (s_{k−1}∘y + eps) (rescale.hpp) for the
  /// adjoint ds of s_k: dy = −ds∘s_k², and ds becomes the adjoint of s_{k−1},
  /// ds∘eps (s_k/s_{k−1})² (0 for eps = 0; the branch is outside the loop).
  KOKKOS_INLINE_FUNCTION void reverse_rescale(const Member& team, const T* s, const T* s_prev,
                                              T* ds, T* dy, T e) const {
    const auto lanes = Kokkos::ThreadVectorRange(team, this->n);
    if (e == 0) {
      Kokkos::parallel_for(lanes, [&](int i) {
        dy[i] = -ds[i] * s[i] * s[i];
        ds[i] = 0;
      });
    } else {
      Kokkos::parallel_for(lanes, [&](int i) {
        const T ratio = s[i] / s_prev[i];
        dy[i] = -ds[i] * s[i] * s[i];
        ds[i] *= e * ratio * ratio;
      });
    }
  }

  KOKKOS_INLINE_FUNCTION void one_matrix(const Member& team, int b, const Work& w) const {
    const int n = this->n;
    const int ld = scratch_ld(n);
    const int K = iters, M = steps();
    T *P = w.P, *PT = w.PT, *du = w.du, *dv = w.dv, *dr = w.dr;
    const T e = T(eps);
    auto u = [&](int k) { return w.U + k * n; };
    auto v = [&](int k) { return w.V + k * n; };
    auto dc = [&](int k) { return w.V + (K - 1 + k) * n; };  // k >= 1
    const auto lanes = Kokkos::ThreadVectorRange(team, n);
    const auto x = [&](int i, int j) { return double(this->at(X, b, i, j)); };

    // Forward replay.
    first_iteration(team, n, x, eps, w.P1, ld, w.fi);
    start_scaling(team, n, w.P1, P, PT, ld, u(0), v(0));
    for (int k = 1; k < K; ++k) {
      rescale<ExecSpace>(team, n, P, ld, u(k - 1), v(k - 1), v(k), e);
      rescale<ExecSpace>(team, n, PT, ld, v(k), u(k - 1), u(k), e);
    }

    // du = W v and dv = Wᵀu at the output, W = G∘P.
    Kokkos::parallel_for(lanes, [&](int i) {
      T s = 0;
      for (int j = 0; j < n; ++j) s += this->at(G, b, i, j) * P[i * ld + j] * v(K - 1)[j];
      du[i] = s;
    });
    Kokkos::parallel_for(lanes, [&](int j) {
      T s = 0;
      for (int i = 0; i < n; ++i) s += this->at(G, b, i, j) * P[i * ld + j] * u(K - 1)[i];
      dv[j] = s;
    });

    // Reverse sweep; dr_k goes to DRU's column k − 1 and to dr (contiguous).
    for (int k = K - 1; k >= 1; --k) {
      reverse_rescale(team, u(k), u(k - 1), du, dr, e);
      kdnn::impl::col_dot<ExecSpace>(team, n, P, ld, dr, [&](int j, T s) { dv[j] += s; });
      reverse_rescale(team, v(k), v(k - 1), dv, dc(k), e);
      kdnn::impl::col_dot<ExecSpace>(team, n, PT, ld, dc(k), [&](int i, T s) { du[i] += s; });
      Kokkos::parallel_for(lanes, [&](int i) {
        w.DRU[i * M + k - 1] = dr[i];
        w.DRU[i * M + K - 1 + k - 1] = u(k - 1)[i];
      });
    }

    // dP = G∘(u vᵀ) + DRU · [v_1 .. v_{K−1}, dc_1 .. dc_{K−1}], row by row.
    for (int i = 0; i < n; ++i) {
      const T ui = u(K - 1)[i];
      const auto store = [&](int j, T s) {
        w.dP[i * ld + j] = double(this->at(G, b, i, j) * ui * v(K - 1)[j] + s);
      };
      if (M == 0) {
        Kokkos::parallel_for(lanes, [&](int j) { store(j, T(0)); });
      } else {
        kdnn::impl::col_dot<ExecSpace>(team, M, n, v(1), n, w.DRU + i * M, store);
      }
    }
    first_iteration_reverse(team, n, x, w.P1, w.dP, ld, w.fi, w.a, w.b,
                            [&](int i, int j, double value) { this->at(dX, b, i, j) = T(value); });
  }
};

}  // namespace kdnn::sinkhorn::impl
