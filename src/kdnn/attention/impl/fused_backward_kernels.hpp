// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The fused attention backward's kernels. With P_ij = exp(s_ij − lse_i) the
// probabilities recomputed from the forward's log-sum-exp, Pd = dropout(P)
// and δ_i = dO_i·O_i (= Σ_j P_ij dP_ij, the softmax backward's row sum):
//   dV_j = Σ_i Pd_ij dO_i,   dP_ij = dropout(dO_i·V_j),
//   dS'_ij = P_ij (dP_ij − δ_i)   (dS = scale·dS', the scores' gradient),
//   dK_j = Σ_i dS'_ij (scale·Q_i),    dQ_i = scale·Σ_j dS'_ij K_j.
// The scores are recomputed exactly as the forward computed them,
// s_ij = (scale·Q_i)·K_j with the same summation order, so that they are
// bitwise the forward's: for a large |scale| the rounding of scale·(Q_i·K_j)
// instead would be a large error in the exponent (eps·|s|). With one-hot
// rows (huge scale) P is then exactly 1 at the maximum (lse = m there) and 0
// elsewhere, and dP − δ exactly 0 (O = V_argmax, δ and dP summed in the same
// order), so dS' = 0 as in the unfused path, however large the scale.
// Two kernels, each owning what it writes, so that no atomics are needed and
// every sum has a fixed order (bitwise reproducible): one team per key block
// accumulates dK, dV over the query tiles; one team per query block
// accumulates dQ over the key tiles. Each recomputes the scores tile by tile
// with team_gemm (A row-major or k-major, B and C row-major): the tiles
// streamed in the inner loop are row-major copies, and only the operands a
// team keeps for its whole loop are transposed (once); pad rows and columns
// of the tiles hold zeros.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "kdnn/attention/impl/fused_backward_data.hpp"
#include "kdnn/attention/impl/fused_forward_kernel.hpp"
#include "kdnn/attention/impl/row_blocks.hpp"
#include "kdnn/core/impl/team_tile_copy.hpp"
#include "kdnn/core/impl/team_work.hpp"

namespace kdnn::attention::impl {

/// A tile of raw scores and one of dO·Vᵀ (later Pd and dS), addressed by
/// (query r, key c): row-major [queries, keys], or transposed.
template <class T, bool Transposed>
struct PairTiles {
  T *scores, *dpd;
  int ld;
  KOKKOS_FORCEINLINE_FUNCTION T& s(int r, int c) const {
    return scores[Transposed ? c * ld + r : r * ld + c];
  }
  KOKKOS_FORCEINLINE_FUNCTION T& dp(int r, int c) const {
    return dpd[Transposed ? c * ld + r : r * ld + c];
  }
};

/// dK and dV of key blocks, and with `with_dq` dQ as well. A team takes one
/// key block of one head (per_key_block; FusedBackwardQKernel then gives dQ)
/// or, with_dq, every key block of one head in order (per_head): for each
/// block it walks the query tiles that see it, and with dQ that is five tile
/// products per pair of tiles instead of the two kernels' seven. dK and dV
/// of a block accumulate in scratch; dQ accumulates in `dq` itself (the team
/// owns the head), tile by tile in key order, so every sum keeps a fixed
/// order, and is scaled once at the end.
template <class ExecSpace, class T>
struct FusedBackwardKVKernel : FusedBackwardData<ExecSpace, T> {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Tile = kdnn::impl::GemmTile<ExecSpace, T>;
  using GemmA = kdnn::impl::GemmA<T>;
  kdnn::impl::StridedRows4<T> dq, dk, dv;  ///< dq only with_dq
  bool with_dq = false;

  struct Work {
    T *kt, *vt, *k, *dk, *dv, *q, *g, *p, *dp, *dq, *lse, *delta;
    int *first, *last;
  };
  /// Per key block: Kᵀ, Vᵀ, K and the dK, dV accumulators; per query tile:
  /// scale·Q, dO, the scores (then Pd), dO·Vᵀ (then dS'), and for dQ the
  /// tile's dQ/scale.
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int bq, int bk, int D,
                                           int Dv) {
    const std::size_t dp = Tile::pad(D), dvp = Tile::pad(Dv);
    Work w;
    w.kt = s.take<T>(std::size_t(D) * bk);
    w.vt = s.take<T>(std::size_t(Dv) * bk);
    w.k = s.take<T>(bk * dp);
    w.dk = s.take<T>(bk * dp);
    w.dv = s.take<T>(bk * dvp);
    w.q = s.take<T>(bq * dp);
    w.g = s.take<T>(bq * dvp);
    w.p = s.take<T>(std::size_t(bq) * bk);
    w.dp = s.take<T>(std::size_t(bq) * bk);
    w.dq = s.take<T>(bq * dp);
    w.lse = s.take<T>(bq);
    w.delta = s.take<T>(bq);
    w.first = s.take<int>(bq);
    w.last = s.take<int>(bq);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    this->work.for_each(team, [&](int item, void* scratch) { one_block(team, item, scratch); });
  }

  /// Work item `item` (a block), in the team's scratch.
  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    const auto& in = *this;
    const int H = int(in.q.extent(1)), D = int(in.q.extent(3)), Dv = int(in.v.extent(3));
    const int dpad = Tile::pad(D), dvp = Tile::pad(Dv);
    const int bq = in.bq, bk = in.bk;
    // One team per head (with dQ: every key) or per block of keys.
    const RowBlock kb =
        with_dq ? RowBlock{item / H, item % H, item, 0, in.k.rows(item / H)} : in.blocks(item);
    const int bh = kb.bh, b = kb.b, h = kb.h, hk = in.kv_head(h);
    const int queries = in.q.rows(b);  // the entry's queries
    const int j_begin = kb.start, j_end = kb.start + kb.count;
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver, bq, bk, D, Dv);

    // dQ is summed in place over the key blocks, from zero or (add_dq) from
    // its values on entry.
    if (with_dq && !in.add_dq)
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, queries), [&](int i) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D),
                             [&](int d) { dq(b, h, i, d) = T(0); });
      });
    for (int j0 = j_begin; j0 < j_end; j0 += bk) {
      const int cols = j_end - j0 < bk ? j_end - j0 : bk;
      team.team_barrier();  // the previous block is done with
      const auto key = [&](const auto& view) {
        return [&](int c) { return &view(b, hk, j0 + c, 0); };
      };
      kdnn::impl::team_copy_transposed(team, key(in.k), cols, bk, D, w.kt, bk);
      kdnn::impl::team_copy_transposed(team, key(in.v), cols, bk, Dv, w.vt, bk);
      // scale·K: dQ's factor (dQ = scale·dS'·K), applied before the sum.
      kdnn::impl::team_copy_rows(team, key(in.k), cols, bk, D, dpad, w.k, dpad, in.scale);
      Kokkos::parallel_for(Kokkos::TeamVectorRange(team, bk * dpad),
                           [&](int x) { w.dk[x] = T(0); });
      Kokkos::parallel_for(Kokkos::TeamVectorRange(team, bk * dvp), [&](int x) { w.dv[x] = T(0); });
      for (int i0 = 0; i0 < queries; i0 += bq) {
        const int rows = queries - i0 < bq ? queries - i0 : bq;
        team.team_barrier();  // the previous tile is done with
        int any = 0;
        this->load_rows(team, b, h, i0, rows, w.first, w.last, w.lse, w.delta, j0, j0 + cols, any);
        if (!any) continue;  // no query of the tile sees these keys
        // Whole tiles whose pairs are all seen skip the mask.
        const auto seen = in.visible.team_bounds(team, b, i0, rows);
        const bool unmasked =
            rows == bq && cols == bk && seen.common_lo <= j0 && j0 + cols <= seen.common_hi;
        const auto query = [&](const auto& view) {
          return [&](int r) { return &view(b, h, i0 + r, 0); };
        };
        kdnn::impl::team_copy_rows(team, query(in.q), rows, bq, D, dpad, w.q, dpad, in.scale);
        kdnn::impl::team_copy_rows(team, query(in.dout), rows, bq, Dv, dvp, w.g, dvp);
        if (with_dq) kdnn::impl::team_copy_rows(team, query(dq), rows, bq, D, dpad, w.dq, dpad);
        team.team_barrier();
        // The scores (scale·Q)·Kᵀ and dO·Vᵀ [bq, bk].
        kdnn::impl::team_gemm<ExecSpace>(team, bq, bk, D, GemmA::rows(w.q, dpad), w.kt, bk, w.p, bk,
                                         false);
        kdnn::impl::team_gemm<ExecSpace>(team, bq, bk, Dv, GemmA::rows(w.g, dvp), w.vt, bk, w.dp,
                                         bk, false);
        team.team_barrier();
        const auto sweep = [&](const auto& f) {
          kdnn::impl::team_sweep<ExecSpace>(team, bq, bk, f);
        };
        const PairTiles<T, false> at{w.p, w.dp, bk};
        this->tile_grads(sweep, bh, i0, j0, unmasked, w.first, w.last, w.lse, w.delta, at);
        team.team_barrier();
        // dV += Pdᵀ·dO and dK += dS'ᵀ·(scale·Q) over the tile's live queries.
        kdnn::impl::team_gemm<ExecSpace>(team, bk, dvp, rows, GemmA::k_major(w.p, bk), w.g, dvp,
                                         w.dv, dvp, true);
        kdnn::impl::team_gemm<ExecSpace>(team, bk, dpad, rows, GemmA::k_major(w.dp, bk), w.q, dpad,
                                         w.dk, dpad, true);
        if (!with_dq) continue;
        // dQ += dS'·(scale·K).
        kdnn::impl::team_gemm<ExecSpace>(team, bq, dpad, cols, GemmA::rows(w.dp, bk), w.k, dpad,
                                         w.dq, dpad, true);
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D),
                               [&](int d) { dq(b, h, i0 + r, d) = w.dq[r * dpad + d]; });
        });
      }
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols), [&](int c) {
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D), [&](int d) {
          this->store(in.add_dkv, dk(b, h, j0 + c, d), w.dk[c * dpad + d]);
        });
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, Dv), [&](int d) {
          this->store(in.add_dkv, dv(b, h, j0 + c, d), w.dv[c * dvp + d]);
        });
      });
    }
  }
};

/// dQ: one team per (b, h, block of bq queries).
template <class ExecSpace, class T>
struct FusedBackwardQKernel : FusedBackwardData<ExecSpace, T> {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Tile = kdnn::impl::GemmTile<ExecSpace, T>;
  using GemmA = kdnn::impl::GemmA<T>;
  kdnn::impl::StridedRows4<T> dq;

  struct Work {
    T *qt, *gt, *dq, *lse, *delta, *k, *v, *st, *dpt;
    int *first, *last;
  };
  /// Once per team: (scale·Q)ᵀ [D, bq], dOᵀ [Dv, bq], the dQ/scale accumulator [bq, D']
  /// and the rows' data; per key tile: K [bk, D'], V [bk, Dv] and the
  /// transposed scores and V·dOᵀ [bk, bq] (then Pd and dS).
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int bq, int bk, int D,
                                           int Dv) {
    const std::size_t dp = Tile::pad(D);
    Work w;
    w.qt = s.take<T>(std::size_t(D) * bq);
    w.gt = s.take<T>(std::size_t(Dv) * bq);
    w.dq = s.take<T>(bq * dp);
    w.lse = s.take<T>(bq);
    w.delta = s.take<T>(bq);
    w.k = s.take<T>(bk * dp);
    w.v = s.take<T>(std::size_t(bk) * Dv);
    w.st = s.take<T>(std::size_t(bk) * bq);
    w.dpt = s.take<T>(std::size_t(bk) * bq);
    w.first = s.take<int>(bq);
    w.last = s.take<int>(bq);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    this->work.for_each(team, [&](int item, void* scratch) { one_block(team, item, scratch); });
  }

  /// Work item `item` (a block), in the team's scratch.
  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    const auto& in = *this;
    const int D = int(in.q.extent(3)), Dv = int(in.v.extent(3)), dpad = Tile::pad(D);
    const int bq = in.bq, bk = in.bk;
    const RowBlock qb = in.blocks(item);
    const int b = qb.b, h = qb.h, bh = qb.bh, hk = in.kv_head(h), i0 = qb.start, rows = qb.count;
    const int keys = in.k.rows(b);  // the entry's keys
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver, bq, bk, D, Dv);

    int any = 0;
    this->load_rows(team, b, h, i0, rows, w.first, w.last, w.lse, w.delta, 0, keys, any);
    const auto query = [&](const auto& view) {
      return [&](int r) { return &view(b, h, i0 + r, 0); };
    };
    kdnn::impl::team_copy_transposed(team, query(in.q), rows, bq, D, w.qt, bq, in.scale);
    kdnn::impl::team_copy_transposed(team, query(in.dout), rows, bq, Dv, w.gt, bq);
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, bq * dpad), [&](int x) { w.dq[x] = T(0); });
    const auto seen = in.visible.team_bounds(team, b, i0, rows);
    for (int j0 = seen.lo / bk * bk; j0 < seen.hi; j0 += bk) {
      const int cols = keys - j0 < bk ? keys - j0 : bk;
      team.team_barrier();  // the previous tile is done with
      const auto key = [&](const auto& view) {
        return [&](int c) { return &view(b, hk, j0 + c, 0); };
      };
      kdnn::impl::team_copy_rows(team, key(in.k), cols, bk, D, dpad, w.k, dpad);
      kdnn::impl::team_copy_rows(team, key(in.v), cols, bk, Dv, Dv, w.v, Dv);
      team.team_barrier();
      // Sᵀ = K·(scale·Q)ᵀ (the forward's product) and V·dOᵀ [bk, bq], then
      // Pdᵀ and dS'ᵀ in their place.
      kdnn::impl::team_gemm<ExecSpace>(team, bk, bq, D, GemmA::rows(w.k, dpad), w.qt, bq, w.st, bq,
                                       false);
      kdnn::impl::team_gemm<ExecSpace>(team, bk, bq, Dv, GemmA::rows(w.v, Dv), w.gt, bq, w.dpt, bq,
                                       false);
      team.team_barrier();
      const auto sweep = [&](const auto& f) {
        kdnn::impl::team_sweep<ExecSpace>(team, bk, bq, [&](int c, int r) { f(r, c); });
      };
      const PairTiles<T, true> at{w.st, w.dpt, bq};
      // Whole tiles whose pairs are all seen skip the mask.
      const bool unmasked =
          rows == bq && cols == bk && seen.common_lo <= j0 && j0 + cols <= seen.common_hi;
      this->tile_grads(sweep, bh, i0, j0, unmasked, w.first, w.last, w.lse, w.delta, at);
      team.team_barrier();
      // dQ/scale += dS'·K over the tile's live keys.
      kdnn::impl::team_gemm<ExecSpace>(team, bq, dpad, cols, GemmA::k_major(w.dpt, bq), w.k, dpad,
                                       w.dq, dpad, true);
    }
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, D), [&](int d) {
        this->store(in.add_dq, dq(b, h, i0 + r, d), in.scale * w.dq[r * dpad + d]);
      });
    });
  }
};

}  // namespace kdnn::attention::impl
