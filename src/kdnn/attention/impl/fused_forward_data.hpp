// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What both forms of the fused attention forward take (the host form,
// fused_forward_kernel.hpp, and the GPU form, fused_forward_gpu_kernel.hpp):
// the operands, the mask, dropout's keep test and the scales.
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "kdnn/attention/impl/alibi.hpp"
#include "kdnn/attention/impl/row_blocks.hpp"
#include "kdnn/attention/impl/visible_keys.hpp"
#include "kdnn/attention/types.hpp"
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/philox.hpp"
#include "kdnn/core/impl/strided_rows.hpp"
#include "kdnn/core/impl/team_work.hpp"

namespace kdnn::attention::impl {

/// Dropout's keep test for element k of [B, H, S, Sk] (dropout.hpp's rule).
struct DropoutMask {
  std::uint32_t threshold = 0, key0 = 0, key1 = 0, off0 = 0, off1 = 0;
  bool active = false;

  KOKKOS_INLINE_FUNCTION bool keep(std::uint64_t k) const {
    if (!active) return true;
    const std::uint64_t g = k / 4;
    const kdnn::impl::Philox4x32 words = kdnn::impl::philox4x32_10(
        {{std::uint32_t(g), std::uint32_t(g >> 32), off0, off1}}, key0, key1);
    return words.v[k % 4] >= threshold;
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

/// What both forms of the forward take: the operands, the mask, dropout and
/// the scales, and the team work items (set by the launch).
template <class ExecSpace, class T>
struct FusedForwardData {
  /// [B, H, S, D], [B, Hkv, Sk, D], [B, Hkv, Sk, Dv]; any strides, the last
  /// dimension contiguous (as o's); dense, or packed sequences (each entry
  /// its own rows: q.rows(b), k.rows(b))
  kdnn::impl::StridedRows4<const T> q, k, v;
  kdnn::impl::StridedRows4<T> o;    ///< [B, H, S, Dv]
  kdnn::impl::StridedRows3<T> lse;  ///< [B, H, S]
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
};

}  // namespace kdnn::attention::impl
