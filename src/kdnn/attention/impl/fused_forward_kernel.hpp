#pragma once
// The fused ("flash") attention forward kernel: one team per (b, h, block of
// bq queries) streams the keys and values through team scratch in tiles of
// bk, keeping per query the running maximum m and sum l of the online
// softmax (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022):
//   m' = max(m, max_c s_c),  l' = l·e^{m−m'} + Σ_c e^{s_c−m'},
//   O' = O·e^{m−m'} + Σ_c dropout(e^{s_c−m'})·V_c,
// and at the end O/l and lse = m + log l (−inf for a row with no key).
// Scores s_c = scale·q·k_c exist one tile at a time: memory O(B·H·S·D).
// Each query row is one team thread's, its vector lanes split the tile's
// keys (scores) and the value features (O).
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "kdnn/attention/impl/visible_keys.hpp"
#include "kdnn/attention/types.hpp"
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/philox.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"

namespace kdnn::attention::impl {

/// Dropout's keep test for element k of [B, H, S, Sk] (dropout.hpp's rule).
struct DropoutMask {
  std::uint32_t threshold = 0, key0 = 0, key1 = 0, off0 = 0, off1 = 0;
  bool active = false;

  KOKKOS_INLINE_FUNCTION bool keep(std::uint64_t k) const {
    if (!active) return true;
    const std::uint64_t g = k / 4;
    const kdnn::impl::Philox4x32 words = kdnn::impl::philox4x32_10(
        {{std::uint32_t(g), std::uint32_t(g >> 32), off0, off1}}, key0, key1);
    return words.v[k % 4] >= threshold;
  }
};

template <class ExecSpace, class T>
struct FusedForwardKernel {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;

  Tensor4<const T, ExecSpace> q, k, v;  ///< [B, H, S, D], [B, H, Sk, D], [B, H, Sk, Dv]
  Tensor4<T, ExecSpace> o;              ///< [B, H, S, Dv]
  Tensor3<T, ExecSpace> lse;            ///< [B, H, S]
  VisibleKeys<ExecSpace> visible;
  DropoutMask dropout;
  T scale = 1, keep_scale = 1;
  T neg_inf = 0;  ///< −infinity (set on the host)
  int bq = 1, bk = 1, level = 0;
  std::size_t scratch_bytes = 0;

  struct Work {
    T *q, *k, *v, *p, *o, *m, *l;
    int *first, *last;
  };
  /// The team's scratch: its queries, one key tile (transposed, [D, bk]) and
  /// one value tile, the tile's probabilities, the output accumulator and the
  /// row statistics.
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int bq, int bk, int D,
                                           int Dv) {
    Work w;
    w.q = s.take<T>(std::size_t(bq) * D);
    w.k = s.take<T>(std::size_t(bk) * D);
    w.v = s.take<T>(std::size_t(bk) * Dv);
    w.p = s.take<T>(std::size_t(bq) * bk);
    w.o = s.take<T>(std::size_t(bq) * Dv);
    w.m = s.take<T>(bq);
    w.l = s.take<T>(bq);
    w.first = s.take<int>(bq);
    w.last = s.take<int>(bq);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const int H = int(q.extent(1)), S = int(q.extent(2)), D = int(q.extent(3));
    const int Sk = int(k.extent(2)), Dv = int(v.extent(3));
    const int blocks = (S + bq - 1) / bq;
    const int block = team.league_rank() % blocks, bh = team.league_rank() / blocks;
    const int b = bh / H, h = bh % H, i0 = block * bq;
    const int rows = S - i0 < bq ? S - i0 : bq;
    kdnn::impl::ScratchCarver carver(kdnn::impl::team_scratch_base(team, level, scratch_bytes));
    const Work w = carve(carver, bq, bk, D, Dv);

    // The block's queries, empty accumulators, and the keys each row sees.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D),
                           [&](int d) { w.q[r * D + d] = q(b, h, i0 + r, d); });
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv),
                           [&](int d) { w.o[r * Dv + d] = T(0); });
      Kokkos::single(Kokkos::PerThread(team), [&] {
        visible.range(b, i0 + r, w.first[r], w.last[r]);
        w.m[r] = neg_inf;
        w.l[r] = T(0);
      });
    });
    int lo = Sk, hi = 0;  // the union of the rows' key ranges
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, rows),
        [&](int r, int& x) {
          int f, e;
          visible.range(b, i0 + r, f, e);
          if (f < e && f < x) x = f;
        },
        Kokkos::Min<int>(lo));
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, rows),
        [&](int r, int& x) {
          int f, e;
          visible.range(b, i0 + r, f, e);
          if (f < e && e > x) x = e;
        },
        Kokkos::Max<int>(hi));
    team.team_barrier();

    for (int j0 = lo / bk * bk; j0 < hi; j0 += bk) {
      const int cols = Sk - j0 < bk ? Sk - j0 : bk;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols), [&](int c) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D),
                             [&](int d) { w.k[d * bk + c] = k(b, h, j0 + c, d); });
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv),
                             [&](int d) { w.v[c * Dv + d] = v(b, h, j0 + c, d); });
      });
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
        const int c0 = w.first[r] - j0 > 0 ? w.first[r] - j0 : 0;
        const int c1 = w.last[r] - j0 < cols ? w.last[r] - j0 : cols;
        if (c0 >= c1) return;
        T* p = w.p + r * bk;
        // Scores as axpys over the tile's keys (Kᵀ in scratch): contiguous,
        // vectorisable without reordering any sum.
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c0, c1), [&](int c) { p[c] = T(0); });
        for (int d = 0; d < D; ++d) {
          const T qd = w.q[r * D + d];
          const T* kd = w.k + d * bk;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, c0, c1),
                               [&](int c) { p[c] += qd * kd[c]; });
        }
        T tile_max = neg_inf;
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(team, c0, c1),
            [&](int c, T& x) {
              p[c] *= scale;
              if (p[c] > x) x = p[c];
            },
            Kokkos::Max<T>(tile_max));
        const T m_old = w.m[r];
        const T m_new = m_old > tile_max ? m_old : tile_max;
        const T alpha = compat::exp(m_old - m_new);  // 0 while m_old = −inf
        T sum = 0;
        const std::uint64_t row = (std::uint64_t(bh) * S + (i0 + r)) * Sk + j0;
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(team, c0, c1),
            [&](int c, T& x) {
              const T e = compat::exp(p[c] - m_new);
              x += e;
              p[c] = dropout.keep(row + c) ? e * keep_scale : T(0);
            },
            sum);
        T* o_row = w.o + r * Dv;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv),
                             [&](int d) { o_row[d] *= alpha; });
        for (int c = c0; c < c1; ++c) {  // O += p_c·V_c, axpys over the features
          const T pc = p[c];
          const T* vc = w.v + c * Dv;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv),
                               [&](int d) { o_row[d] += pc * vc[d]; });
        }
        Kokkos::single(Kokkos::PerThread(team), [&] {
          w.m[r] = m_new;
          w.l[r] = alpha * w.l[r] + sum;
        });
      });
      team.team_barrier();
    }

    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
      const T l = w.l[r];
      const T inv = l > T(0) ? T(1) / l : T(0);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv),
                           [&](int d) { o(b, h, i0 + r, d) = w.o[r * Dv + d] * inv; });
      Kokkos::single(Kokkos::PerThread(team),
                     [&] { lse(b, h, i0 + r) = l > T(0) ? w.m[r] + compat::log(l) : neg_inf; });
    });
  }
};

}  // namespace kdnn::attention::impl
