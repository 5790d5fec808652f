// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::attention masked softmax over the last axis of attention scores
// x [B, H, S, Sk] (query rows, key columns), forward and backward:
//   accurate: y_ij = exp(s·x_ij − m_i) / Σ_k exp(s·x_ik − m_i), m_i the row
//             maximum over its visible keys (cuDNN's CUDNN_SOFTMAX_ACCURATE);
//   log:      y_ij = s·x_ij − m_i − log Σ_k exp(s·x_ik − m_i)
// with s the scale (cuDNN's smScaler). The mask (AttentionMask) leaves query i
// of batch entry b the keys j with
//   j < seq_k[b],  lo[i] <= j < hi[i],  j <= i if causal,
//   d − band_left <= j <= d + band_right  (d = i + seq_k[b] − seq_q[b]),
// and none at all when i >= seq_q[b] (a padded query). Masked entries get
// probability 0 (log: −inf) and zero gradient; a row with no visible key is
// all zeros (log: all −inf) with zero gradient, never NaN.
// Backward, for dy = dL/dy, over the visible keys:
//   accurate: dx_ij = s · y_ij (dy_ij − Σ_k y_ik dy_ik)
//   log:      dx_ij = s · (dy_ij − exp(y_ij) Σ_k dy_ik)
#include <Kokkos_Core.hpp>

#include "kdnn/attention/types.hpp"
#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/impl/view_checks.hpp"

namespace kdnn::attention {

enum class SoftmaxMode { accurate, log };

struct SoftmaxOptions {
  SoftmaxMode mode = SoftmaxMode::accurate;
  double scale = 1.0;  ///< s: the softmax is taken of s·x (finite)
};

/// Which keys each query sees; every part is optional (default-constructed
/// Views: no limit). Windows and lengths are read on the host to be checked.
template <class ExecSpace>
struct AttentionMask {
  bool causal = false;                  ///< query i sees keys j <= i (top-left aligned)
  Vector<const int, ExecSpace> lo_win;  ///< [S]: first key of query i's window
  Vector<const int, ExecSpace> hi_win;  ///< [S]: one past its last key
  Vector<const int, ExecSpace> seq_q;   ///< [B]: queries i >= seq_q[b] are padding
  Vector<const int, ExecSpace> seq_k;   ///< [B]: keys j >= seq_k[b] are padding
  /// A band around each query's diagonal key d = i + Sk_b − S_b (S_b, Sk_b
  /// the entry's lengths: seq_q[b], seq_k[b], else S, Sk), bottom-right
  /// aligned as flash-attn's window_size: query i sees keys
  /// d − band_left <= j <= d + band_right; −1: no bound on that side
  /// (band_right = 0 with band_left = −1 is flash-attn's causal mask).
  int band_left = -1, band_right = -1;
  /// ALiBi's slopes [1 or B, H] (one row for every batch entry, or one per
  /// entry): not a limit but a bias, −slope·|i + Sk_b − S_b − j| added to
  /// each visible score (impl/alibi.hpp). Only the fused attention takes
  /// them; the other operators refuse them.
  Matrix<const double, ExecSpace> alibi_slopes;

  /// Where the call's queries and keys lie in longer sequences (a block of
  /// context-parallel attention, kdnn::cp): query i is position
  /// query_begin + i of query_length, key j position key_begin + j of
  /// key_length. The causal mask, the band and ALiBi are aligned, seq_q and
  /// seq_k count, and dropout numbers its elements ([B, H, query_length,
  /// key_length]) in those positions; lo_win and hi_win stay the call's
  /// own key indices. A length of −1 (the default): the call's own, S or
  /// Sk, from position 0. Likewise the call's H heads may be heads
  /// head_begin … head_begin + H − 1 of head_count, which only dropout's
  /// numbering sees (ALiBi's slopes and the sinks are the call's own, [H]).
  struct Positions {
    int query_begin = 0, query_length = -1;
    int key_begin = 0, key_length = -1;
    int head_begin = 0, head_count = -1;
  };
  Positions positions;

  /// The lengths the positions count in, for S queries and Sk keys.
  KOKKOS_INLINE_FUNCTION int query_positions(int queries) const {
    return positions.query_length >= 0 ? positions.query_length : queries;
  }
  KOKKOS_INLINE_FUNCTION int key_positions(int keys) const {
    return positions.key_length >= 0 ? positions.key_length : keys;
  }

  /// Sk_b − S_b: the key position on query position 0's diagonal in batch
  /// entry b, for S queries and Sk keys (the band's and ALiBi's alignment;
  /// S_b, Sk_b: seq_q[b], seq_k[b], else the lengths of the positions).
  KOKKOS_INLINE_FUNCTION int diagonal_shift(int b, int queries, int keys) const {
    return (seq_k.extent(0) > 0 ? seq_k(b) : key_positions(keys)) -
           (seq_q.extent(0) > 0 ? seq_q(b) : query_positions(queries));
  }
};

}  // namespace kdnn::attention

namespace kdnn::attention::impl {
/// Whether an operator checks its mask's vectors (check_mask: on a GPU a
/// copy to the host that waits) or its caller, which checked them for the
/// same call, tells it not to (the attention layer).
enum class MaskCheck { here, done_by_caller };
}  // namespace kdnn::attention::impl

#define KDNN_SOFTMAX_OPERATORS(PREFIX, ExecSpace, T)                                             \
  PREFIX void softmax_forward(const ExecSpace&, const Tensor4<const T, ExecSpace>&,              \
                              const Tensor4<T, ExecSpace>&, const SoftmaxOptions&,               \
                              const AttentionMask<ExecSpace>&, impl::MaskCheck);                 \
  PREFIX void softmax_backward(const ExecSpace&, const Tensor4<const T, ExecSpace>&,             \
                               const Tensor4<const T, ExecSpace>&, const Tensor4<T, ExecSpace>&, \
                               const SoftmaxOptions&, const AttentionMask<ExecSpace>&,           \
                               impl::MaskCheck);

namespace kdnn::attention {

namespace impl {
KDNN_SOFTMAX_OPERATORS(KDNN_TEMPLATE_EXEC_SPACE_T, ExecSpace, T)
#define KDNN_SOFTMAX_EXTERN(ExecSpace, T) KDNN_SOFTMAX_OPERATORS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_SOFTMAX_EXTERN)
#undef KDNN_SOFTMAX_EXTERN
}  // namespace impl

/// y = softmax(s·x) (or its log) over the visible keys of each query.
/// Asynchronous on `space` (after the host reads the mask's windows and
/// lengths to check them).
template <class ExecSpace, class XView, class YView>
void softmax_forward(const ExecSpace& space, const XView& x, const YView& y,
                     const SoftmaxOptions& opts = {}, const AttentionMask<ExecSpace>& mask = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  KDNN_CHECK_VIEW(ExecSpace, XView, 4, "[B, H, S, Sk]", "attention::softmax_forward: x");
  KDNN_CHECK_VIEW(ExecSpace, YView, 4, "[B, H, S, Sk]", "attention::softmax_forward: y");
  KDNN_CHECK_OUTPUT(YView, "attention::softmax_forward: y");
  KDNN_CHECK_SAME_TYPE(XView, YView, "attention::softmax_forward: x and y");
  using T = typename YView::non_const_value_type;
  impl::softmax_forward<ExecSpace, T>(space, x, y, opts, mask, impl::MaskCheck::here);
}

/// dx from the forward's output y and dy = dL/dy, same options and mask.
template <class ExecSpace, class YView, class DYView, class DXView>
void softmax_backward(const ExecSpace& space, const YView& y, const DYView& dy, const DXView& dx,
                      const SoftmaxOptions& opts = {}, const AttentionMask<ExecSpace>& mask = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  KDNN_CHECK_VIEW(ExecSpace, YView, 4, "[B, H, S, Sk]", "attention::softmax_backward: y");
  KDNN_CHECK_VIEW(ExecSpace, DYView, 4, "[B, H, S, Sk]", "attention::softmax_backward: dy");
  KDNN_CHECK_VIEW(ExecSpace, DXView, 4, "[B, H, S, Sk]", "attention::softmax_backward: dx");
  KDNN_CHECK_OUTPUT(DXView, "attention::softmax_backward: dx");
  KDNN_CHECK_SAME_TYPE(YView, DXView, "attention::softmax_backward: y and dx");
  KDNN_CHECK_SAME_TYPE(DYView, DXView, "attention::softmax_backward: dy and dx");
  using T = typename DXView::non_const_value_type;
  impl::softmax_backward<ExecSpace, T>(space, y, dy, dx, opts, mask, impl::MaskCheck::here);
}

}  // namespace kdnn::attention

#include "kdnn/attention/impl/softmax_impl.hpp"
