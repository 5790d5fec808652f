// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The fused attention backward, tensor-core form (the forward's:
// fused_forward_mma_kernel.hpp), for D and DV in MmaHeadSizes: one kernel,
// five products per tile, as FlashAttention-2's, with P = e^{s − lse}
// recomputed and δ = rowsum(dO∘O).
//
// A team of four warps owns BK keys (each warp Mma::M of them, float 16,
// double 8) and walks the tiles of BQ queries that see them. Per tile, with
// the keys as the rows of every product:
//  * Sᵀ = K·(scale·Q)ᵀ and dPdᵀ = V·dOᵀ (MmaOrder::transposed: Sᵀ is
//    bitwise the transpose of the forward's S, so a row whose probability
//    is all at one key gets P = 1 there and dS' = 0 however large the
//    scale, FusedBackwardData::grads); dS'ᵀ = Pᵀ∘(dPdᵀ − δ) on the
//    accumulators;
//  * dV += Pdᵀ·dO and dK += dS'ᵀ·(scale·Q), the accumulators as the A
//    operand in place;
//  * dS' through scratch, then the tile's share of dQ,
//    dQᵀ/scale = Kᵀ·dS'ᵀ (the head's D dimension as rows, in passes of the
//    team's rows), added to dQ in global memory.
// The A fragments of K, V and Kᵀ are read where a product needs them (from
// L1): kept in registers beside the accumulators, they spilled (ptxas,
// CUDA 11.8, sm_90, float with D = Dv = 64: 464 bytes), read they do not.
//
// dQ without atomics, in a fixed order: the key blocks that may see a query
// tile are those over the hull of its rows' visible keys; each adds its
// share in turn, block by block from the lowest, waiting on the tile's turn
// counter (`turns`, zeroed before the launch, as dQ is). Teams take their
// blocks in order (TeamWork::claims), so the block a team waits for has
// been started by a running team and the wait ends. The sums are the same
// whatever the timing, so the result is bitwise reproducible.
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "kdnn/attention/impl/flash_mma_team.hpp"
#include "kdnn/attention/impl/fused_backward_data.hpp"
#include "kdnn/attention/impl/row_blocks.hpp"
#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/unroll.hpp"

namespace kdnn::attention::impl {

/// The backward on tensor cores: one team per (b, h, block of BK keys).
template <class ExecSpace, class T, int D, int DV, kdnn::impl::MmaPrecision P>
struct FusedBackwardMmaKernel
    : FusedBackwardData<ExecSpace, T>,
      FlashMmaTeam<FusedBackwardMmaKernel<ExecSpace, T, D, DV, P>, ExecSpace, T, D, DV, P,
                   FlashMmaShape<T, D, DV>::BK / 2> {
  using Base =
      FlashMmaTeam<FusedBackwardMmaKernel, ExecSpace, T, D, DV, P, FlashMmaShape<T, D, DV>::BK / 2>;
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
  static constexpr int LDS = BK + 4;             ///< dS' row stride in scratch
  kdnn::impl::StridedRows4<T> dq, dk, dv;
  /// Per (b, h, query tile): how many key blocks have added their share of
  /// dQ (zeroed before the launch).
  int* turns = nullptr;

  /// The streamed tiles, scale·Q [BQ, LDK] and dO [BQ, LDV], their rows'
  /// visible keys, lse and δ, and dS' [BQ, LDS].
  struct Work {
    T *qt, *dot, *lse, *delta, *ds;
    int *first, *last;
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s) {
    Work w;
    w.qt = s.take<T>(BQ * LDK);
    w.dot = s.take<T>(BQ * LDV);
    w.ds = s.take<T>(BQ * LDS);
    w.lse = s.take<T>(BQ);
    w.delta = s.take<T>(BQ);
    w.first = s.take<int>(BQ);
    w.last = s.take<int>(BQ);
    return w;
  }

  /// Kᵀ of the team's keys as a view (b, h, d, key), zero past its `cols`
  /// keys: the A operand of dQᵀ (its rows d past k's columns are not read:
  /// add_dq's passes stop at them).
  struct KeysTransposed {
    kdnn::impl::StridedRows4<const T> k;
    int j0, cols;
    KOKKOS_INLINE_FUNCTION T operator()(int b, int h, int d, int key) const {
      return key < cols ? k(b, h, j0 + key, d) : T(0);
    }
    /// Its columns (extent 3): the keys.
    KOKKOS_INLINE_FUNCTION std::size_t extent(int) const { return std::size_t(cols); }
  };

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    const int tiles = (int(this->q.extent(2)) + BQ - 1) / BQ;  // query tiles of the longest entry
    const RowBlock kb = this->blocks(item);
    const int bh = kb.bh, b = kb.b, h = kb.h, j0 = kb.start, jb = j0 / BK, cols = kb.count;
    const int queries = this->q.rows(b);  // the entry's queries
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver);

    const auto kf = Base::template fragments<D>(this->k, b, this->kv_head(h), j0, cols, T(1));
    const auto vf = Base::template fragments<DV>(this->v, b, this->kv_head(h), j0, cols, T(1));
    const KeysTransposed kt{this->k, j0, cols};
    kdnn::impl::ThreadRegisters<T, NT, MT * NK * CR, kPrivate> sacc;   // Sᵀ, Pdᵀ, then dQᵀ
    kdnn::impl::ThreadRegisters<T, NT, MT * NK * CR, kPrivate> dpacc;  // dPdᵀ, then dS'ᵀ
    kdnn::impl::ThreadRegisters<T, NT, MT * ND * CR, kPrivate> dkacc;
    kdnn::impl::ThreadRegisters<T, NT, MT * NV * CR, kPrivate> dvacc;
    threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int e = 0; e < MT * ND * CR; ++e) dkacc(t)[e] = T(0);
      KDNN_IMPL_UNROLL
      for (int e = 0; e < MT * NV * CR; ++e) dvacc(t)[e] = T(0);
    });

    for (int i0 = 0; i0 < queries; i0 += BQ) {
      const int rows = queries - i0 < BQ ? queries - i0 : BQ;  // the tile's queries
      // The key blocks that add to this tile's dQ: those over the hull of
      // its rows' visible keys; this one's turn among them.
      int lo = 0, hi = 0;
      this->visible.hull(team, b, i0, rows, lo, hi);
      if (j0 >= hi || j0 + BK <= lo) continue;
      const int turn = jb - lo / BK;
      int& tile_turns = turns[std::size_t(bh) * tiles + i0 / BQ];

      team.team_barrier();  // the previous tile is done with the scratch
      int any = 0;
      this->load_rows(team, b, h, i0, rows, w.first, w.last, w.lse, w.delta, j0, j0 + cols, any);
      if (any) {
        Base::template load_tile<D>(team, this->q, b, h, i0, rows, this->scale, w.qt, LDK);
        Base::template load_tile<DV>(team, this->dout, b, h, i0, rows, T(1), w.dot, LDV);
        team.team_barrier();
        tile_products(team, bh, i0, j0, w, kf, vf, sacc, dpacc, dkacc, dvacc);
        team.team_barrier();  // dS' is in scratch
      }
      wait_for_turn(team, tile_turns, turn);
      // No visible key (a hull with a gap): nothing to add, but the turn.
      if (any) add_dq(team, b, h, i0, rows, kt, w, sacc);
      pass_turn(team, tile_turns);
    }

    // Columns past the call's head sizes (rounded up to D and DV) are not
    // stored.
    const int d_qk = int(dk.extent(3)), d_v = int(dv.extent(3));
    threads(team, [&](int t) {
      Base::template each_accumulator<ND>(t, [&](int e, int, int row, int col) {
        if (row < cols && col < d_qk)
          this->store(this->add_dkv, dk(b, h, j0 + row, col), dkacc(t)[e]);
      });
      Base::template each_accumulator<NV>(t, [&](int e, int, int row, int col) {
        if (row < cols && col < d_v)
          this->store(this->add_dkv, dv(b, h, j0 + row, col), dvacc(t)[e]);
      });
    });
  }

  /// One tile's first four products and its dS' into scratch (above).
  template <class KF, class VF, class Acc, class DkAcc, class DvAcc>
  KOKKOS_INLINE_FUNCTION void tile_products(const Member& team, int bh, int i0, int j0,
                                            const Work& w, const KF& kf, const VF& vf, Acc& sacc,
                                            Acc& dpacc, DkAcc& dkacc, DvAcc& dvacc) const {
    const int S = int(this->q.extent(2)), Sk = int(this->k.extent(2));
    constexpr auto transposed = kdnn::impl::MmaOrder::transposed;
    Base::template tile_rows_product<D, transposed>(team, kf, w.qt, LDK, sacc);
    Base::template tile_rows_product<DV, transposed>(team, vf, w.dot, LDV, dpacc);
    const AlibiRow<T> bias = this->alibi(bh);
    // Accumulator (row, col): key j0 + row, query i0 + col.
    threads(team, [&](int t) {
      Base::template each_accumulator<NK>(t, [&](int e, int, int row, int col) {
        const int key = j0 + row;
        const bool visible = (key >= w.first[col]) & (key < w.last[col]);
        const bool keep = !this->dropout.active || this->dropout.keep(bh, i0 + col, key, S, Sk);
        T pd, ds;
        this->grads(sacc(t)[e], bias(i0 + col, key), dpacc(t)[e], visible, keep, w.lse[col],
                    w.delta[col], pd, ds);
        sacc(t)[e] = pd;
        dpacc(t)[e] = ds;
        w.ds[col * LDS + row] = ds;
      });
    });
    Base::template accumulator_product<DV>(team, sacc, w.dot, LDV, dvacc);
    Base::template accumulator_product<D>(team, dpacc, w.qt, LDK, dkacc);
  }

  /// dQ += scale·dS'·K for the tile's rows, in passes of the team's rows
  /// over D: dQᵀ/scale = Kᵀ·dS'ᵀ, dS' [BQ queries, BK keys] from scratch.
  /// Reads dQ past L1 (volatile): another team on this multiprocessor may
  /// have read the same rows before their last share was added.
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void add_dq(const Member& team, int b, int h, int i0, int rows,
                                     const KeysTransposed& kt, const Work& w, Acc& acc) const {
    constexpr int R = NT / 32 * Base::WR;  // rows of D per pass
    const int d_qk = int(dq.extent(3));    // at most D: a head size rounded up to it
    for (int d0 = 0; d0 < d_qk; d0 += R) {
      const auto ktf = Base::template fragments<BK>(kt, b, this->kv_head(h), d0, d_qk - d0, T(1));
      Base::template tile_rows_product<BK>(team, ktf, w.ds, LDS, acc);
      threads(team, [&](int t) {
        Base::template each_accumulator<NK>(t, [&](int e, int, int row, int col) {
          if (d0 + row >= d_qk || col >= rows) return;
          volatile T* out = &dq(b, h, i0 + col, d0 + row);
          *out = *out + this->scale * acc(t)[e];
        });
      });
    }
  }

  /// Waits until `turn` key blocks have added their share to the tile.
  static KOKKOS_INLINE_FUNCTION void wait_for_turn(const Member& team, int& tile_turns, int turn) {
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      while (Kokkos::atomic_fetch_add(&tile_turns, 0) != turn) {
      }
      Kokkos::memory_fence();  // the shares added before are seen after this
    });
    team.team_barrier();
  }

  /// Passes the tile's turn to the next key block, once this team's share
  /// of dQ is written.
  static KOKKOS_INLINE_FUNCTION void pass_turn(const Member& team, int& tile_turns) {
    Kokkos::memory_fence();  // each thread's share is out before the turn passes
    team.team_barrier();
    Kokkos::single(Kokkos::PerTeam(team), [&]() { Kokkos::atomic_fetch_add(&tile_turns, 1); });
  }
};

}  // namespace kdnn::attention::impl
