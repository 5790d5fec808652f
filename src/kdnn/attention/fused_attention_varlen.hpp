// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::attention fused attention over packed variable-length sequences
// (flash-attn's varlen functions): N sequences packed along the first
// dimension, q [Tq, H, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv], o [Tq, H, Dv],
// with offsets cu_seqlens_q and cu_seqlens_k [N + 1] (int, on the device;
// 0 first, never decreasing, Tq and Tk last): sequence n's queries are rows
// cu_seqlens_q[n] … cu_seqlens_q[n + 1] − 1 of q and o, its keys the rows
// cu_seqlens_k[n] … of k and v, and a query sees only its own sequence's
// keys. Each sequence is attended exactly as one batch entry of
// fused_attention.hpp whose lengths are the sequence's: the mask's causal
// limit, band (bottom-right aligned per sequence, as flash-attn's
// window_size), ALiBi (slopes [1 or N, H]), the score cap, dropout and GQA
// all apply per sequence. lse is [H, Tq] (flash-attn's varlen layout),
// −inf for a query that sees no key. The kernels take each sequence's
// blocks from a list made once per call, so that lengths of any mix cost
// their own work, not that of the longest.
//
// Dropout draws element (n, h, i, j) of [N, H, max Sq, max Sk] (the
// longest sequences' lengths): the same entries as the dense call on the
// sequences padded to those lengths (mask.seq_q and seq_k).
//
// The mask's per-entry vectors are the packing's: mask.seq_q, seq_k,
// lo_win and hi_win must be empty. The offsets are copied to the host and
// checked (a wait for `space`). Each tensor may have any strides whose last
// dimension is contiguous; lse is LayoutRight.
#include <Kokkos_Core.hpp>

#include "kdnn/attention/fused_attention.hpp"

namespace kdnn::attention {

/// The packing of the varlen functions' sequences.
template <class ExecSpace>
struct PackedSequences {
  Vector<const int, ExecSpace> cu_seqlens_q;  ///< [N + 1]: the queries' offsets into q and o
  Vector<const int, ExecSpace> cu_seqlens_k;  ///< [N + 1]: the keys' offsets into k and v
};

}  // namespace kdnn::attention

#define KDNN_FUSED_ATTENTION_VARLEN_OPERATORS(PREFIX, ExecSpace, T)                         \
  PREFIX void fused_attention_varlen_forward(                                               \
      const ExecSpace&, const StridedTensor3<const T, ExecSpace>&,                          \
      const StridedTensor3<const T, ExecSpace>&, const StridedTensor3<const T, ExecSpace>&, \
      const StridedTensor3<T, ExecSpace>&, const Matrix<T, ExecSpace>&,                     \
      const PackedSequences<ExecSpace>&, const FusedAttentionOptions&,                      \
      const AttentionMask<ExecSpace>&);                                                     \
  PREFIX void fused_attention_varlen_backward(                                              \
      const ExecSpace&, const StridedTensor3<const T, ExecSpace>&,                          \
      const StridedTensor3<const T, ExecSpace>&, const StridedTensor3<const T, ExecSpace>&, \
      const StridedTensor3<const T, ExecSpace>&, const Matrix<const T, ExecSpace>&,         \
      const StridedTensor3<const T, ExecSpace>&, const StridedTensor3<T, ExecSpace>&,       \
      const StridedTensor3<T, ExecSpace>&, const StridedTensor3<T, ExecSpace>&,             \
      const PackedSequences<ExecSpace>&, const FusedAttentionOptions&,                      \
      const AttentionMask<ExecSpace>&);

namespace kdnn::attention {

namespace impl {
KDNN_FUSED_ATTENTION_VARLEN_OPERATORS(KDNN_TEMPLATE_EXEC_SPACE_T, ExecSpace, T)
#define KDNN_FUSED_ATTENTION_VARLEN_EXTERN(ExecSpace, T) \
  KDNN_FUSED_ATTENTION_VARLEN_OPERATORS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_FUSED_ATTENTION_VARLEN_EXTERN)
#undef KDNN_FUSED_ATTENTION_VARLEN_EXTERN
}  // namespace impl

/// O and lse of packed sequences (see above). Asynchronous on `space` after
/// the host-side checks.
template <class ExecSpace, class QView, class KView, class VView, class OView, class LView>
void fused_attention_varlen_forward(const ExecSpace& space, const QView& q, const KView& k,
                                    const VView& v, const OView& o, const LView& lse,
                                    const PackedSequences<ExecSpace>& seqs,
                                    const FusedAttentionOptions& opts = {},
                                    const AttentionMask<ExecSpace>& mask = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
#define KDNN_IMPL_ARG(name) "attention::fused_attention_varlen_forward: " name
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, QView, 3, "[Tq, H, D]", KDNN_IMPL_ARG("q"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, KView, 3, "[Tk, Hkv, D]", KDNN_IMPL_ARG("k"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, VView, 3, "[Tk, Hkv, Dv]", KDNN_IMPL_ARG("v"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, OView, 3, "[Tq, H, Dv]", KDNN_IMPL_ARG("o"));
  KDNN_CHECK_VIEW(ExecSpace, LView, 2, "[H, Tq]", KDNN_IMPL_ARG("lse"));
  KDNN_CHECK_OUTPUT(OView, KDNN_IMPL_ARG("o"));
  KDNN_CHECK_OUTPUT(LView, KDNN_IMPL_ARG("lse"));
  KDNN_CHECK_SAME_TYPE(QView, OView, KDNN_IMPL_ARG("q and o"));
  KDNN_CHECK_SAME_TYPE(KView, OView, KDNN_IMPL_ARG("k and o"));
  KDNN_CHECK_SAME_TYPE(VView, OView, KDNN_IMPL_ARG("v and o"));
  KDNN_CHECK_SAME_TYPE(LView, OView, KDNN_IMPL_ARG("lse and o"));
#undef KDNN_IMPL_ARG
  using T = typename OView::non_const_value_type;
  impl::fused_attention_varlen_forward<ExecSpace, T>(space, q, k, v, o, lse, seqs, opts, mask);
}

/// dq, dk, dv of packed sequences from the forward's q, k, v, o, lse and
/// dout = dL/dO [Tq, H, Dv], with the forward's packing, options and mask
/// (fused_attention_backward's method: deterministic, no atomics; with
/// Hkv < H, buffers of H·Tk·(D + Dv) values for the call). Asynchronous on
/// `space` after the host-side checks.
template <class ExecSpace, class QView, class KView, class VView, class OView, class LView,
          class GView, class DQView, class DKView, class DVView>
void fused_attention_varlen_backward(const ExecSpace& space, const QView& q, const KView& k,
                                     const VView& v, const OView& o, const LView& lse,
                                     const GView& dout, const DQView& dq, const DKView& dk,
                                     const DVView& dv, const PackedSequences<ExecSpace>& seqs,
                                     const FusedAttentionOptions& opts = {},
                                     const AttentionMask<ExecSpace>& mask = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
#define KDNN_IMPL_ARG(name) "attention::fused_attention_varlen_backward: " name
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, QView, 3, "[Tq, H, D]", KDNN_IMPL_ARG("q"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, KView, 3, "[Tk, Hkv, D]", KDNN_IMPL_ARG("k"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, VView, 3, "[Tk, Hkv, Dv]", KDNN_IMPL_ARG("v"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, OView, 3, "[Tq, H, Dv]", KDNN_IMPL_ARG("o"));
  KDNN_CHECK_VIEW(ExecSpace, LView, 2, "[H, Tq]", KDNN_IMPL_ARG("lse"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, GView, 3, "[Tq, H, Dv]", KDNN_IMPL_ARG("dout"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, DQView, 3, "[Tq, H, D]", KDNN_IMPL_ARG("dq"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, DKView, 3, "[Tk, Hkv, D]", KDNN_IMPL_ARG("dk"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, DVView, 3, "[Tk, Hkv, Dv]", KDNN_IMPL_ARG("dv"));
  KDNN_CHECK_OUTPUT(DQView, KDNN_IMPL_ARG("dq"));
  KDNN_CHECK_OUTPUT(DKView, KDNN_IMPL_ARG("dk"));
  KDNN_CHECK_OUTPUT(DVView, KDNN_IMPL_ARG("dv"));
  KDNN_CHECK_SAME_TYPE(QView, DQView, KDNN_IMPL_ARG("q and dq"));
  KDNN_CHECK_SAME_TYPE(KView, DQView, KDNN_IMPL_ARG("k and dq"));
  KDNN_CHECK_SAME_TYPE(VView, DQView, KDNN_IMPL_ARG("v and dq"));
  KDNN_CHECK_SAME_TYPE(OView, DQView, KDNN_IMPL_ARG("o and dq"));
  KDNN_CHECK_SAME_TYPE(LView, DQView, KDNN_IMPL_ARG("lse and dq"));
  KDNN_CHECK_SAME_TYPE(GView, DQView, KDNN_IMPL_ARG("dout and dq"));
  KDNN_CHECK_SAME_TYPE(DKView, DQView, KDNN_IMPL_ARG("dk and dq"));
  KDNN_CHECK_SAME_TYPE(DVView, DQView, KDNN_IMPL_ARG("dv and dq"));
#undef KDNN_IMPL_ARG
  using T = typename DQView::non_const_value_type;
  impl::fused_attention_varlen_backward<ExecSpace, T>(space, q, k, v, o, lse, dout, dq, dk, dv,
                                                      seqs, opts, mask);
}

}  // namespace kdnn::attention

#include "kdnn/attention/impl/fused_attention_varlen_impl.hpp"
