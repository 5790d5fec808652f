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
// rows' scale·Q fragments in registers for the whole block, and per key tile of
// BK keys (K and V tiles in level-0 scratch, rows padded by 4 elements so
// that a fragment's loads fall on distinct banks):
//  * S = (scale·Q)·Kᵀ into accumulator fragments (BK / 8 tiles of 8 keys);
//  * the online softmax on the fragments: a row's values sit in the four
//    lanes of a quad, so its maximum and sum are quad reductions
//    (core/impl/team_quads.hpp), m' = max(m, max_c s_c), α = e^{m−m'},
//    P = e^{s−m'} (0 where masked), dropout, l = α·l + Σ_c P (in double);
//  * O = α·O + P·V, P taken from the accumulators as the A operand without
//    moving a value: the accumulator's lane (g, t) holds columns 2t and
//    2t + 1 of its rows, so the product's k index runs over the tile's keys
//    in the order π(k) = 2k (k < 4), 2(k − 4) + 1 (k ≥ 4) for TF32 (for
//    FP64, two k-slices of four: keys 2k and 2k + 1), and the V fragment is
//    loaded in the same order.
// At the end O / l and lse = m + log l (−inf and a zero row for a row with
// no visible key). Masks, windows, sequence lengths and dropout's elements
// are those of every other form (fused_forward_data.hpp).
//
// Numerics: the tensor cores sum each product step in their own order, so
// this form equals the others to rounding, not bitwise (docs/attention.md
// states the bounds). On a host the team is one thread playing the 128
// threads, registers side by side, the products emulated
// (warp_mma_emulated.hpp): the same fragment code runs in the CPU tests.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kdnn/attention/impl/fused_forward_data.hpp"
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/compiled_sizes.hpp"
#include "kdnn/core/impl/exp_vectorisable.hpp"
#include "kdnn/core/impl/register_team.hpp"
#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/team_mma.hpp"
#include "kdnn/core/impl/team_quads.hpp"
#include "kdnn/core/impl/unroll.hpp"
#include "kdnn/core/impl/warp_mma_fragments.hpp"

namespace kdnn::attention::impl {

/// The head sizes the tensor-core form is compiled for, each of D and Dv.
using MmaHeadSizes = kdnn::impl::CompiledSizes<32, 64, 128>;

/// The tensor-core product of T: m16n8k8 TF32 for float, m8n8k4 FP64 for
/// double.
template <class T>
using AttentionMma =
    std::conditional_t<(sizeof(T) > 4), kdnn::impl::MmaF64M8N8K4, kdnn::impl::MmaTf32M16N8K8>;

/// Block sizes of the tensor-core form for T, D and DV (see above).
template <class T, int D, int DV>
struct FlashMmaShape {
  using Mma = AttentionMma<T>;
  static constexpr int NT = 128;  ///< threads: four warps
  /// m-tiles per warp: one (two of FP64's 8 rows spill registers at D = 128).
  static constexpr int MT = 1;
  static constexpr int WR = MT * Mma::M;     ///< rows per warp
  static constexpr int BQ = NT / 32 * WR;    ///< queries per team (float 64, double 32)
  static constexpr int W = std::max(D, DV);  ///< the wider head
  static constexpr int BK = (sizeof(T) > 4 ? 32 : 64) / (W > 64 ? 2 : 1);  ///< keys per tile
  static constexpr int NK = BK / 8;                ///< 8-key tiles of S per key tile
  static constexpr int KD = D / Mma::K;            ///< k-steps of Q·Kᵀ
  static constexpr int ND = DV / 8;                ///< 8-column tiles of O
  static constexpr int SL = 8 / Mma::K;            ///< k-slices of P·V per 8 keys
  static constexpr int RS = Mma::c_regs / 2;       ///< rows per m-tile a thread holds
  static constexpr int RT = MT * RS;               ///< rows a thread holds
  static constexpr int LDK = D + 4, LDV = DV + 4;  ///< scratch row strides
  static_assert(D % Mma::K == 0 && DV % 8 == 0 && BK % 8 == 0, "FlashMmaShape");
};

template <class ExecSpace, class T, int D, int DV, kdnn::impl::MmaPrecision P>
struct FusedForwardMmaKernel
    : FusedForwardData<ExecSpace, T>,
      kdnn::impl::RegisterTeam<FusedForwardMmaKernel<ExecSpace, T, D, DV, P>, ExecSpace,
                               FlashMmaShape<T, D, DV>::NT> {
  using Shape = FlashMmaShape<T, D, DV>;
  using Mma = typename Shape::Mma;
  using Team = kdnn::impl::RegisterTeam<FusedForwardMmaKernel, ExecSpace, Shape::NT>;
  using Team::kPrivate;
  using Team::threads;
  using typename Team::Member;
  static constexpr int NT = Shape::NT, MT = Shape::MT, WR = Shape::WR, BQ = Shape::BQ,
                       BK = Shape::BK, NK = Shape::NK, KD = Shape::KD, ND = Shape::ND,
                       SL = Shape::SL, RS = Shape::RS, RT = Shape::RT, LDK = Shape::LDK,
                       LDV = Shape::LDV;
  static constexpr int AR = Mma::a_regs, CR = Mma::c_regs;
  static_assert(sizeof(T) == 4 || P == kdnn::impl::MmaPrecision::full,
                "FusedForwardMmaKernel: a single TF32 pass is a float precision");
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

  /// A K tile [BK, LDK] and a V tile [BK, LDV].
  struct Work {
    T *kt, *vt;
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s) {
    Work w;
    w.kt = s.take<T>(BK * LDK);
    w.vt = s.take<T>(BK * LDV);
    return w;
  }

  /// The key order of P·V within 8 keys: A's k index of k-slice `slice`
  /// reads the accumulator's column key(slice, k) (see above).
  KOKKOS_FORCEINLINE_FUNCTION static constexpr int pv_key(int slice, int k) {
    return SL == 1 ? (k < 4 ? 2 * k : 2 * (k - 4) + 1) : 2 * k + slice;
  }
  /// The accumulator register (of an m-tile's 8 keys) that is A's register
  /// r in k-slice `slice`: TF32 a0..a3 = c0, c2, c1, c3; FP64 a0 = c_slice.
  KOKKOS_FORCEINLINE_FUNCTION static constexpr int pv_register(int slice, int r) {
    return SL == 1 ? (r == 1 ? 2 : r == 2 ? 1 : r) : slice;
  }

  /// Calls f(e, slot, row, col) for each register e of thread t's
  /// accumulators of Tiles tiles of 8 columns (per m-tile): the slot of its
  /// row among the thread's rows, its block-relative row and its column.
  template <int Tiles, class F>
  static KOKKOS_FORCEINLINE_FUNCTION void each_accumulator(int t, const F& f) {
    KDNN_IMPL_UNROLL
    for (int mt = 0; mt < MT; ++mt) {
      KDNN_IMPL_UNROLL
      for (int n = 0; n < Tiles; ++n) {
        KDNN_IMPL_UNROLL
        for (int r = 0; r < CR; ++r) {
          const kdnn::impl::FragmentIndex c = Mma::c(t % 32, r);
          f((mt * Tiles + n) * CR + r, mt * RS + r / 2, t / 32 * WR + mt * Mma::M + c.row,
            n * 8 + c.col);
        }
      }
    }
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    const int H = int(q.extent(1)), S = int(q.extent(2)), Sk = int(k.extent(2));
    const int blocks = (S + BQ - 1) / BQ;
    const int block = item % blocks, bh = item / blocks;
    const int b = bh / H, h = bh % H, i0 = block * BQ;
    const int rows = S - i0 < BQ ? S - i0 : BQ;
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver);

    // Per thread, for the whole block: its scale·Q fragments, the visible
    // keys, m, α and l of its rows, and its O accumulators; per key tile its
    // S accumulators and its rows' partial sums.
    kdnn::impl::ThreadRegisters<T, NT, MT * KD * AR, kPrivate> qf;
    kdnn::impl::ThreadRegisters<int, NT, 2 * RT, kPrivate> range;  // first, last
    kdnn::impl::ThreadRegisters<T, NT, 2 * RT, kPrivate> m_alpha;  // m, then α
    kdnn::impl::ThreadRegisters<double, NT, 2 * RT, kPrivate> l;   // l, then the tile's sum
    kdnn::impl::ThreadRegisters<T, NT, MT * NK * CR, kPrivate> sacc;
    kdnn::impl::ThreadRegisters<T, NT, MT * ND * CR, kPrivate> oacc;

    threads(team, [&](int t) {
      const int lane = t % 32;
      KDNN_IMPL_UNROLL
      for (int mt = 0; mt < MT; ++mt) {
        KDNN_IMPL_UNROLL
        for (int ks = 0; ks < KD; ++ks) {
          KDNN_IMPL_UNROLL
          for (int r = 0; r < AR; ++r) {
            const kdnn::impl::FragmentIndex e = Mma::a(lane, r);
            const int row = t / 32 * WR + mt * Mma::M + e.row;
            qf(t)[(mt * KD + ks) * AR + r] =
                row < rows ? scale * q(b, h, i0 + row, ks * Mma::K + e.col) : T(0);
          }
        }
      }
      // Each row once, at its even column of the first tile.
      each_accumulator<1>(t, [&](int, int slot, int row, int col) {
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

    const auto max_op = [](T x, T y) { return x > y ? x : y; };
    const auto add_op = [](double x, double y) { return x + y; };
    const auto seen = visible.team_bounds(team, b, i0, rows);
    for (int j0 = seen.lo / BK * BK; j0 < seen.hi; j0 += BK) {
      const int cols = Sk - j0 < BK ? Sk - j0 : BK;
      team.team_barrier();  // the previous tile is done with kt and vt
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * D), [&](int e) {
        const int c = e / D, d = e % D;
        w.kt[c * LDK + d] = c < cols ? k(b, h, j0 + c, d) : T(0);
      });
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * DV), [&](int e) {
        const int c = e / DV, d = e % DV;
        w.vt[c * LDV + d] = c < cols ? v(b, h, j0 + c, d) : T(0);
      });
      team.team_barrier();

      // S = (scale·Q)·Kᵀ: B(k = d, n = key) = K[key][d].
      threads(team, [&](int t) {
        KDNN_IMPL_UNROLL
        for (int e = 0; e < MT * NK * CR; ++e) sacc(t)[e] = T(0);
      });
      KDNN_IMPL_UNROLL
      for (int ks = 0; ks < KD; ++ks) {
        KDNN_IMPL_UNROLL
        for (int nk = 0; nk < NK; ++nk) {
          const auto kb = [&](int t, int r) {
            const kdnn::impl::FragmentIndex e = Mma::b(t % 32, r);
            return w.kt[(nk * 8 + e.col) * LDK + ks * Mma::K + e.row];
          };
          KDNN_IMPL_UNROLL
          for (int mt = 0; mt < MT; ++mt) {
            kdnn::impl::team_mma<Mma, P, NT, kPrivate>(
                team, kdnn::impl::registers_at(qf, (mt * KD + ks) * AR), kb,
                kdnn::impl::registers_at(sacc, (mt * NK + nk) * CR));
          }
        }
      }

      // The mask (−inf), the rows' maxima over the thread's scores.
      threads(team, [&](int t) {
        KDNN_IMPL_UNROLL
        for (int slot = 0; slot < RT; ++slot) m_alpha(t)[RT + slot] = m_alpha(t)[slot];
        each_accumulator<NK>(t, [&](int e, int slot, int, int col) {
          const int key = j0 + col;
          T& x = sacc(t)[e];
          x = (key >= range(t)[slot]) & (key < range(t)[RT + slot]) ? x : neg_inf;
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
          const T alpha = m_new == neg_inf ? T(1) : kdnn::impl::exp_vectorisable(m - m_new);
          m = m_new;
          m_alpha(t)[RT + slot] = alpha;
          l(t)[RT + slot] = 0.0;
        }
        each_accumulator<NK>(t, [&](int e, int slot, int row, int col) {
          const int key = j0 + col;
          T& x = sacc(t)[e];
          const T ex = kdnn::impl::exp_vectorisable(x - m_alpha(t)[slot]);  // NaN if x = m' = −inf
          const T p = x == neg_inf ? T(0) : ex;
          l(t)[RT + slot] += double(p);
          const bool keep =
              row >= rows || dropout.keep(std::uint64_t(bh) * S * Sk +
                                          std::uint64_t(i0 + row) * Sk + std::uint64_t(key));
          x = dropout.active ? (keep ? p * keep_scale : T(0)) : p;
        });
      });
      kdnn::impl::team_quad_reduce<RT>(team, l, RT, add_op);

      // l = α·l + the tile's sum; O = α·O, then O += P·V: A from the
      // accumulators of P (pv_register), B(k, n) = V[key pv_key(k)][n].
      threads(team, [&](int t) {
        KDNN_IMPL_UNROLL
        for (int slot = 0; slot < RT; ++slot) {
          l(t)[slot] = double(m_alpha(t)[RT + slot]) * l(t)[slot] + l(t)[RT + slot];
        }
        each_accumulator<ND>(
            t, [&](int e, int slot, int, int) { oacc(t)[e] *= m_alpha(t)[RT + slot]; });
      });
      KDNN_IMPL_UNROLL
      for (int nk = 0; nk < NK; ++nk) {
        KDNN_IMPL_UNROLL
        for (int sl = 0; sl < SL; ++sl) {
          KDNN_IMPL_UNROLL
          for (int nd = 0; nd < ND; ++nd) {
            const auto vb = [&](int t, int r) {
              const kdnn::impl::FragmentIndex e = Mma::b(t % 32, r);
              return w.vt[(nk * 8 + pv_key(sl, e.row)) * LDV + nd * 8 + e.col];
            };
            KDNN_IMPL_UNROLL
            for (int mt = 0; mt < MT; ++mt) {
              const auto pa = [&](int t, int r) {
                return sacc(t)[(mt * NK + nk) * CR + pv_register(sl, r)];
              };
              kdnn::impl::team_mma<Mma, P, NT, kPrivate>(
                  team, pa, vb, kdnn::impl::registers_at(oacc, (mt * ND + nd) * CR));
            }
          }
        }
      }
    }

    // O / l and lse = m + log l (−inf and a zero row for a row that saw no key).
    threads(team, [&](int t) {
      each_accumulator<ND>(t, [&](int e, int slot, int row, int col) {
        if (row >= rows) return;
        const double li = l(t)[slot];
        o(b, h, i0 + row, col) = oacc(t)[e] * (li > 0 ? T(1 / li) : T(0));
        if (col == 0) {  // one register per row
          lse(b, h, i0 + row) = li > 0 ? T(double(m_alpha(t)[slot]) + compat::log(li)) : neg_inf;
        }
      });
    });
  }
};

}  // namespace kdnn::attention::impl
