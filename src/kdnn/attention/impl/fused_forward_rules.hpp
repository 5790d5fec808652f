// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The fused attention forward's rules, which its forms (host,
// fused_forward_kernel.hpp; GPU, fused_forward_gpu_kernel.hpp; tensor
// cores, fused_forward_mma_kernel.hpp) share, and what they take: the
// operands, the mask, dropout and the scales. The rules are the element
// arithmetic of the online softmax (Milakov & Gimelshein 2018):
//   score        s = cap(x) + bias(i, j), −inf where the mask hides (i, j),
//                for the scaled product x = (scale·q_i)·k_j;
//   rescale      α = e^{m − m'} when a row's running maximum m becomes m';
//   probability  p = e^{s − m'} (0 for a hidden score);
//   dropout      p·keep_scale or 0, by element (b·H + h, i, j) of
//                [B, H, S, Sk] (the backward draws the same elements);
//   finish       O = acc / l and lse = m + log l (0 and −inf for a row that
//                saw no key).
// The forms differ only in how they move the data and multiply the tiles.
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "kdnn/attention/impl/alibi.hpp"
#include "kdnn/attention/impl/row_blocks.hpp"
#include "kdnn/attention/impl/visible_keys.hpp"
#include "kdnn/attention/types.hpp"
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/exp_vectorisable.hpp"
#include "kdnn/core/impl/philox.hpp"
#include "kdnn/core/impl/strided_rows.hpp"
#include "kdnn/core/impl/team_work.hpp"

namespace kdnn::attention::impl {

/// Dropout's keep test for element k of [B, H, S, Sk] (dropout.hpp's rule),
/// in the mask's positions (AttentionMask::Positions): query i and key j of
/// head h are element (head_begin + h, query_begin + i, key_begin + j) of
/// [B, head_count, query_length, key_length].
struct DropoutMask {
  std::uint32_t threshold = 0, key0 = 0, key1 = 0, off0 = 0, off1 = 0;
  bool active = false;
  int query_begin = 0, query_length = -1, key_begin = 0, key_length = -1;
  int head_begin = 0, head_count = -1, heads = 1;  ///< heads: the call's H

  KOKKOS_INLINE_FUNCTION bool keep(std::uint64_t k) const {
    if (!active) return true;
    const std::uint64_t g = k / 4;
    const kdnn::impl::Philox4x32 words = kdnn::impl::philox4x32_10(
        {{std::uint32_t(g), std::uint32_t(g >> 32), off0, off1}}, key0, key1);
    return words.v[k % 4] >= threshold;
  }

  /// The test for element (i, j) of head bh = b·H + h of [B, H, S, Sk].
  KOKKOS_INLINE_FUNCTION bool keep(int bh, int i, int j, int S, int Sk) const {
    if (query_length >= 0) S = query_length, i += query_begin;
    if (key_length >= 0) Sk = key_length, j += key_begin;
    if (head_count >= 0) bh = (bh / heads) * head_count + head_begin + bh % heads;
    return keep(std::uint64_t(bh) * std::uint64_t(S) * std::uint64_t(Sk) +
                std::uint64_t(i) * std::uint64_t(Sk) + std::uint64_t(j));
  }
};

/// The score cap (Gemma 2's and flash-attn's softcap): a scaled score s is
/// used as cap·tanh(s/cap), which keeps it within (−cap, cap); cap = 0: as
/// it is. The forward and the backward apply the same function.
template <class T>
struct ScoreCap {
  T cap = 0, inv = 0;  ///< cap and 1/cap (0: no cap)

  /// cap·tanh(s/cap), and through `slope` its derivative 1 − tanh²(s/cap).
  KOKKOS_FORCEINLINE_FUNCTION T operator()(T s, T& slope) const {
    if (cap == T(0)) {
      slope = T(1);
      return s;
    }
    const T t = compat::tanh(s * inv);
    slope = T(1) - t * t;
    return cap * t;
  }
  KOKKOS_FORCEINLINE_FUNCTION T operator()(T s) const {
    T slope;
    return (*this)(s, slope);
  }
};

/// What every form of the forward takes: the operands, the mask, dropout and
/// the scales, and the team work items (set by the launch); and the rules.
template <class ExecSpace, class T>
struct FusedForwardData {
  /// [B, H, S, D], [B, Hkv, Sk, D], [B, Hkv, Sk, Dv]; any strides, the last
  /// dimension contiguous (as o's); dense, or packed sequences (each entry
  /// its own rows: q.rows(b), k.rows(b))
  kdnn::impl::StridedRows4<const T> q, k, v;
  kdnn::impl::StridedRows4<T> o;     ///< [B, H, S, Dv]
  kdnn::impl::StridedRows3<T> lse;   ///< [B, H, S]
  Vector<const T, ExecSpace> sinks;  ///< [H], the query heads' sink logits; empty: none
  VisibleKeys<ExecSpace> visible;
  DropoutMask dropout;
  T scale = 1, keep_scale = 1;
  ScoreCap<T> softcap;          ///< applied to the scaled scores
  T neg_inf = 0;                ///< −infinity (set on the host)
  int group = 1;                ///< query heads per key/value head, H / Hkv
  kdnn::impl::TeamWork work;    ///< set by the launch
  RowBlocks<ExecSpace> blocks;  ///< the launch's items: blocks of queries (set by the launch)

  /// The key/value head query head h reads (grouped-query attention).
  KOKKOS_INLINE_FUNCTION int kv_head(int h) const { return h / group; }

  /// The score of query i and key j from the scaled product x: capped,
  /// plus ALiBi's bias; −inf where the mask hides the pair (seen false).
  /// Capped = false skips the cap's test, for callers that know it is off.
  template <bool Capped = true>
  KOKKOS_FORCEINLINE_FUNCTION T score(T x, bool seen, const AlibiRow<T>& bias, int i, int j) const {
    if constexpr (Capped) x = softcap(x);
    return seen ? x + bias(i, j) : neg_inf;
  }

  /// α = e^{m − m'}, which rescales a row's sums when its running maximum m
  /// becomes m' ≥ m: 1 while m' = −inf (the row has seen no score yet).
  KOKKOS_FORCEINLINE_FUNCTION T rescale(T m, T m_new) const {
    return m_new == neg_inf ? T(1) : kdnn::impl::exp_vectorisable(m - m_new);
  }

  /// e^{s − m} for a score s under the row's maximum m: 0 for a hidden
  /// score (s = −inf, where m may be −inf too and e^{s−m} NaN).
  KOKKOS_FORCEINLINE_FUNCTION T probability(T s, T m) const {
    const T e = kdnn::impl::exp_vectorisable(s - m);
    return s == neg_inf ? T(0) : e;
  }

  /// Whether dropout keeps query i's probability of key j in head bh = b·H + h.
  KOKKOS_FORCEINLINE_FUNCTION bool keeps(int bh, int i, int j) const {
    return dropout.keep(bh, i, j, int(q.extent(2)), int(k.extent(2)));
  }

  /// p after dropout's test: p·keep_scale where kept, else 0.
  KOKKOS_FORCEINLINE_FUNCTION T dropped(T p, bool keep) const {
    return keep ? p * keep_scale : T(0);
  }

  /// The end of a row of query head h: O's factor 1/l and lse = m + log l
  /// from its maximum m and sum l (0 and −inf for a row that saw no key).
  struct RowEnd {
    T inv, lse;
  };
  /// With sinks, the sink joins the sum first: m* = max(m, sink), then
  /// l* = α·l + e^{sink − m*} with α = e^{m − m*}, O's factor α/l* and
  /// lse = m* + log l* (a sink of −inf leaves every bit as without one).
  KOKKOS_FORCEINLINE_FUNCTION RowEnd finish(int h, T m, double l) const {
    if (sinks.extent(0) > 0) {
      const T sink = sinks(h);
      const T m_all = sink > m ? sink : m;
      if (m_all == neg_inf) return {T(0), neg_inf};
      const T alpha = m_all == m ? T(1) : rescale(m, m_all);
      const double l_all =
          double(alpha) * l + (sink == neg_inf ? 0.0 : double(rescale(sink, m_all)));
      return {T(double(alpha) / l_all), T(double(m_all) + compat::log(l_all))};
    }
    if (!(l > 0)) return {T(0), neg_inf};
    return {T(1 / l), T(double(m) + compat::log(l))};
  }
};

}  // namespace kdnn::attention::impl
