// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The fused attention backward, tensor-core form (the forward's:
// fused_forward_mma_kernel.hpp), for D and DV in MmaHeadSizes, in two
// kernels as the GPU form's (fused_backward_gpu_kernels.hpp), with
// P = e^{s − lse} recomputed and δ = rowsum(dO∘O):
//  * FusedBackwardKVMmaKernel: a team of four warps owns BK keys (each warp
//    Mma::M of them, float 16, double 8) and walks the tiles of BQ queries
//    that see them. Per tile, with the keys as the rows of every product:
//    Sᵀ = K·(scale·Q)ᵀ and dPdᵀ = V·dOᵀ (MmaOrder::transposed: Sᵀ is
//    bitwise the transpose of the forward's S), dS'ᵀ = Pᵀ∘(dPdᵀ − δ) on
//    the accumulators, then dV += Pdᵀ·dO and dK += dS'ᵀ·(scale·Q) with the
//    accumulators as the A operand in place: four products, nothing
//    through scratch but the streamed Q and dO tiles and their rows' lse,
//    δ and visible keys. K and V stay in registers as A fragments where the
//    wider head is at most 64; wider, they are read where a product needs
//    them (from L1), which keeps a thread's registers within bounds.
//  * FusedBackwardQMmaKernel: a team owns BQ queries, as the forward, and
//    walks the key tiles: S = (scale·Q)·Kᵀ with the forward's fragments in
//    the forward's order, so a row whose probability is all at one key gets
//    P = 1 there and dS' = 0 however large the scale
//    (FusedBackwardData::grads); dPd = dO·Vᵀ the same way, dS' on the
//    accumulators, dQ/scale += dS'·K in place: three products. dO's
//    fragments stay in registers as K and V do in the other kernel.
// No atomics: each team writes only what it owns, every sum in a fixed
// order, so the result does not depend on timing.
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "kdnn/attention/impl/flash_mma_team.hpp"
#include "kdnn/attention/impl/fused_backward_data.hpp"
#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/unroll.hpp"

namespace kdnn::attention::impl {

/// dK and dV on tensor cores: one team per (b, h, block of BK keys).
template <class ExecSpace, class T, int D, int DV, kdnn::impl::MmaPrecision P>
struct FusedBackwardKVMmaKernel
    : FusedBackwardData<ExecSpace, T>,
      FlashMmaTeam<FusedBackwardKVMmaKernel<ExecSpace, T, D, DV, P>, ExecSpace, T, D, DV, P,
                   FlashMmaShape<T, D, DV>::BK / 2> {
  using Base = FlashMmaTeam<FusedBackwardKVMmaKernel, ExecSpace, T, D, DV, P,
                            FlashMmaShape<T, D, DV>::BK / 2>;
  using Base::kPrivate;
  using Base::threads;
  using typename Base::Member;
  /// Keys per team (the forward's queries per team) and queries per tile
  /// (half the forward's keys per tile: a thread holds Sᵀ and dPᵀ for
  /// each query of the tile, and its K, V, dK and dV besides), named as the
  /// GPU form's.
  static constexpr int BK = Base::BQ, BQ = Base::BK;
  static constexpr int NT = Base::NT, NK = Base::NK, LDK = Base::LDK, LDV = Base::LDV,
                       CR = Base::CR, MT = Base::MT;
  static constexpr int ND = D / 8, NV = DV / 8;  ///< 8-column tiles of dK, dV
  /// Whether K and V stay in registers for the whole walk (above).
  static constexpr bool kResident = Base::Shape::W <= 64;
  Tensor4<T, ExecSpace> dk, dv;

  /// The streamed tiles, scale·Q [BQ, LDK] and dO [BQ, LDV], and their
  /// rows' visible keys, lse and δ.
  struct Work {
    T *qt, *dot, *lse, *delta;
    int *first, *last;
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s) {
    Work w;
    w.qt = s.take<T>(BQ * LDK);
    w.dot = s.take<T>(BQ * LDV);
    w.lse = s.take<T>(BQ);
    w.delta = s.take<T>(BQ);
    w.first = s.take<int>(BQ);
    w.last = s.take<int>(BQ);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    const int H = int(this->q.extent(1)), S = int(this->q.extent(2)), Sk = int(this->k.extent(2));
    const int blocks = (Sk + BK - 1) / BK;
    const int bh = item / blocks, b = bh / H, h = bh % H, j0 = item % blocks * BK;
    const int cols = Sk - j0 < BK ? Sk - j0 : BK;  // the team's keys
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver);

    const auto kf = Base::template fragments<D, kResident>(this->k, b, h, j0, cols, T(1));
    const auto vf = Base::template fragments<DV, kResident>(this->v, b, h, j0, cols, T(1));
    kdnn::impl::ThreadRegisters<T, NT, MT * NK * CR, kPrivate> sacc;   // Sᵀ, then Pdᵀ
    kdnn::impl::ThreadRegisters<T, NT, MT * NK * CR, kPrivate> dpacc;  // dPdᵀ, then dS'ᵀ
    kdnn::impl::ThreadRegisters<T, NT, MT * ND * CR, kPrivate> dkacc;
    kdnn::impl::ThreadRegisters<T, NT, MT * NV * CR, kPrivate> dvacc;
    threads(team, [&](int t) {
      kf.load(t);
      vf.load(t);
      KDNN_IMPL_UNROLL
      for (int e = 0; e < MT * ND * CR; ++e) dkacc(t)[e] = T(0);
      KDNN_IMPL_UNROLL
      for (int e = 0; e < MT * NV * CR; ++e) dvacc(t)[e] = T(0);
    });

    constexpr auto transposed = kdnn::impl::MmaOrder::transposed;
    for (int i0 = 0; i0 < S; i0 += BQ) {
      const int rows = S - i0 < BQ ? S - i0 : BQ;  // the tile's queries
      team.team_barrier();                         // the previous tile is done with the scratch
      int any = 0;
      this->load_rows(team, b, h, i0, rows, w.first, w.last, w.lse, w.delta, j0, j0 + cols, any);
      if (!any) continue;  // no query of the tile sees these keys
      Base::template load_tile<D>(team, this->q, b, h, i0, rows, this->scale, w.qt, LDK);
      Base::template load_tile<DV>(team, this->dout, b, h, i0, rows, T(1), w.dot, LDV);
      team.team_barrier();

      Base::template tile_rows_product<D, transposed>(team, kf, w.qt, LDK, sacc);
      Base::template tile_rows_product<DV, transposed>(team, vf, w.dot, LDV, dpacc);
      // Accumulator (row, col): key j0 + row, query i0 + col.
      threads(team, [&](int t) {
        Base::template each_accumulator<NK>(t, [&](int e, int, int row, int col) {
          const int key = j0 + row;
          const bool visible = (key >= w.first[col]) & (key < w.last[col]);
          const bool keep = !this->dropout.active ||
                            this->dropout.keep(std::uint64_t(bh) * S * Sk +
                                               std::uint64_t(i0 + col) * Sk + std::uint64_t(key));
          T pd, ds;
          this->grads(sacc(t)[e], dpacc(t)[e], visible, keep, w.lse[col], w.delta[col], pd, ds);
          sacc(t)[e] = pd;
          dpacc(t)[e] = ds;
        });
      });
      Base::template accumulator_product<DV>(team, sacc, w.dot, LDV, dvacc);
      Base::template accumulator_product<D>(team, dpacc, w.qt, LDK, dkacc);
    }

    threads(team, [&](int t) {
      Base::template each_accumulator<ND>(t, [&](int e, int, int row, int col) {
        if (row < cols) dk(b, h, j0 + row, col) = dkacc(t)[e];
      });
      Base::template each_accumulator<NV>(t, [&](int e, int, int row, int col) {
        if (row < cols) dv(b, h, j0 + row, col) = dvacc(t)[e];
      });
    });
  }
};

/// dQ on tensor cores: one team per (b, h, block of BQ queries).
template <class ExecSpace, class T, int D, int DV, kdnn::impl::MmaPrecision P>
struct FusedBackwardQMmaKernel
    : FusedBackwardData<ExecSpace, T>,
      FlashMmaTeam<FusedBackwardQMmaKernel<ExecSpace, T, D, DV, P>, ExecSpace, T, D, DV, P> {
  using Base = FlashMmaTeam<FusedBackwardQMmaKernel, ExecSpace, T, D, DV, P>;
  using Base::kPrivate;
  using Base::threads;
  using typename Base::Member;
  static constexpr int NT = Base::NT, BQ = Base::BQ, BK = Base::BK, NK = Base::NK, KD = Base::KD,
                       RT = Base::RT, LDK = Base::LDK, LDV = Base::LDV, AR = Base::AR,
                       CR = Base::CR, MT = Base::MT;
  static constexpr int NQ = D / 8;  ///< 8-column tiles of dQ
  /// Whether dO stays in registers for the whole walk (as K and V in the
  /// other kernel).
  static constexpr bool kResident = Base::Shape::W <= 64;
  Tensor4<T, ExecSpace> dq;

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    const int H = int(this->q.extent(1)), S = int(this->q.extent(2)), Sk = int(this->k.extent(2));
    const int blocks = (S + BQ - 1) / BQ;
    const int block = item % blocks, bh = item / blocks;
    const int b = bh / H, h = bh % H, i0 = block * BQ;
    const int rows = S - i0 < BQ ? S - i0 : BQ;
    kdnn::impl::ScratchCarver carver(scratch);
    const auto w = Base::carve(carver);

    // Per thread, for the whole block: the scale·Q and dO fragments (dO
    // where resident), its
    // rows' visible keys, lse and δ, its dQ accumulators; per key tile S
    // (then dS') and dPd.
    kdnn::impl::ThreadRegisters<T, NT, MT * KD * AR, kPrivate> qf;
    const auto df = Base::template fragments<DV, kResident>(this->dout, b, h, i0, rows, T(1));
    kdnn::impl::ThreadRegisters<int, NT, 2 * RT, kPrivate> range;      // first, last
    kdnn::impl::ThreadRegisters<T, NT, 2 * RT, kPrivate> lse_delta;    // lse, δ
    kdnn::impl::ThreadRegisters<T, NT, MT * NK * CR, kPrivate> sacc;   // S, then dS'
    kdnn::impl::ThreadRegisters<T, NT, MT * NK * CR, kPrivate> dpacc;  // dPd
    kdnn::impl::ThreadRegisters<T, NT, MT * NQ * CR, kPrivate> dqacc;  // dQ / scale

    threads(team, [&](int t) {
      Base::template load_a<D>(t, qf, this->q, b, h, i0, rows, this->scale);
      df.load(t);
      // Each row once, at its even column of the first tile.
      Base::template each_accumulator<1>(t, [&](int, int slot, int row, int col) {
        if (col % 2 != 0) return;
        int& first = range(t)[slot];
        int& last = range(t)[RT + slot];
        if (row < rows) {
          this->visible.range(b, i0 + row, first, last);
        } else {
          first = last = 0;
        }
        lse_delta(t)[slot] = row < rows ? this->lse(b, h, i0 + row) : T(0);
        lse_delta(t)[RT + slot] = row < rows ? this->delta(b, h, i0 + row) : T(0);
      });
      KDNN_IMPL_UNROLL
      for (int e = 0; e < MT * NQ * CR; ++e) dqacc(t)[e] = T(0);
    });

    const auto seen = this->visible.team_bounds(team, b, i0, rows);
    for (int j0 = seen.lo / BK * BK; j0 < seen.hi; j0 += BK) {
      const int cols = Sk - j0 < BK ? Sk - j0 : BK;
      team.team_barrier();  // the previous tile is done with kt and vt
      Base::template load_tile<D>(team, this->k, b, h, j0, cols, T(1), w.kt, LDK);
      Base::template load_tile<DV>(team, this->v, b, h, j0, cols, T(1), w.vt, LDV);
      team.team_barrier();

      Base::template tile_rows_product<D>(team, kdnn::impl::registers_at(qf, 0), w.kt, LDK, sacc);
      Base::template tile_rows_product<DV>(team, df, w.vt, LDV, dpacc);
      threads(team, [&](int t) {
        Base::template each_accumulator<NK>(t, [&](int e, int slot, int row, int col) {
          const int key = j0 + col;
          const bool visible = (key >= range(t)[slot]) & (key < range(t)[RT + slot]);
          const bool keep = !this->dropout.active ||
                            this->dropout.keep(std::uint64_t(bh) * S * Sk +
                                               std::uint64_t(i0 + row) * Sk + std::uint64_t(key));
          T pd, ds;
          this->grads(sacc(t)[e], dpacc(t)[e], visible, keep, lse_delta(t)[slot],
                      lse_delta(t)[RT + slot], pd, ds);
          sacc(t)[e] = ds;
        });
      });
      Base::template accumulator_product<D>(team, sacc, w.kt, LDK, dqacc);
    }

    threads(team, [&](int t) {
      Base::template each_accumulator<NQ>(t, [&](int e, int, int row, int col) {
        if (row < rows) dq(b, h, i0 + row, col) = this->scale * dqacc(t)[e];
      });
    });
  }
};

}  // namespace kdnn::attention::impl
