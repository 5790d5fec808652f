// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What every form of the fused attention backward reads (the host kernels,
// fused_backward_kernels.hpp, and the GPU forms,
// fused_backward_gpu_kernels.hpp), and the gradients of one (query, key)
// pair, computed alike by all of them.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "kdnn/attention/impl/fused_forward_rules.hpp"
#include "kdnn/core/impl/exp_vectorisable.hpp"
#include "kdnn/core/impl/team_gemm.hpp"
#include "kdnn/core/impl/team_work.hpp"

namespace kdnn::attention::impl {

/// What both backward kernels read, and the gradients of one (query, key)
/// pair.
template <class ExecSpace, class T>
struct FusedBackwardData {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Tile = kdnn::impl::GemmTile<ExecSpace, T>;
  /// [B,H,S,D], [B,Hkv,Sk,D], [B,Hkv,Sk,Dv], [B,H,S,Dv]; any strides, the
  /// last dimension contiguous
  kdnn::impl::StridedRows4<const T> q, k, v, dout;  ///< dense or packed, as the forward's
  kdnn::impl::StridedRows3<const T> lse, delta;     ///< [B, H, S]
  VisibleKeys<ExecSpace> visible;
  DropoutMask dropout;
  T scale = 1, keep_scale = 1;
  ScoreCap<T> softcap;  ///< applied to the scaled scores, as in the forward
  int bq = 1, bk = 1;   ///< multiples of Tile::align
  int group = 1;        ///< query heads per key/value head, H / Hkv
  /// Add the kernels' dQ (add_dq) and dK, dV (add_dkv) into the outputs'
  /// values on entry instead of overwriting them.
  bool add_dq = false, add_dkv = false;
  kdnn::impl::TeamWork work;  ///< set by the launch
  /// The launch's items: blocks of keys (dK, dV) or of queries (dQ), set
  /// by the launch
  RowBlocks<ExecSpace> blocks;

  /// out ← value, or out += value when `add`: an output element's store,
  /// one select and no branch (the kernels' stores sit in unrolled loops).
  template <class Out>
  static KOKKOS_FORCEINLINE_FUNCTION void store(bool add, Out& out, T value) {
    out = add ? T(out + value) : value;
  }

  /// The key/value head query head h reads (grouped-query attention). The
  /// kernels write dK and dV per query head; the group's sum is taken after.
  KOKKOS_INLINE_FUNCTION int kv_head(int h) const { return h / group; }

  /// ALiBi's bias of bh = b·H + h, added to the capped scores.
  KOKKOS_INLINE_FUNCTION AlibiRow<T> alibi(int bh) const {
    const int H = int(q.extent(1));
    return visible.template alibi<T>(bh / H, bh % H);
  }

  /// Pd and dS' (dS without the scale) of a pair from its score
  /// s = (scale·q)·k, ALiBi's `bias` and dPd = dO·v: P is 0 where the pair
  /// is hidden (whatever lse is), `keep` is dropout's test. With a score
  /// cap, P is that of the capped score and dS' carries the cap's slope;
  /// `Capped` false: the caller knows there is no cap (the same results,
  /// and a loop body without tanh's call, which a host compiler vectorises).
  template <bool Capped = true>
  KOKKOS_FORCEINLINE_FUNCTION void grads(T s, T bias, T dpd, bool seen, bool keep, T row_lse,
                                         T row_delta, T& pd, T& ds) const {
    T slope = T(1);
    if constexpr (Capped) s = softcap(s, slope);
    s += bias;
    const T e = kdnn::impl::exp_vectorisable(s - row_lse);
    const T p = seen ? e : T(0);
    const T kept = keep ? keep_scale : T(0);
    pd = p * kept;
    // Where a row's probability is all at this key (p rounds to 1), δ =
    // Σ_j P_ij dP_ij is this key's dP up to terms below p's rounding, so
    // dS' = 0. Computed, δ = dO·O and dPd·kept come from different sums
    // (which a compiler may also contract into FMAs differently), and their
    // rounding difference would survive, multiplied by the scale in dQ, dK.
    ds = p == T(1) ? T(0) : p * (dpd * kept - row_delta) * slope;
  }

  /// Calls grads for every (row, column) pair of a tile through `sweep`
  /// (team_sweep with the tile's loop order), with dropout's test only
  /// when dropout is on and the mask's only when the tile is not
  /// `unmasked` (every pair seen) and the cap's only with a cap. at(r, c)
  /// gives the pair's s and dPd by reference, which it overwrites with Pd
  /// and dS.
  template <class Sweep, class At>
  KOKKOS_INLINE_FUNCTION void tile_grads(const Sweep& sweep, int bh, int i0, int j0, bool unmasked,
                                         const int* first, const int* last, const T* row_lse,
                                         const T* row_delta, const At& at) const {
    const int S = int(q.extent(2)), Sk = int(k.extent(2));
    const AlibiRow<T> bias = alibi(bh);
    const auto one = [&](int r, int c, bool keep, auto all_seen, auto capped) {
      const int j = j0 + c;
      T& s = at.s(r, c);
      T& dp = at.dp(r, c);
      T pd, ds;
      const bool seen = decltype(all_seen)::value || ((j >= first[r]) & (j < last[r]));
      grads<decltype(capped)::value>(s, bias(i0 + r, j), dp, seen, keep, row_lse[r], row_delta[r],
                                     pd, ds);
      s = pd;
      dp = ds;
    };
    const auto each = [&](auto all_seen, auto capped) {
      if (dropout.active) {
        sweep([&](int r, int c) {
          one(r, c, dropout.keep(bh, i0 + r, j0 + c, S, Sk), all_seen, capped);
        });
      } else {
        sweep([&](int r, int c) { one(r, c, true, all_seen, capped); });
      }
    };
    const auto with_cap = [&](auto all_seen) {
      if (softcap.cap != T(0)) {
        each(all_seen, std::true_type{});
      } else {
        each(all_seen, std::false_type{});
      }
    };
    if (unmasked) {
      with_cap(std::true_type{});
    } else {
      with_cap(std::false_type{});
    }
  }

  /// The rows [i0, i0 + rows) of a query tile: their visible keys (none for
  /// pad rows), lse and δ; returns through `any` whether a row sees a key of
  /// [j_lo, j_hi).
  KOKKOS_INLINE_FUNCTION void load_rows(const Member& team, int b, int h, int i0, int rows,
                                        int* first, int* last, T* row_lse, T* row_delta, int j_lo,
                                        int j_hi, int& any) const {
    Kokkos::parallel_reduce(
        Kokkos::TeamVectorRange(team, bq),
        [&](int r, int& seen) {
          int f = 0, e = 0;
          if (r < rows) visible.range(b, i0 + r, f, e);
          first[r] = f, last[r] = e;
          row_lse[r] = r < rows ? lse(b, h, i0 + r) : T(0);
          row_delta[r] = r < rows ? delta(b, h, i0 + r) : T(0);
          // Every row gives 0 or 1: Max's identity (the least int) must not
          // survive into `any` when no row sees a key.
          const int hit = (f > j_lo ? f : j_lo) < (e < j_hi ? e : j_hi) ? 1 : 0;
          seen = hit > seen ? hit : seen;
        },
        Kokkos::Max<int>(any));
  }
};

}  // namespace kdnn::attention::impl
