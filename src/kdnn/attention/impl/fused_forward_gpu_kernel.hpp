// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The fused attention forward, GPU form (kdnn::KernelForm::gpu), for a
// compile-time pair of head sizes D (queries, keys) and Dv (values) in
// {32, 64, 128, 256}: FlashAttention-2's
// forward on SIMT threads. A team owns a block of BQ queries and streams the
// keys and values through level-0 scratch in tiles of BK; the online softmax
// is FusedForwardKernel's (fused_forward_kernel.hpp), step for step.
//
// The team's NT threads form a grid of RG row groups × CG column groups.
// Thread (g, c) owns RM query rows (g·RM …) and, per key tile,
//  * a micro-tile of RM × RN scores in registers, keys c·RN …: each step of
//    the D loop reads RM values of Qᵀ and RN of Kᵀ from scratch (contiguous
//    runs, broadcast to the threads that share them) for RM·RN products;
//  * a micro-tile of RM × DVC outputs in registers, columns c·DVC …
//    (DVC = DV / CG): each key of the tile reads RM probabilities and DVC
//    values of V for RM·DVC products;
//  * the running maximum m and sum l of its rows (the CG threads of a row
//    hold the same values: each combines the same partials in the same
//    order).
// The rows' maxima and sums over a tile are combined through scratch (one
// partial per row and column group), not atomics: the results do not
// depend on timing. Every index into scratch and registers is a thread's
// offset plus compile-time steps; the scratch fits on-chip (at most 44 KiB,
// tested against CUDA's 48 KiB) for float and double, so no launch of this
// form takes a team workspace on a GPU.
//
// Numerics are FusedForwardKernel's (the same masks, dropout elements and
// exp, l in double, O·α + P·V per tile, every product summed in team_gemm's
// blocks of 16): the scores are bitwise the host form's (which the backward
// relies on), l and P·V are summed over other tiles, so the two forms agree
// to rounding.
//
// On a GPU backend the team has NT threads and a thread's registers are its
// own; on a host the team is one thread that plays the NT threads one after
// another, so their registers are kept side by side (ThreadRegisters,
// core/impl/register_tile.hpp, as the products of the micro-tiles).
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>

#include "kdnn/attention/impl/fused_forward_rules.hpp"
#include "kdnn/attention/impl/row_blocks.hpp"
#include "kdnn/attention/impl/visible_keys.hpp"
#include "kdnn/attention/types.hpp"
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/compiled_sizes.hpp"
#include "kdnn/core/impl/exp_vectorisable.hpp"
#include "kdnn/core/impl/register_team.hpp"
#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/team_gemm.hpp"
#include "kdnn/core/impl/team_work.hpp"
#include "kdnn/core/impl/unroll.hpp"

namespace kdnn::attention::impl {

/// The head sizes the forward's GPU form is compiled for, each of D and Dv.
using FlashHeadSizes = kdnn::impl::CompiledSizes<32, 64, 128, 256>;

/// Block sizes and the thread grid of the GPU form for T, D and DV: BQ
/// queries per team, BK keys per tile, RM × RN scores per thread. Chosen by
/// the wider head W = max(D, DV), so that the team's scratch (Qᵀ, a K or V
/// tile, Pᵀ and the row partials) stays within a CUDA team's 48 KiB of
/// level 0 and a thread keeps at most about 32 outputs in registers.
template <class T, int D, int DV>
struct FlashShape {
  static constexpr bool wide = sizeof(T) > 4;  // double: half the scratch per element
  static constexpr int W = std::max(D, DV);
  static constexpr int BQ = W <= 64    ? (wide ? 32 : 64)
                            : W == 128 ? (wide ? 16 : 32)
                                       : (wide ? 8 : 16);
  static constexpr int BK = W <= 64 ? 32 : W == 128 ? (wide ? 16 : 32) : (wide ? 8 : 16);
  static constexpr int RM = BQ >= 32 ? BQ / 16 : 1;
  static constexpr int RN = BK / 8;
  static constexpr int RG = BQ / RM;   ///< row groups
  static constexpr int CG = BK / RN;   ///< column groups (8)
  static constexpr int NT = RG * CG;   ///< threads per team
  static constexpr int DVC = DV / CG;  ///< output columns per thread
  static_assert(BQ % RM == 0 && BK % RN == 0 && DV % CG == 0 && D % kdnn::impl::kGemmKBlock == 0,
                "FlashShape: sizes must divide");
};

template <class ExecSpace, class T, int D, int DV>
struct FusedForwardGpuKernel : FusedForwardData<ExecSpace, T>,
                               kdnn::impl::RegisterTeam<FusedForwardGpuKernel<ExecSpace, T, D, DV>,
                                                        ExecSpace, FlashShape<T, D, DV>::NT> {
  using Shape = FlashShape<T, D, DV>;
  using Team = kdnn::impl::RegisterTeam<FusedForwardGpuKernel, ExecSpace, Shape::NT>;
  using Team::kPrivate;
  using Team::threads;
  using typename Team::Member;
  static constexpr int BQ = Shape::BQ, BK = Shape::BK, RM = Shape::RM, RN = Shape::RN,
                       CG = Shape::CG, NT = Shape::NT, DVC = Shape::DVC;
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
  using Data::work;

  /// Qᵀ [D, BQ] (scaled), a K tile transposed (Kᵀ [D, BK]) or a V tile
  /// ([BK, DV]) in one buffer, Pᵀ [BK, BQ], and per row and column group the
  /// partial maxima (T) and sums (double) [CG, BQ].
  struct Work {
    T *qt, *kv, *pt, *part_max;
    double* part_sum;
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s) {
    Work w;
    w.qt = s.take<T>(D * BQ);
    w.kv = s.take<T>(Shape::W * BK);
    w.pt = s.take<T>(BK * BQ);
    w.part_max = s.take<T>(CG * BQ);
    w.part_sum = s.take<double>(CG * BQ);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    const RowBlock qb = this->blocks(item);
    const int b = qb.b, h = qb.h, bh = qb.bh, hk = this->kv_head(h), i0 = qb.start, rows = qb.count;
    const int keys = k.rows(b);  // the entry's keys
    // The call's head sizes, at most D and DV: the columns past them are
    // zero in the tiles and not stored (a compiled size rounded up to).
    const int d_qk = int(q.extent(3)), d_v = int(v.extent(3));
    const AlibiRow<T> bias = this->visible.template alibi<T>(b, h);
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver);

    // Per thread, across the block's barriers: its rows' visible keys,
    // running maxima, sums and rescale factors, its scores and outputs.
    kdnn::impl::ThreadRegisters<int, NT, 2 * RM, kPrivate> range;  // first, last
    kdnn::impl::ThreadRegisters<T, NT, 2 * RM, kPrivate> m_alpha;  // m, α
    kdnn::impl::ThreadRegisters<double, NT, RM, kPrivate> l;
    kdnn::impl::ThreadRegisters<T, NT, RM * RN, kPrivate> s;
    kdnn::impl::ThreadRegisters<T, NT, RM * DVC, kPrivate> acc;

    start_rows(team, qb, w, range, m_alpha, l, acc);

    const auto seen = visible.team_bounds(team, b, i0, rows);
    for (int j0 = seen.lo / BK * BK; j0 < seen.hi; j0 += BK) {
      const int cols = keys - j0 < BK ? keys - j0 : BK;
      team.team_barrier();  // the previous tile is done with kv and pt
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * D), [&](int e) {
        const int c = e / D, d = e % D;
        w.kv[d * BK + c] = c < cols && d < d_qk ? k(b, hk, j0 + c, d) : T(0);
      });
      team.team_barrier();

      tile_scores(team, qb, w, bias, j0, range, m_alpha, s);
      team.team_barrier();

      // The rows' new maxima, α = e^{m−m'}, the probabilities (dropped ones
      // zero) to Pᵀ and the thread's partial row sums.
      threads(team, [&](int t) {
        const int r0 = (t / CG) * RM, c0 = (t % CG) * RN;
        T* st = s(t);
        KDNN_IMPL_UNROLL
        for (int i = 0; i < RM; ++i) {
          const int r = r0 + i;
          T m_new = w.part_max[r];
          KDNN_IMPL_UNROLL
          for (int g = 1; g < CG; ++g) {
            const T x = w.part_max[g * BQ + r];
            m_new = x > m_new ? x : m_new;
          }
          T& m = m_alpha(t)[i];
          m_alpha(t)[RM + i] = this->rescale(m, m_new);
          m = m_new;
          double sum = 0.0;
          KDNN_IMPL_UNROLL
          for (int j = 0; j < RN; ++j) {
            const T p = this->probability(st[i * RN + j], m_new);
            sum += double(p);
            const bool keep = r >= rows || this->keeps(bh, i0 + r, j0 + c0 + j);
            w.pt[(c0 + j) * BQ + r] = dropout.active ? this->dropped(p, keep) : p;
          }
          w.part_sum[(t % CG) * BQ + r] = sum;
        }
      });
      team.team_barrier();  // every thread is done reading Kᵀ
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * DV), [&](int e) {
        const int c = e / DV, d = e % DV;
        w.kv[c * DV + d] = c < cols && d < d_v ? v(b, hk, j0 + c, d) : T(0);
      });
      team.team_barrier();

      // l = α·l + the tile's sum; O = O·α + P·V over the tile's keys.
      threads(team, [&](int t) {
        const int r0 = (t / CG) * RM, d0 = (t % CG) * DVC;
        T* out = acc(t);
        T pv[RM * DVC];
        kdnn::impl::register_tile_product<RM, DVC, BK>(w.pt + r0, BQ, 1, w.kv + d0, DV, 1, pv);
        KDNN_IMPL_UNROLL
        for (int i = 0; i < RM; ++i) {
          const int r = r0 + i;
          const T alpha = m_alpha(t)[RM + i];
          double sum = w.part_sum[r];
          KDNN_IMPL_UNROLL
          for (int g = 1; g < CG; ++g) sum += w.part_sum[g * BQ + r];
          l(t)[i] = double(alpha) * l(t)[i] + sum;
          KDNN_IMPL_UNROLL
          for (int j = 0; j < DVC; ++j)
            out[i * DVC + j] = out[i * DVC + j] * alpha + pv[i * DVC + j];
        }
      });
    }

    finish_rows(team, qb, m_alpha, l, acc);
  }

  /// Qᵀ, scaled (pad rows and columns past the call's D zero); the thread's
  /// rows' visible keys, m = −inf and l = 0; empty accumulators.
  template <class Range, class MAlpha, class L, class Acc>
  KOKKOS_FORCEINLINE_FUNCTION void start_rows(const Member& team, const RowBlock& qb, const Work& w,
                                              Range& range, MAlpha& m_alpha, L& l, Acc& acc) const {
    const int b = qb.b, h = qb.h, i0 = qb.start, rows = qb.count, d_qk = int(q.extent(3));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BQ * D), [&](int e) {
      const int r = e / D, d = e % D;
      w.qt[d * BQ + r] = r < rows && d < d_qk ? scale * q(b, h, i0 + r, d) : T(0);
    });
    threads(team, [&](int t) {
      const int r0 = (t / CG) * RM;
      KDNN_IMPL_UNROLL
      for (int i = 0; i < RM; ++i) {
        int& first = range(t)[i];
        int& last = range(t)[RM + i];
        if (r0 + i < rows) {
          visible.range(b, i0 + r0 + i, first, last);
        } else {
          first = last = 0;
        }
        m_alpha(t)[i] = neg_inf;
        l(t)[i] = 0.0;
      }
      KDNN_IMPL_UNROLL
      for (int e = 0; e < RM * DVC; ++e) acc(t)[e] = T(0);
    });
  }

  /// The thread's scores of the key tile at j0 (masked: −inf) and its
  /// partial row maxima.
  template <class Range, class MAlpha, class S>
  KOKKOS_FORCEINLINE_FUNCTION void tile_scores(const Member& team, const RowBlock& qb,
                                               const Work& w, const AlibiRow<T>& bias, int j0,
                                               Range& range, MAlpha& m_alpha, S& s) const {
    const int i0 = qb.start;
    threads(team, [&](int t) {
      const int r0 = (t / CG) * RM, c0 = (t % CG) * RN;
      T* st = s(t);
      kdnn::impl::register_tile_product<RM, RN, D>(w.qt + r0, BQ, 1, w.kv + c0, BK, 1, st);
      KDNN_IMPL_UNROLL
      for (int i = 0; i < RM; ++i) {
        const int first = range(t)[i], last = range(t)[RM + i];
        T mx = m_alpha(t)[i];
        KDNN_IMPL_UNROLL
        for (int j = 0; j < RN; ++j) {
          const int key = j0 + c0 + j;
          T& x = st[i * RN + j];
          // pad keys: last <= Sk
          x = this->score(x, (key >= first) & (key < last), bias, i0 + r0 + i, key);
          mx = x > mx ? x : mx;
        }
        w.part_max[(t % CG) * BQ + r0 + i] = mx;
      }
    });
  }

  /// O / l and lse = m + log l (−inf and a zero row for a row that saw no key).
  template <class MAlpha, class L, class Acc>
  KOKKOS_FORCEINLINE_FUNCTION void finish_rows(const Member& team, const RowBlock& qb,
                                               MAlpha& m_alpha, L& l, Acc& acc) const {
    const int b = qb.b, h = qb.h, i0 = qb.start, rows = qb.count, d_v = int(v.extent(3));
    threads(team, [&](int t) {
      const int r0 = (t / CG) * RM, d0 = (t % CG) * DVC;
      KDNN_IMPL_UNROLL
      for (int i = 0; i < RM; ++i) {
        const int r = r0 + i;
        if (r >= rows) continue;
        const auto end = this->finish(h, m_alpha(t)[i], l(t)[i]);
        T* orow = &o(b, h, i0 + r, 0);
        KDNN_IMPL_UNROLL
        for (int j = 0; j < DVC; ++j) {
          if (d0 + j < d_v) orow[d0 + j] = acc(t)[i * DVC + j] * end.inv;
        }
        if (t % CG == 0) lse(b, h, i0 + r) = end.lse;
      }
    });
  }
};

}  // namespace kdnn::attention::impl
