// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
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
//
// On a host, a team thread takes a group of matrices side by side in SIMD
// lanes (core/impl/lanes.hpp): the first iteration and its reverse run per
// matrix, the replay and the reverse sweep — the bulk of the work, and at
// small n a chain of short dependent steps — once for the whole group, lane by
// lane. Each lane computes exactly what one matrix alone would, so results do
// not depend on the grouping. On a GPU a group is one matrix.
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/col_dot.hpp"
#include "kdnn/core/impl/lanes.hpp"
#include "kdnn/sinkhorn/impl/first_iteration.hpp"
#include "kdnn/sinkhorn/impl/launch.hpp"
#include "kdnn/sinkhorn/impl/rescale.hpp"
#include "kdnn/sinkhorn/impl/unrolled_backward_data.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T>
struct UnrolledBackwardKernel : PerMatrixKernel<UnrolledBackwardKernel<ExecSpace, T>, ExecSpace>,
                                UnrolledBackwardData<ExecSpace, T> {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Lanes = kdnn::impl::Lanes<T, kdnn::impl::BackendTraits<ExecSpace>::is_host>;
  /// One lane's value of T per matrix of the group.
  using C = typename Lanes::type;
  static constexpr bool grouped = true;
  static constexpr int group = Lanes::width;
  using Data = UnrolledBackwardData<ExecSpace, T>;
  using Data::dX;
  using Data::eps;
  using Data::G;
  using Data::iters;
  using Data::X;

  /// One group's working set. Per matrix, in double: the first iteration's
  /// P1, dP, S (n×ld each), its statistics and two work vectors (n each),
  /// matrix l's at offset l times the size. For the whole group, in C: P and
  /// Pᵀ (n×ld), the scaling vectors U = [u_0 .. u_{K−1}] (K×n), then
  /// V = [v_0 .. v_{K−1}] followed by DC = [dc_1 .. dc_{K−1}] (2K−1 rows of
  /// n, so that [v_1 .. v_{K−1}, dc_1 .. dc_{K−1}] is one 2(K−1)×n matrix);
  /// DRU, n×2(K−1), whose row i is [dr_1 .. dr_{K−1}, u_0 .. u_{K−2}]_i, du,
  /// dv and dr.
  struct Work {
    double *P1, *dP, *S, *shift, *inv_colsum, *row_eps, *a, *b;
    C *P, *PT, *U, *V, *DRU, *du, *dv, *dr;
  };
  KOKKOS_INLINE_FUNCTION int steps() const { return 2 * (iters - 1); }
  KOKKOS_INLINE_FUNCTION Work carve(ScratchCarver& s) const {
    const std::size_t n = std::size_t(this->n), nld = n * std::size_t(scratch_ld(this->n));
    const std::size_t K = std::size_t(iters), L = std::size_t(group);
    Work w;
    w.P1 = s.take<double>(L * nld);
    w.dP = s.take<double>(L * nld);
    w.S = s.take<double>(L * nld);  // kept: the reverse needs no exp()
    w.shift = s.take<double>(L * n);
    w.inv_colsum = s.take<double>(L * n);
    w.row_eps = s.take<double>(L * n);
    w.a = s.take<double>(L * n);
    w.b = s.take<double>(L * n);
    w.P = s.take<C>(nld);
    w.PT = s.take<C>(nld);
    w.U = s.take<C>(K * n);
    w.V = s.take<C>((2 * K - 1) * n);
    w.DRU = s.take<C>(n * std::size_t(steps()));
    w.du = s.take<C>(n);
    w.dv = s.take<C>(n);
    w.dr = s.take<C>(n);
    return w;
  }
  /// The first iteration's statistics of the group's matrix l.
  KOKKOS_INLINE_FUNCTION FirstIteration first_iteration_of(const Work& w, int l) const {
    const int n = this->n;
    return {w.shift + l * n, w.inv_colsum + l * n, w.row_eps + l * n,
            w.S + std::size_t(l) * n * scratch_ld(n)};
  }
  /// Reverse of s_k = s_{k−1} / (s_{k−1}∘y + eps) (rescale.hpp) for the
  /// adjoint ds of s_k: dy = −ds∘s_k², and ds becomes the adjoint of s_{k−1},
  /// ds∘eps (s_k/s_{k−1})² (0 for eps = 0; the branch is outside the loop).
  KOKKOS_INLINE_FUNCTION void reverse_rescale(const Member& team, const C* s, const C* s_prev,
                                              C* ds, C* dy, T e) const {
    const auto lanes = Kokkos::ThreadVectorRange(team, this->n);
    if (e == 0) {
      Kokkos::parallel_for(lanes, [&](int i) {
        dy[i] = -ds[i] * s[i] * s[i];
        ds[i] = C{};
      });
    } else {
      Kokkos::parallel_for(lanes, [&](int i) {
        const C ratio = s[i] / s_prev[i];
        dy[i] = -ds[i] * s[i] * s[i];
        ds[i] *= e * ratio * ratio;
      });
    }
  }

  /// Matrices b0 .. b0 + count − 1 in lanes 0 .. count − 1; the lanes after
  /// them repeat matrix b0, and their results are dropped.
  KOKKOS_INLINE_FUNCTION void one_group(const Member& team, int b0, int group_count,
                                        const Work& w) const {
    // A compile-time 1 for groups of one (a GPU): no loops around one matrix.
    const int count = group == 1 ? 1 : group_count;
    const int n = this->n;
    const int ld = scratch_ld(n);
    const std::size_t nld = std::size_t(n) * ld;
    const int K = iters, M = steps();
    C *P = w.P, *PT = w.PT, *du = w.du, *dv = w.dv, *dr = w.dr;
    const T e = T(eps);
    auto u = [&](int k) { return w.U + k * n; };
    auto v = [&](int k) { return w.V + k * n; };
    auto dc = [&](int k) { return w.V + (K - 1 + k) * n; };  // k >= 1
    const auto lanes = Kokkos::ThreadVectorRange(team, n);
    const auto source = [&](int l) { return l < count ? l : 0; };
    /// Element (i, j) of view for every lane of the group.
    const auto gather = [&](const Batch<const T, ExecSpace>& view, int i, int j) {
      C value{};
      for (int l = 0; l < group; ++l)
        kdnn::impl::set_lane(value, l, this->at(view, b0 + source(l), i, j));
      return value;
    };

    // Forward replay: the first iteration per matrix, then the group.
    for (int l = 0; l < count; ++l) {
      first_iteration(
          team, n, [&](int i, int j) { return double(this->at(X, b0 + l, i, j)); }, eps,
          w.P1 + l * nld, ld, first_iteration_of(w, l));
    }
    start_scaling(
        team, n,
        [&](int i, int j) {
          C value{};
          for (int l = 0; l < group; ++l)
            kdnn::impl::set_lane(value, l, T(w.P1[source(l) * nld + i * ld + j]));
          return value;
        },
        P, PT, ld, u(0), v(0));
    for (int k = 1; k < K; ++k) {
      rescale<ExecSpace>(team, n, P, ld, u(k - 1), v(k - 1), v(k), e);
      rescale<ExecSpace>(team, n, PT, ld, v(k), u(k - 1), u(k), e);
    }

    // du = W v and dv = Wᵀu at the output, W = G∘P.
    Kokkos::parallel_for(lanes, [&](int i) {
      C s{};
      for (int j = 0; j < n; ++j) s += gather(G, i, j) * P[i * ld + j] * v(K - 1)[j];
      du[i] = s;
    });
    Kokkos::parallel_for(lanes, [&](int j) {
      C s{};
      for (int i = 0; i < n; ++i) s += gather(G, i, j) * P[i * ld + j] * u(K - 1)[i];
      dv[j] = s;
    });

    // Reverse sweep; dr_k goes to DRU's column k − 1 and to dr (contiguous).
    for (int k = K - 1; k >= 1; --k) {
      reverse_rescale(team, u(k), u(k - 1), du, dr, e);
      kdnn::impl::col_dot<ExecSpace>(team, n, P, ld, dr, [&](int j, C s) { dv[j] += s; });
      reverse_rescale(team, v(k), v(k - 1), dv, dc(k), e);
      kdnn::impl::col_dot<ExecSpace>(team, n, PT, ld, dc(k), [&](int i, C s) { du[i] += s; });
      Kokkos::parallel_for(lanes, [&](int i) {
        w.DRU[i * M + k - 1] = dr[i];
        w.DRU[i * M + K - 1 + k - 1] = u(k - 1)[i];
      });
    }

    // dP = G∘(u vᵀ) + DRU · [v_1 .. v_{K−1}, dc_1 .. dc_{K−1}], row by row,
    // into each matrix's dP (double).
    for (int i = 0; i < n; ++i) {
      const C ui = u(K - 1)[i];
      const auto store = [&](int j, C s) {
        const C value = gather(G, i, j) * ui * v(K - 1)[j] + s;
        for (int l = 0; l < count; ++l)
          w.dP[l * nld + i * ld + j] = double(kdnn::impl::lane(value, l));
      };
      if (M == 0) {
        Kokkos::parallel_for(lanes, [&](int j) { store(j, C{}); });
      } else {
        kdnn::impl::col_dot<ExecSpace>(team, M, n, v(1), n, w.DRU + i * M, store);
      }
    }
    for (int l = 0; l < count; ++l) {
      first_iteration_reverse(
          team, n, [&](int i, int j) { return double(this->at(X, b0 + l, i, j)); }, w.P1 + l * nld,
          w.dP + l * nld, ld, first_iteration_of(w, l), w.a + l * n, w.b + l * n,
          [&](int i, int j, double value) { this->at(dX, b0 + l, i, j) = T(value); });
    }
  }
};

}  // namespace kdnn::sinkhorn::impl
