// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The fused attention forward, tensor-core form, for a compile-time pair of
// head sizes D (queries, keys) and DV (values) in {32, 64, 128}:
// FlashAttention-2's forward on warp-level mma.sync (core/impl/team_mma.hpp),
// float through 3×TF32 (or one TF32 pass where the caller asks), double on
// the FP64 tensor cores.
//
// A team of four warps owns BQ queries, each warp MT m-tiles of Mma::M rows
// (one: float 16 rows, BQ = 64; double 8 rows, BQ = 32). The warp keeps its
// rows' scale·Q fragments in registers for the whole block (where they fit
// beside O's accumulators: kQInRegisters; else it reads them from L1, the
// same values, for each key tile), and per key
// tile of BK keys (K and V tiles in level-0 scratch, rows padded by 4 elements so
// that a fragment's loads fall on distinct banks):
//  * S = (scale·Q)·Kᵀ into accumulator fragments (BK / 8 tiles of 8 keys);
//  * the online softmax on the fragments: a row's values sit in the four
//    lanes of a quad, so its maximum and sum are quad reductions
//    (core/impl/team_quads.hpp), m' = max(m, max_c s_c), α = e^{m−m'},
//    P = e^{s−m'} (0 where masked), dropout, l = α·l + Σ_c P (in double);
//  * O = α·O + P·V, P taken from the accumulators as the A operand in place
//    (flash_mma_team.hpp).
// At the end O / l and lse = m + log l (−inf and a zero row for a row with
// no visible key). Masks, windows, sequence lengths and dropout's elements
// are those of every other form (fused_forward_rules.hpp).
//
// Numerics: the tensor cores sum each product step in their own order, so
// this form equals the others to rounding, not bitwise (docs/attention.md
// states the bounds). On a host the team is one thread playing the 128
// threads, registers side by side, the products emulated
// (warp_mma_emulated.hpp): the same fragment code runs in the CPU tests.
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "kdnn/attention/impl/flash_mma_team.hpp"
#include "kdnn/attention/impl/fused_forward_rules.hpp"
#include "kdnn/attention/impl/row_blocks.hpp"
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/exp_vectorisable.hpp"
#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/team_quads.hpp"
#include "kdnn/core/impl/unroll.hpp"

namespace kdnn::attention::impl {

template <class ExecSpace, class T, int D, int DV, kdnn::impl::MmaPrecision P>
struct FusedForwardMmaKernel
    : FusedForwardData<ExecSpace, T>,
      FlashMmaTeam<FusedForwardMmaKernel<ExecSpace, T, D, DV, P>, ExecSpace, T, D, DV, P> {
  using Base = FlashMmaTeam<FusedForwardMmaKernel, ExecSpace, T, D, DV, P>;
  using Base::kPrivate;
  using Base::threads;
  using typename Base::Member;
  static constexpr int NT = Base::NT, BQ = Base::BQ, BK = Base::BK, NK = Base::NK, KD = Base::KD,
                       ND = Base::ND, RT = Base::RT, LDK = Base::LDK, LDV = Base::LDV,
                       AR = Base::AR, CR = Base::CR, MT = Base::MT;
  /// Whether a thread keeps its scale·Q fragments in registers through the
  /// block, or reads them (from L1) for each key tile's product: kept where
  /// they and the O accumulators leave room (ptxas, sm_90, CUDA 13: with
  /// D = 128, or double with Dv = 128, holding Q spilled 70-800 bytes).
  static constexpr bool kQInRegisters = D <= 64 && (sizeof(T) == 4 || DV <= 64);
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

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    const RowBlock qb = this->blocks(item);
    const int b = qb.b, h = qb.h, bh = qb.bh, hk = this->kv_head(h), i0 = qb.start, rows = qb.count;
    const int keys = k.rows(b);  // the entry's keys
    const AlibiRow<T> bias = this->visible.template alibi<T>(b, h);
    kdnn::impl::ScratchCarver carver(scratch);
    const auto w = Base::carve(carver);

    // Per thread, for the whole block: its scale·Q fragments, the visible
    // keys, m, α and l of its rows, and its O accumulators; per key tile its
    // S accumulators and its rows' partial sums.
    kdnn::impl::ThreadRegisters<T, NT, kQInRegisters ? MT * KD * AR : 1, kPrivate> qf;
    kdnn::impl::ThreadRegisters<int, NT, 2 * RT, kPrivate> range;  // first, last
    kdnn::impl::ThreadRegisters<T, NT, 2 * RT, kPrivate> m_alpha;  // m, then α
    kdnn::impl::ThreadRegisters<double, NT, 2 * RT, kPrivate> l;   // l, then the tile's sum
    kdnn::impl::ThreadRegisters<T, NT, MT * NK * CR, kPrivate> sacc;
    kdnn::impl::ThreadRegisters<T, NT, MT * ND * CR, kPrivate> oacc;

    start_rows(team, qb, qf, range, m_alpha, l, oacc);

    const auto max_op = [](T x, T y) { return x > y ? x : y; };
    const auto add_op = [](double x, double y) { return x + y; };
    const auto seen = visible.team_bounds(team, b, i0, rows);
    for (int j0 = seen.lo / BK * BK; j0 < seen.hi; j0 += BK) {
      const int cols = keys - j0 < BK ? keys - j0 : BK;
      team.team_barrier();  // the previous tile is done with kt and vt
      Base::template load_tile<D>(team, k, b, hk, j0, cols, T(1), w.kt, LDK);
      Base::template load_tile<DV>(team, v, b, hk, j0, cols, T(1), w.vt, LDV);
      team.team_barrier();

      // S = (scale·Q)·Kᵀ; the mask (−inf); the rows' maxima.
      if constexpr (kQInRegisters) {
        Base::template tile_rows_product<D>(team, kdnn::impl::registers_at(qf, 0), w.kt, LDK, sacc);
      } else {
        Base::template tile_rows_product<D>(
            team, Base::template fragments<D>(q, b, h, i0, rows, scale), w.kt, LDK, sacc);
      }
      threads(team, [&](int t) {
        KDNN_IMPL_UNROLL
        for (int slot = 0; slot < RT; ++slot) m_alpha(t)[RT + slot] = m_alpha(t)[slot];
        Base::template each_accumulator<NK>(t, [&](int e, int slot, int row, int col) {
          const int key = j0 + col;
          T& x = sacc(t)[e];
          x = this->score(x, (key >= range(t)[slot]) & (key < range(t)[RT + slot]), bias, i0 + row,
                          key);
          m_alpha(t)[RT + slot] = max_op(m_alpha(t)[RT + slot], x);
        });
      });
      kdnn::impl::team_quad_reduce<RT>(team, m_alpha, RT, max_op);

      // α = e^{m−m'}, m = m'; P = e^{s−m'} (dropped ones zero) in place of
      // S; the thread's part of each row's sum.
      threads(team, [&](int t) {
        KDNN_IMPL_UNROLL
        for (int slot = 0; slot < RT; ++slot) {
          const T m_new = m_alpha(t)[RT + slot];
          T& m = m_alpha(t)[slot];
          const T alpha = this->rescale(m, m_new);
          m = m_new;
          m_alpha(t)[RT + slot] = alpha;
          l(t)[RT + slot] = 0.0;
        }
        const std::uint32_t kept =
            dropout.active ? Base::template accumulator_bits<NK>(
                                 t,
                                 [&](int row, int col) {
                                   return row >= rows || this->keeps(bh, i0 + row, j0 + col);
                                 })
                           : ~std::uint32_t(0);
        Base::template each_accumulator<NK>(t, [&](int e, int slot, int, int) {
          T& x = sacc(t)[e];
          const T p = this->probability(x, m_alpha(t)[slot]);
          l(t)[RT + slot] += double(p);
          x = dropout.active ? this->dropped(p, (kept >> e) & 1u) : p;
        });
      });
      kdnn::impl::team_quad_reduce<RT>(team, l, RT, add_op);

      // l = α·l + the tile's sum; O = α·O + P·V.
      threads(team, [&](int t) {
        KDNN_IMPL_UNROLL
        for (int slot = 0; slot < RT; ++slot) {
          l(t)[slot] = double(m_alpha(t)[RT + slot]) * l(t)[slot] + l(t)[RT + slot];
        }
        Base::template each_accumulator<ND>(
            t, [&](int e, int slot, int, int) { oacc(t)[e] *= m_alpha(t)[RT + slot]; });
      });
      Base::template accumulator_product<DV>(team, sacc, w.vt, LDV, oacc);
    }

    finish_rows(team, qb, m_alpha, l, oacc);
  }

  /// The thread's scale·Q fragments (when held), its rows' visible keys,
  /// m = −inf and l = 0, and empty O accumulators.
  template <class Q, class Range, class MAlpha, class L, class O>
  KOKKOS_FORCEINLINE_FUNCTION void start_rows(const Member& team, const RowBlock& qb, Q& qf,
                                              Range& range, MAlpha& m_alpha, L& l, O& oacc) const {
    const int b = qb.b, h = qb.h, i0 = qb.start, rows = qb.count;
    threads(team, [&](int t) {
      if constexpr (kQInRegisters) Base::template load_a<D>(t, qf, q, b, h, i0, rows, scale);
      // Each row once, at its even column of the first tile.
      Base::template each_accumulator<1>(t, [&](int, int slot, int row, int col) {
        if (col % 2 != 0) return;
        int& first = range(t)[slot];
        int& last = range(t)[RT + slot];
        if (row < rows) {
          visible.range(b, i0 + row, first, last);
        } else {
          first = last = 0;
        }
        m_alpha(t)[slot] = neg_inf;
        l(t)[slot] = 0.0;
      });
      KDNN_IMPL_UNROLL
      for (int e = 0; e < MT * ND * CR; ++e) oacc(t)[e] = T(0);
    });
  }

  /// O / l and lse = m + log l (−inf and a zero row for a row that saw no key).
  template <class MAlpha, class L, class O>
  KOKKOS_FORCEINLINE_FUNCTION void finish_rows(const Member& team, const RowBlock& qb,
                                               MAlpha& m_alpha, L& l, O& oacc) const {
    const int b = qb.b, h = qb.h, i0 = qb.start, rows = qb.count;
    threads(team, [&](int t) {
      Base::template each_accumulator<ND>(t, [&](int e, int slot, int row, int col) {
        if (row >= rows) return;
        const auto end = this->finish(h, m_alpha(t)[slot], l(t)[slot]);
        // Columns past Dv (a head size rounded up to DV) are not stored.
        if (col < int(o.extent(3))) o(b, h, i0 + row, col) = oacc(t)[e] * end.inv;
        if (col == 0) lse(b, h, i0 + row) = end.lse;  // one register per row
      });
    });
  }
};

}  // namespace kdnn::attention::impl
