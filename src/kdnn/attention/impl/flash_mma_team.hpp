// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What the fused attention's tensor-core forms share
// (fused_forward_mma_kernel.hpp, fused_backward_mma_kernels.hpp): the block
// sizes, the walk over a thread's accumulators, the scores' product, which
// every kernel computes with the same fragments in the same order so that
// the backward's scores are bitwise the forward's, and the product that
// takes its A operand from accumulators in place.
//
// A warp's accumulator lane (g, t) holds columns 2t and 2t + 1 of its rows
// (warp_mma_fragments.hpp), so a product whose k index runs over those
// columns can take the accumulators as its A fragment without moving a
// value, if its k runs over the 8 columns of a tile in the order
// π(k) = 2k (k < 4), 2(k − 4) + 1 (k ≥ 4) for TF32 (A's a0..a3 are the
// accumulator's c0, c2, c1, c3), and for FP64 in two k-slices of four,
// columns 2k and 2k + 1 (a0 = c_slice); its B operand is loaded in the same
// order.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kdnn/core/impl/compiled_sizes.hpp"
#include "kdnn/core/impl/register_team.hpp"
#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/team_mma.hpp"
#include "kdnn/core/impl/unroll.hpp"
#include "kdnn/core/impl/warp_mma_fragments.hpp"

namespace kdnn::attention::impl {

/// The head sizes the tensor-core form is compiled for, each of D and Dv.
using MmaHeadSizes = kdnn::impl::CompiledSizes<32, 64, 128>;

/// Block sizes of the tensor-core form for T, D and DV (see above); Tile,
/// where given, the rows of the streamed tiles (else the keys per tile the
/// forward takes).
template <class T, int D, int DV, int Tile = 0>
struct FlashMmaShape {
  using Mma = kdnn::impl::MmaOf<T>;
  static constexpr int NT = 128;  ///< threads: four warps
  /// m-tiles per warp: one (two of FP64's 8 rows spill registers at D = 128).
  static constexpr int MT = 1;
  static constexpr int WR = MT * Mma::M;     ///< rows per warp
  static constexpr int BQ = NT / 32 * WR;    ///< queries per team (float 64, double 32)
  static constexpr int W = std::max(D, DV);  ///< the wider head
  /// Rows per streamed tile (the forward's keys per tile).
  static constexpr int BK = Tile > 0 ? Tile : (sizeof(T) > 4 ? 32 : 64) / (W > 64 ? 2 : 1);
  static constexpr int NK = BK / 8;                ///< 8-key tiles of S per key tile
  static constexpr int KD = D / Mma::K;            ///< k-steps of Q·Kᵀ
  static constexpr int ND = DV / 8;                ///< 8-column tiles of O
  static constexpr int SL = 8 / Mma::K;            ///< k-slices of P·V per 8 keys
  static constexpr int RS = Mma::c_regs / 2;       ///< rows per m-tile a thread holds
  static constexpr int RT = MT * RS;               ///< rows a thread holds
  static constexpr int LDK = D + 4, LDV = DV + 4;  ///< scratch row strides
  static_assert(D % Mma::K == 0 && DV % 8 == 0 && BK % 8 == 0, "FlashMmaShape");
};

/// The tensor-core forms' team: four warps, each MT m-tiles of Mma::M rows,
/// streaming tiles of FlashMmaShape<T, D, DV, Tile>::BK rows. Derived
/// provides what RegisterTeam asks for.
template <class Derived, class ExecSpace, class T, int D, int DV, kdnn::impl::MmaPrecision P,
          int Tile = 0>
struct FlashMmaTeam
    : kdnn::impl::RegisterTeam<Derived, ExecSpace, FlashMmaShape<T, D, DV, Tile>::NT> {
  using Shape = FlashMmaShape<T, D, DV, Tile>;
  using Mma = typename Shape::Mma;
  using Team = kdnn::impl::RegisterTeam<Derived, ExecSpace, Shape::NT>;
  using Team::kPrivate;
  using typename Team::Member;
  static constexpr int NT = Shape::NT, MT = Shape::MT, WR = Shape::WR, BQ = Shape::BQ,
                       BK = Shape::BK, NK = Shape::NK, KD = Shape::KD, ND = Shape::ND,
                       SL = Shape::SL, RS = Shape::RS, RT = Shape::RT, LDK = Shape::LDK,
                       LDV = Shape::LDV;
  static constexpr int AR = Mma::a_regs, CR = Mma::c_regs;
  static_assert(sizeof(T) == 4 || P == kdnn::impl::MmaPrecision::full,
                "FlashMmaTeam: a single TF32 pass is a float precision");

  /// The column of an 8-column tile that A's k index reads in k-slice
  /// `slice` (π above).
  KOKKOS_FORCEINLINE_FUNCTION static constexpr int pv_key(int slice, int k) {
    return SL == 1 ? (k < 4 ? 2 * k : 2 * (k - 4) + 1) : 2 * k + slice;
  }
  /// The accumulator register that is A's register r in k-slice `slice`.
  KOKKOS_FORCEINLINE_FUNCTION static constexpr int pv_register(int slice, int r) {
    return SL == 1 ? (r == 1 ? 2 : r == 2 ? 1 : r) : slice;
  }

  /// Where register e = (mt·Tiles + n)·CR + r of thread t's accumulators of
  /// Tiles tiles of 8 columns (per m-tile) is: the slot of its row among the
  /// thread's rows, its block-relative row and its column.
  struct AccumulatorPlace {
    int slot, row, col;
  };
  template <int Tiles>
  static KOKKOS_FORCEINLINE_FUNCTION AccumulatorPlace accumulator_place(int t, int e) {
    const int r = e % CR, n = e / CR % Tiles, mt = e / (CR * Tiles);
    const kdnn::impl::FragmentIndex c = Mma::c(t % 32, r);
    return {mt * RS + r / 2, t / 32 * WR + mt * Mma::M + c.row, n * 8 + c.col};
  }

  /// Calls f(e, slot, row, col) for each register e of thread t's
  /// accumulators of Tiles tiles, unrolled: the places accumulator_place
  /// gives (tested), written out per loop index, as one loop over e
  /// through accumulator_place cost the backward's float64 D = 128 kernel
  /// 16 bytes of spills (ptxas, CUDA 13).
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

  /// The bits e of thread t's accumulators of Tiles tiles for which
  /// test(row, col) holds, in a loop that is not unrolled: for a test too
  /// large to repeat for every register (dropout's Philox rounds), whose
  /// unrolled copies the compiler would interleave and spill.
  template <int Tiles, class Test>
  static KOKKOS_INLINE_FUNCTION std::uint32_t accumulator_bits(int t, const Test& test) {
    static_assert(MT * Tiles * CR <= 32, "accumulator_bits: at most 32 registers");
    std::uint32_t bits = 0;
    KDNN_IMPL_NO_UNROLL
    for (int e = 0; e < MT * Tiles * CR; ++e) {
      const AccumulatorPlace a = accumulator_place<Tiles>(t, e);
      if (test(a.row, a.col)) bits |= std::uint32_t(1) << e;
    }
    return bits;
  }

  /// Thread t's A register e of `factor`·view(b, h, i0 + row, ·) over Width
  /// columns: Width / Mma::K k-steps per m-tile, e = (mt·KS + ks)·AR + r;
  /// rows past `rows` and columns past the view's (a head size rounded up
  /// to Width) zero.
  template <int Width, class View>
  static KOKKOS_FORCEINLINE_FUNCTION T a_element(int t, int e, const View& view, int b, int h,
                                                 int i0, int rows, T factor) {
    const kdnn::impl::FragmentIndex f = kdnn::impl::mma_a_place<Mma, MT, Width>(t, e);
    return f.row < rows && f.col < int(view.extent(3)) ? factor * view(b, h, i0 + f.row, f.col)
                                                       : T(0);
  }

  /// The A fragments of `factor`·view(b, h, r0 + row, ·) over Width
  /// columns (a_element) as a product's operand a(t, e), read where a
  /// product asks for them (from L1): for operands a thread cannot spare
  /// the registers to keep (the backward's K, V and Kᵀ).
  template <int Width, class View>
  struct AFragments {
    const View& view;
    int b, h, r0, count;
    T factor;
    KOKKOS_INLINE_FUNCTION T operator()(int t, int e) const {
      return a_element<Width>(t, e, view, b, h, r0, count, factor);
    }
  };
  /// AFragments of `view`, `factor` and the rows [r0, r0 + count).
  template <int Width, class View>
  static KOKKOS_INLINE_FUNCTION AFragments<Width, View> fragments(const View& view, int b, int h,
                                                                  int r0, int count, T factor) {
    return {view, b, h, r0, count, factor};
  }

  /// Thread t's A fragments (a_element) into its registers x.
  template <int Width, class Registers, class View>
  static KOKKOS_INLINE_FUNCTION void load_a(int t, Registers& x, const View& view, int b, int h,
                                            int i0, int rows, T factor) {
    KDNN_IMPL_UNROLL
    for (int e = 0; e < MT * (Width / Mma::K) * AR; ++e) {
      x(t)[e] = a_element<Width>(t, e, view, b, h, i0, rows, factor);
    }
  }

  /// The [BK, ld] scratch tile of rows r0 … r0 + BK − 1 of
  /// `factor`·view(b, h, ·, ·) over Width columns, zero past `count` rows
  /// and past the view's columns (a head size rounded up to Width): the
  /// tiles every kernel streams (K and V by keys, scale·Q and dO by
  /// queries).
  template <int Width, class Team_, class View>
  static KOKKOS_INLINE_FUNCTION void load_tile(const Team_& team, const View& view, int b, int h,
                                               int r0, int count, T factor, T* tile, int ld) {
    const int width = int(view.extent(3));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * Width), [&](int e) {
      const int r = e / Width, d = e % Width;
      tile[r * ld + d] = r < count && d < width ? factor * view(b, h, r0 + r, d) : T(0);
    });
  }

  /// A K tile [BK, LDK] and a V tile [BK, LDV] in scratch: what the forward
  /// and dQ stream.
  struct KeyTiles {
    T *kt, *vt;
  };
  static KOKKOS_INLINE_FUNCTION KeyTiles carve(kdnn::impl::ScratchCarver& s) {
    KeyTiles w;
    w.kt = s.take<T>(BK * LDK);
    w.vt = s.take<T>(BK * LDV);
    return w;
  }

  /// acc = A·tileᵀ over Width: a(t, e) thread t's A register e (as
  /// a_element numbers them: registers_at of load_a's, or a_element read
  /// where it is needed), tile the [NK·8, ld] scratch rows the product takes
  /// (keys: K for the scores, V for dO·Vᵀ; queries in the backward's Sᵀ and
  /// dPᵀ, with O = MmaOrder::transposed); acc NK 8-row tiles per m-tile.
  /// The scores' product: every form of the forward and backward computes
  /// it this way, so that the backward's are bitwise the forward's.
  template <int Width, kdnn::impl::MmaOrder O = kdnn::impl::MmaOrder::plain, class Team_, class A,
            class C>
  static KOKKOS_INLINE_FUNCTION void tile_rows_product(const Team_& team, const A& a, const T* tile,
                                                       int ld, C& acc) {
    kdnn::impl::mma_rows_by_tile<Mma, P, NT, kPrivate, MT, NK, Width, O>(team, a, tile, ld, acc);
  }

  /// acc += X·tile over the tile's NK·8 rows: X the accumulators `x` (NK
  /// 8-column tiles per m-tile: P or dS, or in the backward's dK and dV
  /// their transposes) as A in place, tile the [NK·8, ld] scratch rows
  /// (keys: V for P·V, K for dS·K; queries: dO for dV, scale·Q for dK),
  /// Cols columns of it; acc Cols / 8 tiles per m-tile.
  template <int Cols, class Team_, class X, class C>
  static KOKKOS_INLINE_FUNCTION void accumulator_product(const Team_& team, X& x, const T* tile,
                                                         int ld, C& acc) {
    constexpr int NC = Cols / 8;
    KDNN_IMPL_UNROLL
    for (int nk = 0; nk < NK; ++nk) {
      KDNN_IMPL_UNROLL
      for (int sl = 0; sl < SL; ++sl) {
        KDNN_IMPL_UNROLL
        for (int nc = 0; nc < NC; ++nc) {
          const auto b = [&](int t, int r) {
            const kdnn::impl::FragmentIndex e = Mma::b(t % 32, r);
            return tile[(nk * 8 + pv_key(sl, e.row)) * ld + nc * 8 + e.col];
          };
          KDNN_IMPL_UNROLL
          for (int mt = 0; mt < MT; ++mt) {
            const auto a = [&](int t, int r) {
              return x(t)[(mt * NK + nk) * CR + pv_register(sl, r)];
            };
            kdnn::impl::team_mma<Mma, P, NT, kPrivate>(
                team, a, b, kdnn::impl::registers_at(acc, (mt * NC + nc) * CR));
          }
        }
      }
    }
  }
};

}  // namespace kdnn::attention::impl
