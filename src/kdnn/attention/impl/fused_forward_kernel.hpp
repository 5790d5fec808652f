// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The fused ("flash") attention forward kernel: one team per (b, h, block of
// bq queries) streams the keys and values through team scratch in tiles of
// bk, keeping per query the running maximum m and sum l of the online
// softmax (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022):
//   m' = max(m, max_c s_c),  l' = l·e^{m−m'} + Σ_c e^{s_c−m'},
//   O' = O·e^{m−m'} + Σ_c dropout(e^{s_c−m'})·V_c,
// and at the end O/l and lse = m + log l (−inf for a row with no key).
// Scores s_c = (scale·q)·k_c exist one tile at a time: memory O(B·H·S·D).
// A tile whose keys every query of the block sees skips the mask.
// Per key tile the team computes Sᵀ = K·Qᵀ and O += P·V with team_gemm
// (register tiles over the whole team) from row-major copies of the K and V
// tiles and Qᵀ (transposed once per block), and the softmax steps in
// between element by element; pad rows and columns of the tiles hold zeros.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "kdnn/attention/impl/fused_forward_rules.hpp"
#include "kdnn/attention/impl/row_blocks.hpp"
#include "kdnn/attention/impl/visible_keys.hpp"
#include "kdnn/attention/types.hpp"
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/exp_vectorisable.hpp"
#include "kdnn/core/impl/philox.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/team_gemm.hpp"
#include "kdnn/core/impl/team_sweep.hpp"
#include "kdnn/core/impl/team_tile_copy.hpp"
#include "kdnn/core/impl/team_work.hpp"

namespace kdnn::attention::impl {

template <class ExecSpace, class T>
struct FusedForwardKernel : FusedForwardData<ExecSpace, T> {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Tile = kdnn::impl::GemmTile<ExecSpace, T>;
  using Data = FusedForwardData<ExecSpace, T>;
  using Data::dropout;
  using Data::k;
  using Data::keep_scale;
  using Data::lse;
  using Data::neg_inf;
  using Data::o;
  using Data::q;
  using Data::scale;
  using Data::v;
  using Data::visible;

  int bq = 1, bk = 1;  ///< multiples of Tile::align

  struct Work {
    T *qt, *k, *v, *st, *o, *m, *alpha;
    double *l, *sum;  ///< the row sums, in double: lse and 1/l lose no digits to them
    int *first, *last;
  };
  /// The team's scratch: its queries transposed (Qᵀ [D, bq]), one key tile
  /// [bk, D], one value tile [bk, Dv'] (Dv' = Dv padded to
  /// the GEMM tile), the tile's scores transposed (Sᵀ [bk, bq], later the
  /// probabilities), the output accumulator [bq, Dv'] and the row statistics.
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int bq, int bk, int D,
                                           int Dv) {
    const std::size_t dv = Tile::pad(Dv);
    Work w;
    w.qt = s.take<T>(std::size_t(D) * bq);
    w.k = s.take<T>(std::size_t(bk) * D);
    w.v = s.take<T>(bk * dv);
    w.st = s.take<T>(std::size_t(bk) * bq);
    w.o = s.take<T>(bq * dv);
    w.m = s.take<T>(bq);
    w.l = s.take<double>(bq);
    w.alpha = s.take<T>(bq);
    w.sum = s.take<double>(bq);
    w.first = s.take<int>(bq);
    w.last = s.take<int>(bq);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    this->work.for_each(team, [&](int item, void* scratch) { one_block(team, item, scratch); });
  }

  /// Work item `item` (a query block), in the team's scratch.
  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    const RowBlock qb = this->blocks(item);
    const AlibiRow<T> bias = this->visible.template alibi<T>(qb.b, qb.h);
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver, bq, bk, int(q.extent(3)), int(v.extent(3)));
    start_rows(team, qb, w);
    const auto seen = visible.team_bounds(team, qb.b, qb.start, qb.count);
    for (int j0 = seen.lo / bk * bk; j0 < seen.hi; j0 += bk) {
      // A tile every row sees whole has finite scores only (pad rows score
      // 0), so it needs neither the mask nor the test for −inf.
      const int cols = k.rows(qb.b) - j0 < bk ? k.rows(qb.b) - j0 : bk;
      const bool unmasked = seen.common_lo <= j0 && j0 + cols <= seen.common_hi;
      one_tile(team, qb, w, bias, j0, cols, unmasked);
    }
    team.team_barrier();
    const int Dv = int(v.extent(3)), dvp = Tile::pad(Dv);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, qb.count), [&](int r) {
      const auto end = this->finish(qb.h, w.m[r], w.l[r]);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv), [&](int d) {
        o(qb.b, qb.h, qb.start + r, d) = w.o[r * dvp + d] * end.inv;
      });
      Kokkos::single(Kokkos::PerThread(team), [&] { lse(qb.b, qb.h, qb.start + r) = end.lse; });
    });
  }

  /// The block's queries, scaled (pad rows zero, seeing no key), and empty
  /// accumulators.
  KOKKOS_FORCEINLINE_FUNCTION void start_rows(const Member& team, const RowBlock& qb,
                                              const Work& w) const {
    const int D = int(q.extent(3)), dvp = Tile::pad(int(v.extent(3)));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, bq), [&](int r) {
      const bool live = r < qb.count;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D), [&](int d) {
        w.qt[d * bq + r] = live ? scale * q(qb.b, qb.h, qb.start + r, d) : T(0);
      });
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, dvp),
                           [&](int d) { w.o[r * dvp + d] = T(0); });
      Kokkos::single(Kokkos::PerThread(team), [&] {
        if (live) {
          visible.range(qb.b, qb.start + r, w.first[r], w.last[r]);
        } else {
          w.first[r] = w.last[r] = 0;
        }
        w.m[r] = neg_inf;
        w.l[r] = 0.0;
      });
    });
  }

  /// Keys j0 … j0 + cols − 1 (`unmasked`: every row sees them all): the
  /// scores, the online rescale of the rows' statistics and O += P·V.
  KOKKOS_FORCEINLINE_FUNCTION void one_tile(const Member& team, const RowBlock& qb, const Work& w,
                                            const AlibiRow<T>& bias, int j0, int cols,
                                            bool unmasked) const {
    const int D = int(q.extent(3)), Dv = int(v.extent(3)), dvp = Tile::pad(Dv);
    const int b = qb.b, hk = this->kv_head(qb.h), i0 = qb.start;
    team.team_barrier();  // the previous tile is done with
    kdnn::impl::team_copy_rows(
        team, [&](int c) { return &k(b, hk, j0 + c, 0); }, cols, bk, D, D, w.k, D);
    kdnn::impl::team_copy_rows(
        team, [&](int c) { return &v(b, hk, j0 + c, 0); }, cols, bk, Dv, dvp, w.v, dvp);
    team.team_barrier();
    // Sᵀ = K·(scale·Q)ᵀ [bk, bq]: the tile's scores, one key per row.
    kdnn::impl::team_gemm<ExecSpace>(team, bk, bq, D, kdnn::impl::GemmA<T>::rows(w.k, D), w.qt, bq,
                                     w.st, bq, false);
    team.team_barrier();
    // −inf where the mask hides the pair; the rows' new maxima m' (in α
    // until the rescale factors replace them).
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, bq), [&](int r) { w.alpha[r] = w.m[r]; });
    team.team_barrier();
    // The cap's test is taken out of the loops (without a cap, no call to
    // tanh in them), so that a host vectorises them.
    const auto scores = [&](auto capped) {
      using Capped = decltype(capped);
      if (unmasked) {
        kdnn::impl::team_sweep<ExecSpace>(team, cols, bq, [&](int c, int r) {
          T& x = w.st[c * bq + r];
          x = this->template score<Capped::value>(x, true, bias, i0 + r, j0 + c);
          w.alpha[r] = x > w.alpha[r] ? x : w.alpha[r];
        });
      } else {
        kdnn::impl::team_sweep<ExecSpace>(team, cols, bq, [&](int c, int r) {
          const int j = j0 + c;
          T& x = w.st[c * bq + r];
          x = this->template score<Capped::value>(x, (j >= w.first[r]) & (j < w.last[r]), bias,
                                                  i0 + r, j);
          w.alpha[r] = x > w.alpha[r] ? x : w.alpha[r];
        });
      }
    };
    if (this->softcap.cap != T(0)) {
      scores(std::true_type{});
    } else {
      scores(std::false_type{});
    }
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, bq), [&](int r) {
      const T m_new = w.alpha[r];
      w.alpha[r] = this->rescale(w.m[r], m_new);
      w.m[r] = m_new;
      w.sum[r] = 0.0;
    });
    team.team_barrier();
    probabilities(team, qb, w, j0, cols, unmasked);
    team.team_barrier();
    // O += P·V over the tile's live keys.
    kdnn::impl::team_gemm<ExecSpace>(team, bq, dvp, cols, kdnn::impl::GemmA<T>::k_major(w.st, bq),
                                     w.v, dvp, w.o, dvp, true);
  }

  /// The tile's probabilities and their row sums; the rows' rescale of O and
  /// l; dropout.
  KOKKOS_FORCEINLINE_FUNCTION void probabilities(const Member& team, const RowBlock& qb,
                                                 const Work& w, int j0, int cols,
                                                 bool unmasked) const {
    const int dvp = Tile::pad(int(v.extent(3)));
    if (unmasked) {
      kdnn::impl::team_sweep<ExecSpace>(team, cols, bq, [&](int c, int r) {
        T& x = w.st[c * bq + r];
        x = kdnn::impl::exp_vectorisable(x - w.m[r]);  // probability(), every score visible
        w.sum[r] += double(x);
      });
    } else {
      kdnn::impl::team_sweep<ExecSpace>(team, cols, bq, [&](int c, int r) {
        T& x = w.st[c * bq + r];
        x = this->probability(x, w.m[r]);
        w.sum[r] += double(x);
      });
    }
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, bq), [&](int r) {
      const T alpha = w.alpha[r];
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, dvp),
                           [&](int d) { w.o[r * dvp + d] *= alpha; });
      Kokkos::single(Kokkos::PerThread(team), [&] { w.l[r] = double(alpha) * w.l[r] + w.sum[r]; });
    });
    if (dropout.active) {
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols), [&](int c) {
        T* sc = w.st + c * bq;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, qb.count), [&](int r) {
          sc[r] = this->dropped(sc[r], this->keeps(qb.bh, qb.start + r, j0 + c));
        });
      });
    }
  }
};

}  // namespace kdnn::attention::impl
