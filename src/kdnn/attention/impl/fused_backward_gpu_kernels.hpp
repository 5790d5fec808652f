// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The fused attention backward, GPU form (kdnn::KernelForm::gpu), for a
// compile-time pair of head sizes D and DV (flash_backward_head_sizes):
// FlashAttention-2's
// backward on SIMT threads, in the two kernels of the host form's
// per_key_block schedule (fused_backward_kernels.hpp, whose formulas and
// FusedBackwardData::grads it uses):
//  * FusedBackwardKVGpuKernel: a team owns BR keys of a head and walks the
//    query tiles (BC queries) that see them, accumulating dK and dV;
//  * FusedBackwardQGpuKernel: a team owns BR queries and walks the key tiles
//    (BC keys) they see, accumulating dQ.
// Each team writes only what it owns: no atomics, every sum in a fixed order.
//
// The team's NT threads form a grid of RG row groups × CG = 8 column groups.
// Thread (g, c) owns RM of the team's rows (keys or queries) and, of their
// gradients, the columns c·DC … (DC = D / 8), in registers across the whole
// walk; per streamed tile it computes an RM × RN micro-tile of the scores
// and of dO·Vᵀ (the tile's items c·RN …), turns them into Pd and dS' with
// grads() and puts them in scratch, from where every thread takes the rows
// it needs for its gradient columns (dQ and dK: DC = D / 8 of them, dV:
// DVC = DV / 8). The tiles in scratch, [rows, D] (K, scale·Q) and
// [rows, DV] (V, dO), have a row stride of D + 1 and DV + 1, so that a thread walking a row
// and the threads reading one column of several rows both hit distinct
// banks. Every product is register_tile_product: team_gemm's summation
// order, so the recomputed scores are bitwise the forward's (both forms'),
// which a huge |scale| needs, and the gradients agree with the host form's
// to rounding (their tiles sum other ranges of queries and keys).
//
// Sizes, by the wider head W = max(D, DV): BR = BC = 32 (float) or 16
// (double) for W <= 64, 16 or 8 for W = 128, and 8 for float W = 256
// (double W = 256 would not fit on-chip and keeps the host form), so that a
// team's scratch stays within 48 KiB.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kdnn/attention/impl/fused_backward_data.hpp"
#include "kdnn/attention/impl/fused_forward_gpu_kernel.hpp"
#include "kdnn/attention/impl/row_blocks.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/compiled_sizes.hpp"
#include "kdnn/core/impl/register_team.hpp"
#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/unroll.hpp"

namespace kdnn::attention::impl {

/// The head sizes the backward's GPU form is compiled for, each of D and Dv:
/// the forward's, but for double not 256 (its tiles would pass the scratch).
template <class T>
using FlashBackwardHeadSizes =
    std::conditional_t<(sizeof(T) > 4), kdnn::impl::CompiledSizes<32, 64, 128>, FlashHeadSizes>;

/// Block sizes and thread grid of the backward's GPU form (see above).
template <class T, int D, int DV>
struct FlashBackwardShape {
  static constexpr bool wide = sizeof(T) > 4;
  static constexpr int W = std::max(D, DV);
  static constexpr int BR = W <= 64 ? (wide ? 16 : 32) : W == 128 ? (wide ? 8 : 16) : 8;
  static constexpr int BC = BR;  ///< items per streamed tile
  static constexpr int RM = BR >= 32 ? BR / 16 : 1;
  static constexpr int RG = BR / RM;   ///< row groups
  static constexpr int CG = 8;         ///< column groups
  static constexpr int RN = BC / CG;   ///< streamed items per thread
  static constexpr int NT = RG * CG;   ///< threads per team
  static constexpr int DC = D / CG;    ///< dQ or dK columns per thread
  static constexpr int DVC = DV / CG;  ///< dV columns per thread
  static constexpr int LD = D + 1;     ///< row stride of [rows, D] tiles
  static constexpr int LDV = DV + 1;   ///< row stride of [rows, DV] tiles
  static constexpr int LDT = BC + 1;   ///< row stride of the pair tiles
  static_assert(BR % RM == 0 && BC % CG == 0 && D % CG == 0 && DV % CG == 0, "FlashBackwardShape");
};

/// What both GPU backward kernels share: the shape, the scratch layout, tile
/// loads and the pairs' gradients (the team and its launch body:
/// RegisterTeam). Derived provides `one_block(team, item, scratch)`.
template <class Derived, class ExecSpace, class T, int D, int DV>
struct FlashBackwardBase
    : FusedBackwardData<ExecSpace, T>,
      kdnn::impl::RegisterTeam<Derived, ExecSpace, FlashBackwardShape<T, D, DV>::NT> {
  using Shape = FlashBackwardShape<T, D, DV>;
  using Team = kdnn::impl::RegisterTeam<Derived, ExecSpace, Shape::NT>;
  using Team::kPrivate;
  using Team::threads;
  using typename Team::Member;
  static constexpr int BR = Shape::BR, BC = Shape::BC, RM = Shape::RM, RN = Shape::RN,
                       CG = Shape::CG, NT = Shape::NT, DC = Shape::DC, DVC = Shape::DVC,
                       LD = Shape::LD, LDV = Shape::LDV, LDT = Shape::LDT;

  /// The team's tiles `own_a` [BR, LD] and `own_b` [BR, LDV] (K and V, or
  /// scale·Q and dO), the streamed tile's `str_a` [BC, LD] and `str_b`
  /// [BC, LDV] (scale·Q and dO, or K and V),
  /// the [BR, LDT] pair tiles Pd (for dV only) and dS', and the data of the
  /// BR = BC query rows in play (ranges of visible keys, lse, δ).
  struct Work {
    T *own_a, *own_b, *str_a, *str_b, *pd, *ds, *lse, *delta;
    int *first, *last;
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s) {
    Work w;
    w.own_a = s.take<T>(BR * LD);
    w.own_b = s.take<T>(BR * LDV);
    w.str_a = s.take<T>(BC * LD);
    w.str_b = s.take<T>(BC * LDV);
    w.pd = Derived::kWithPd ? s.take<T>(BR * LDT) : nullptr;
    w.ds = s.take<T>(BR * LDT);
    w.lse = s.take<T>(BC);
    w.delta = s.take<T>(BC);
    w.first = s.take<int>(BC);
    w.last = s.take<int>(BC);
    return w;
  }

  /// Copies `count` rows of a [B, H, rows, ≤ Width] view (from row i0 of
  /// head (b, h)) into a [n, Width + 1] scratch tile, times `factor`, pad
  /// rows and the columns past the view's (a head size rounded up to
  /// Width) zero.
  template <int Width, class View>
  static KOKKOS_INLINE_FUNCTION void load_tile(const Member& team, const View& view, int b, int h,
                                               int i0, int count, int n, T factor, T* dst) {
    const int width = int(view.extent(3));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n * Width), [&](int e) {
      const int r = e / Width, d = e % Width;
      dst[r * (Width + 1) + d] = r < count && d < width ? factor * view(b, h, i0 + r, d) : T(0);
    });
  }

  /// Pd and dS' of the thread's micro-tile, from its rows `own` (RM, at
  /// `own0` of the tile `own_tile`) and the streamed items (RN, at `str0`
  /// of `str_tile`): the scores from the [rows, LD] tiles of scale·Q and K
  /// (either side may hold the queries), dO·Vᵀ from dO and V ([rows, LDV]
  /// tiles).
  /// put(i, j, pd, ds) receives each pair's values; `query(i, j)` and
  /// `key(i, j)` give the pair's absolute query row within the tile's
  /// per-query data (lse, δ, ranges: index into `first`…) and key index.
  template <class QueryRow, class Key, class Put>
  KOKKOS_INLINE_FUNCTION void pair_grads(const T* own_a, const T* str_a, const T* own_b,
                                         const T* str_b, int bh, int q_row0, const int* first,
                                         const int* last, const T* row_lse, const T* row_delta,
                                         const QueryRow& query, const Key& key,
                                         const Put& put) const {
    const int S = int(this->q.extent(2)), Sk = int(this->k.extent(2));
    T s[RM * RN], dp[RM * RN];
    kdnn::impl::register_tile_product<RM, RN, D>(own_a, 1, LD, str_a, 1, LD, s);
    kdnn::impl::register_tile_product<RM, RN, DV>(own_b, 1, LDV, str_b, 1, LDV, dp);
    const AlibiRow<T> bias = this->alibi(bh);
    KDNN_IMPL_UNROLL
    for (int i = 0; i < RM; ++i) {
      KDNN_IMPL_UNROLL
      for (int j = 0; j < RN; ++j) {
        const int r = query(i, j), c = key(i, j);
        const bool seen = (c >= first[r]) & (c < last[r]);  // pad rows and keys: unseen
        const bool keep = !this->dropout.active || this->dropout.keep(bh, q_row0 + r, c, S, Sk);
        T pd, ds;
        this->grads(s[i * RN + j], bias(q_row0 + r, c), dp[i * RN + j], seen, keep, row_lse[r],
                    row_delta[r], pd, ds);
        put(i, j, pd, ds);
      }
    }
  }
};

/// dK and dV: one team per (b, h, block of BR keys).
template <class ExecSpace, class T, int D, int DV>
struct FusedBackwardKVGpuKernel
    : FlashBackwardBase<FusedBackwardKVGpuKernel<ExecSpace, T, D, DV>, ExecSpace, T, D, DV> {
  using Base = FlashBackwardBase<FusedBackwardKVGpuKernel, ExecSpace, T, D, DV>;
  using typename Base::Work;
  static constexpr bool kWithPd = true;
  using Base::BC;
  using Base::BR;
  using Base::DC;
  using Base::DVC;
  using Base::LD;
  using Base::LDT;
  using Base::LDV;
  using Base::NT;
  using Base::RM;
  using Base::RN;
  using typename Base::Member;
  static constexpr int CG = Base::CG;
  static constexpr int BQ = BC, BK = BR;  ///< queries per tile, keys per team
  kdnn::impl::StridedRows4<T> dk, dv;

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    const RowBlock kb = this->blocks(item);
    const int bh = kb.bh, b = kb.b, h = kb.h, j0 = kb.start, cols = kb.count;
    const int queries = this->q.rows(b);  // the entry's queries
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = Base::carve(carver);
    kdnn::impl::ThreadRegisters<T, NT, RM*(DC + DVC), Base::kPrivate> grad;  // dK, then dV

    Base::template load_tile<D>(team, this->k, b, this->kv_head(h), j0, cols, BR, T(1), w.own_a);
    Base::template load_tile<DV>(team, this->v, b, this->kv_head(h), j0, cols, BR, T(1), w.own_b);
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int e = 0; e < RM * (DC + DVC); ++e) grad(t)[e] = T(0);
    });
    for (int i0 = 0; i0 < queries; i0 += BC) {
      const int rows = queries - i0 < BC ? queries - i0 : BC;
      team.team_barrier();  // the previous tile is done with
      int any = 0;
      this->load_rows(team, b, h, i0, rows, w.first, w.last, w.lse, w.delta, j0, j0 + cols, any);
      if (!any) continue;  // no query of the tile sees these keys
      Base::template load_tile<D>(team, this->q, b, h, i0, rows, BC, this->scale, w.str_a);
      Base::template load_tile<DV>(team, this->dout, b, h, i0, rows, BC, T(1), w.str_b);
      team.team_barrier();
      // Thread (g, c): keys g·RM …, queries c·RN … of the tile.
      Base::threads(team, [&](int t) {
        const int k0 = (t / CG) * RM, r0 = (t % CG) * RN;
        this->pair_grads(
            w.own_a + k0 * LD, w.str_a + r0 * LD, w.own_b + k0 * LDV, w.str_b + r0 * LDV, bh, i0,
            w.first, w.last, w.lse, w.delta, [&](int, int j) { return r0 + j; },
            [&](int i, int) { return j0 + k0 + i; },
            [&](int i, int j, T pd, T ds) {
              w.pd[(k0 + i) * LDT + r0 + j] = pd;
              w.ds[(k0 + i) * LDT + r0 + j] = ds;
            });
      });
      team.team_barrier();
      // dV += Pdᵀ·dO and dK += dS'ᵀ·(scale·Q), the thread's keys and columns.
      Base::threads(team, [&](int t) {
        const int k0 = (t / CG) * RM, c = t % CG;
        T* dk_t = grad(t);
        T* dv_t = grad(t) + RM * DC;
        T dv_tile[RM * DVC];
        kdnn::impl::register_tile_product<RM, DVC, BC>(w.pd + k0 * LDT, 1, LDT, w.str_b + c * DVC,
                                                       LDV, 1, dv_tile);
        KDNN_IMPL_UNROLL
        for (int e = 0; e < RM * DVC; ++e) dv_t[e] += dv_tile[e];
        T dk_tile[RM * DC];
        kdnn::impl::register_tile_product<RM, DC, BC>(w.ds + k0 * LDT, 1, LDT, w.str_a + c * DC, LD,
                                                      1, dk_tile);
        KDNN_IMPL_UNROLL
        for (int e = 0; e < RM * DC; ++e) dk_t[e] += dk_tile[e];
      });
    }
    // The call's head sizes (at most D and DV: the columns past them were
    // zero and are not stored).
    const int d_qk = int(dk.extent(3)), d_v = int(dv.extent(3));
    // Written, or added to the outputs' values (add_dkv): chosen once, not
    // per element (FusedBackwardData::store) in these unrolled register
    // stores, where a per-element choice multiplied nvcc's compile time of
    // the kernels by more than five.
    const auto store = [&](auto put) {
      Base::threads(team, [&](int t) {
        const int k0 = (t / CG) * RM, c = t % CG;
        KDNN_IMPL_UNROLL
        for (int i = 0; i < RM; ++i) {
          if (k0 + i >= cols) continue;
          KDNN_IMPL_UNROLL
          for (int j = 0; j < DC; ++j) {
            if (c * DC + j < d_qk) put(dk(b, h, j0 + k0 + i, c * DC + j), grad(t)[i * DC + j]);
          }
          KDNN_IMPL_UNROLL
          for (int j = 0; j < DVC; ++j) {
            if (c * DVC + j < d_v)
              put(dv(b, h, j0 + k0 + i, c * DVC + j), grad(t)[RM * DC + i * DVC + j]);
          }
        }
      });
    };
    if (this->add_dkv) {
      store([](T& out, T value) { out += value; });
    } else {
      store([](T& out, T value) { out = value; });
    }
  }
};

/// dQ: one team per (b, h, block of BR queries).
template <class ExecSpace, class T, int D, int DV>
struct FusedBackwardQGpuKernel
    : FlashBackwardBase<FusedBackwardQGpuKernel<ExecSpace, T, D, DV>, ExecSpace, T, D, DV> {
  using Base = FlashBackwardBase<FusedBackwardQGpuKernel, ExecSpace, T, D, DV>;
  using typename Base::Work;
  static constexpr bool kWithPd = false;
  using Base::BC;
  using Base::BR;
  using Base::DC;
  using Base::LD;
  using Base::LDT;
  using Base::LDV;
  using Base::NT;
  using Base::RM;
  using Base::RN;
  using typename Base::Member;
  static constexpr int CG = Base::CG;
  static constexpr int BQ = BR, BK = BC;  ///< queries per team, keys per tile
  kdnn::impl::StridedRows4<T> dq;

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    const RowBlock qb = this->blocks(item);
    const int bh = qb.bh, b = qb.b, h = qb.h, i0 = qb.start, rows = qb.count;
    const int keys = this->k.rows(b);  // the entry's keys
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = Base::carve(carver);
    kdnn::impl::ThreadRegisters<T, NT, RM * DC, Base::kPrivate> grad;  // dQ / scale

    int any = 0;
    this->load_rows(team, b, h, i0, rows, w.first, w.last, w.lse, w.delta, 0, keys, any);
    Base::template load_tile<D>(team, this->q, b, h, i0, rows, BR, this->scale, w.own_a);
    Base::template load_tile<DV>(team, this->dout, b, h, i0, rows, BR, T(1), w.own_b);
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int e = 0; e < RM * DC; ++e) grad(t)[e] = T(0);
    });
    const auto seen = this->visible.team_bounds(team, b, i0, rows);
    for (int j0 = seen.lo / BC * BC; j0 < seen.hi; j0 += BC) {
      const int cols = keys - j0 < BC ? keys - j0 : BC;
      team.team_barrier();  // the previous tile is done with
      Base::template load_tile<D>(team, this->k, b, this->kv_head(h), j0, cols, BC, T(1), w.str_a);
      Base::template load_tile<DV>(team, this->v, b, this->kv_head(h), j0, cols, BC, T(1), w.str_b);
      team.team_barrier();
      // Thread (g, c): queries g·RM …, keys c·RN … of the tile.
      Base::threads(team, [&](int t) {
        const int r0 = (t / CG) * RM, c0 = (t % CG) * RN;
        this->pair_grads(
            w.own_a + r0 * LD, w.str_a + c0 * LD, w.own_b + r0 * LDV, w.str_b + c0 * LDV, bh, i0,
            w.first, w.last, w.lse, w.delta, [&](int i, int) { return r0 + i; },
            [&](int, int j) { return j0 + c0 + j; },
            [&](int i, int j, T, T ds) { w.ds[(r0 + i) * LDT + c0 + j] = ds; });
      });
      team.team_barrier();
      // dQ/scale += dS'·K, the thread's queries and columns.
      Base::threads(team, [&](int t) {
        const int r0 = (t / CG) * RM, d0 = (t % CG) * DC;
        T tile[RM * DC];
        kdnn::impl::register_tile_product<RM, DC, BC>(w.ds + r0 * LDT, 1, LDT, w.str_a + d0, LD, 1,
                                                      tile);
        KDNN_IMPL_UNROLL
        for (int e = 0; e < RM * DC; ++e) grad(t)[e] += tile[e];
      });
    }
    const int d_qk = int(dq.extent(3));  // at most D: the columns past it are not stored
    // Written, or added to dQ's values (add_dq): chosen once, as in the KV
    // kernel.
    const auto store = [&](auto put) {
      Base::threads(team, [&](int t) {
        const int r0 = (t / CG) * RM, d0 = (t % CG) * DC;
        KDNN_IMPL_UNROLL
        for (int i = 0; i < RM; ++i) {
          if (r0 + i >= rows) continue;
          KDNN_IMPL_UNROLL
          for (int j = 0; j < DC; ++j) {
            if (d0 + j < d_qk)
              put(dq(b, h, i0 + r0 + i, d0 + j), this->scale * grad(t)[i * DC + j]);
          }
        }
      });
    };
    if (this->add_dq) {
      store([](T& out, T value) { out += value; });
    } else {
      store([](T& out, T value) { out = value; });
    }
  }
};

}  // namespace kdnn::attention::impl
