#pragma once
// The fused attention backward's kernels. With P_ij = exp(s_ij − lse_i) the
// probabilities recomputed from the forward's log-sum-exp, Pd = dropout(P)
// and δ_i = dO_i·O_i (= Σ_j P_ij dP_ij, the softmax backward's row sum):
//   dV_j = Σ_i Pd_ij dO_i,   dP_ij = dropout(dO_i·V_j),
//   dS_ij = scale·P_ij (dP_ij − δ_i),
//   dK_j = Σ_i dS_ij Q_i,    dQ_i = Σ_j dS_ij K_j.
// Two kernels, each owning what it writes, so that no atomics are needed and
// every sum has a fixed order (bitwise reproducible): one team per key block
// accumulates dK, dV over all queries; one team per query block accumulates
// dQ over its visible keys. Each recomputes the scores tile by tile.
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "kdnn/attention/impl/fused_forward_kernel.hpp"

namespace kdnn::attention::impl {

/// What both backward kernels read and how they recompute one (query, key)
/// pair's probability and score gradient.
template <class ExecSpace, class T>
struct FusedBackwardData {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Tensor4<const T, ExecSpace> q, k, v, dout;  ///< [B,H,S,D], [B,H,Sk,D], [B,H,Sk,Dv], [B,H,S,Dv]
  Tensor3<const T, ExecSpace> lse, delta;     ///< [B, H, S]
  VisibleKeys<ExecSpace> visible;
  DropoutMask dropout;
  T scale = 1, keep_scale = 1;
  int bq = 1, bk = 1, level = 0;
  std::size_t scratch_bytes = 0;

  /// Pd (dropped-out probability) and dS for query row `qr` (D values) with
  /// gradient row `gr` (Dv), key row `kr`, value row `vr`; element index
  /// `index` in [B, H, S, Sk]; the row's lse and δ.
  KOKKOS_INLINE_FUNCTION void pair(const Member& team, const T* qr, const T* gr, const T* kr,
                                   const T* vr, std::uint64_t index, T row_lse, T row_delta, T& pd,
                                   T& ds) const {
    const int D = int(q.extent(3)), Dv = int(v.extent(3));
    T s = 0, dpd = 0;
    Kokkos::parallel_reduce(
        Kokkos::ThreadVectorRange(team, D), [&](int d, T& x) { x += qr[d] * kr[d]; }, s);
    Kokkos::parallel_reduce(
        Kokkos::ThreadVectorRange(team, Dv), [&](int d, T& x) { x += gr[d] * vr[d]; }, dpd);
    grads(s, dpd, index, row_lse, row_delta, pd, ds);
  }

  /// Pd and dS from the raw score s = q·k and dPd = dO·v of element `index`.
  KOKKOS_INLINE_FUNCTION void grads(T s, T dpd, std::uint64_t index, T row_lse, T row_delta, T& pd,
                                    T& ds) const {
    const T p = compat::exp(scale * s - row_lse);
    const bool keep = dropout.keep(index);
    pd = keep ? p * keep_scale : T(0);
    const T dp = keep ? dpd * keep_scale : T(0);
    ds = scale * p * (dp - row_delta);
  }
};

/// dK and dV: one team per (b, h, block of bk keys); team threads own keys.
template <class ExecSpace, class T>
struct FusedBackwardKVKernel : FusedBackwardData<ExecSpace, T> {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Tensor4<T, ExecSpace> dk, dv;

  struct Work {
    T *k, *v, *dk, *dv, *q, *g, *lse, *delta;
    int *first, *last;
  };
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int bq, int bk, int D,
                                           int Dv) {
    Work w;
    w.k = s.take<T>(std::size_t(bk) * D);
    w.v = s.take<T>(std::size_t(bk) * Dv);
    w.dk = s.take<T>(std::size_t(bk) * D);
    w.dv = s.take<T>(std::size_t(bk) * Dv);
    w.q = s.take<T>(std::size_t(bq) * D);
    w.g = s.take<T>(std::size_t(bq) * Dv);
    w.lse = s.take<T>(bq);
    w.delta = s.take<T>(bq);
    w.first = s.take<int>(bq);
    w.last = s.take<int>(bq);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const auto& in = *this;
    const int H = int(in.q.extent(1)), S = int(in.q.extent(2)), D = int(in.q.extent(3));
    const int Sk = int(in.k.extent(2)), Dv = int(in.v.extent(3));
    const int bq = in.bq, bk = in.bk;
    const int blocks = (Sk + bk - 1) / bk;
    const int block = team.league_rank() % blocks, bh = team.league_rank() / blocks;
    const int b = bh / H, h = bh % H, j0 = block * bk;
    const int cols = Sk - j0 < bk ? Sk - j0 : bk;
    kdnn::impl::ScratchCarver carver(
        kdnn::impl::team_scratch_base(team, in.level, in.scratch_bytes));
    const Work w = carve(carver, bq, bk, D, Dv);

    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols), [&](int c) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D), [&](int d) {
        w.k[c * D + d] = in.k(b, h, j0 + c, d);
        w.dk[c * D + d] = T(0);
      });
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv), [&](int d) {
        w.v[c * Dv + d] = in.v(b, h, j0 + c, d);
        w.dv[c * Dv + d] = T(0);
      });
    });
    for (int i0 = 0; i0 < S; i0 += bq) {
      const int rows = S - i0 < bq ? S - i0 : bq;
      team.team_barrier();  // the previous tile is done with
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D),
                             [&](int d) { w.q[r * D + d] = in.q(b, h, i0 + r, d); });
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv),
                             [&](int d) { w.g[r * Dv + d] = in.dout(b, h, i0 + r, d); });
        Kokkos::single(Kokkos::PerThread(team), [&] {
          in.visible.range(b, i0 + r, w.first[r], w.last[r]);
          w.lse[r] = in.lse(b, h, i0 + r);
          w.delta[r] = in.delta(b, h, i0 + r);
        });
      });
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols), [&](int c) {
        const int j = j0 + c;
        for (int r = 0; r < rows; ++r) {
          if (j < w.first[r] || j >= w.last[r]) continue;
          T pd, ds;
          in.pair(team, w.q + r * D, w.g + r * Dv, w.k + c * D, w.v + c * Dv,
                  (std::uint64_t(bh) * S + (i0 + r)) * Sk + j, w.lse[r], w.delta[r], pd, ds);
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv),
                               [&](int d) { w.dv[c * Dv + d] += pd * w.g[r * Dv + d]; });
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D),
                               [&](int d) { w.dk[c * D + d] += ds * w.q[r * D + d]; });
        }
      });
    }
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols), [&](int c) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D),
                           [&](int d) { dk(b, h, j0 + c, d) = w.dk[c * D + d]; });
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv),
                           [&](int d) { dv(b, h, j0 + c, d) = w.dv[c * Dv + d]; });
    });
  }
};

/// dQ: one team per (b, h, block of bq queries); team threads own queries.
template <class ExecSpace, class T>
struct FusedBackwardQKernel : FusedBackwardData<ExecSpace, T> {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Tensor4<T, ExecSpace> dq;

  struct Work {
    T *q, *g, *dq, *lse, *delta, *k, *kt, *vt, *s, *dp;
    int *first, *last;
  };
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int bq, int bk, int D,
                                           int Dv) {
    Work w;
    w.q = s.take<T>(std::size_t(bq) * D);
    w.g = s.take<T>(std::size_t(bq) * Dv);
    w.dq = s.take<T>(std::size_t(bq) * D);
    w.lse = s.take<T>(bq);
    w.delta = s.take<T>(bq);
    w.k = s.take<T>(std::size_t(bk) * D);
    w.kt = s.take<T>(std::size_t(D) * bk);
    w.vt = s.take<T>(std::size_t(Dv) * bk);
    w.s = s.take<T>(std::size_t(bq) * bk);
    w.dp = s.take<T>(std::size_t(bq) * bk);
    w.first = s.take<int>(bq);
    w.last = s.take<int>(bq);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const auto& in = *this;
    const int H = int(in.q.extent(1)), S = int(in.q.extent(2)), D = int(in.q.extent(3));
    const int Sk = int(in.k.extent(2)), Dv = int(in.v.extent(3));
    const int bq = in.bq, bk = in.bk;
    const int blocks = (S + bq - 1) / bq;
    const int block = team.league_rank() % blocks, bh = team.league_rank() / blocks;
    const int b = bh / H, h = bh % H, i0 = block * bq;
    const int rows = S - i0 < bq ? S - i0 : bq;
    kdnn::impl::ScratchCarver carver(
        kdnn::impl::team_scratch_base(team, in.level, in.scratch_bytes));
    const Work w = carve(carver, bq, bk, D, Dv);

    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D), [&](int d) {
        w.q[r * D + d] = in.q(b, h, i0 + r, d);
        w.dq[r * D + d] = T(0);
      });
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv),
                           [&](int d) { w.g[r * Dv + d] = in.dout(b, h, i0 + r, d); });
      Kokkos::single(Kokkos::PerThread(team), [&] {
        in.visible.range(b, i0 + r, w.first[r], w.last[r]);
        w.lse[r] = in.lse(b, h, i0 + r);
        w.delta[r] = in.delta(b, h, i0 + r);
      });
    });
    int lo = Sk, hi = 0;  // the union of the rows' key ranges
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, rows),
        [&](int r, int& x) {
          int f, e;
          in.visible.range(b, i0 + r, f, e);
          if (f < e && f < x) x = f;
        },
        Kokkos::Min<int>(lo));
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, rows),
        [&](int r, int& x) {
          int f, e;
          in.visible.range(b, i0 + r, f, e);
          if (f < e && e > x) x = e;
        },
        Kokkos::Max<int>(hi));
    for (int j0 = lo / bk * bk; j0 < hi; j0 += bk) {
      const int cols = Sk - j0 < bk ? Sk - j0 : bk;
      team.team_barrier();  // the previous tile is done with
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols), [&](int c) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D), [&](int d) {
          const T x = in.k(b, h, j0 + c, d);
          w.k[c * D + d] = x;
          w.kt[d * bk + c] = x;
        });
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv),
                             [&](int d) { w.vt[d * bk + c] = in.v(b, h, j0 + c, d); });
      });
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
        const int c0 = w.first[r] - j0 > 0 ? w.first[r] - j0 : 0;
        const int c1 = w.last[r] - j0 < cols ? w.last[r] - j0 : cols;
        if (c0 >= c1) return;
        // The row's scores and dO·V over the tile as axpys over keys (Kᵀ, Vᵀ
        // in scratch), then dS, then dQ_r += Σ_c dS_c K_c as axpys over D.
        T* s = w.s + r * bk;
        T* dp = w.dp + r * bk;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c0, c1), [&](int c) {
          s[c] = T(0);
          dp[c] = T(0);
        });
        for (int d = 0; d < D; ++d) {
          const T x = w.q[r * D + d];
          const T* kd = w.kt + d * bk;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c0, c1),
                               [&](int c) { s[c] += x * kd[c]; });
        }
        for (int d = 0; d < Dv; ++d) {
          const T x = w.g[r * Dv + d];
          const T* vd = w.vt + d * bk;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c0, c1),
                               [&](int c) { dp[c] += x * vd[c]; });
        }
        const std::uint64_t row = (std::uint64_t(bh) * S + (i0 + r)) * Sk + j0;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c0, c1), [&](int c) {
          T pd;
          in.grads(s[c], dp[c], row + c, w.lse[r], w.delta[r], pd, s[c]);
        });
        T* dq_row = w.dq + r * D;
        for (int c = c0; c < c1; ++c) {
          const T ds = s[c];
          const T* kc = w.k + c * D;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D),
                               [&](int d) { dq_row[d] += ds * kc[d]; });
        }
      });
    }
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D),
                           [&](int d) { dq(b, h, i0 + r, d) = w.dq[r * D + d]; });
    });
  }
};

}  // namespace kdnn::attention::impl
