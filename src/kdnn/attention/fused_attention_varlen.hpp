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
#include "kdnn/attention/impl/flat_entry.hpp"

namespace kdnn::attention {

/// The packing of the varlen functions' sequences.
template <class ExecSpace>
struct PackedSequences {
  Vector<const int, ExecSpace> cu_seqlens_q;  ///< [N + 1]: the queries' offsets into q and o
  Vector<const int, ExecSpace> cu_seqlens_k;  ///< [N + 1]: the keys' offsets into k and v
};

/// The arguments of fused_attention_varlen_forward.
template <class T, class ExecSpace>
struct FusedAttentionVarlenForward {
  StridedTensor3<const T, ExecSpace> q;  ///< [Tq, H, D]
  StridedTensor3<const T, ExecSpace> k;  ///< [Tk, Hkv, D]
  StridedTensor3<const T, ExecSpace> v;  ///< [Tk, Hkv, Dv]
  StridedTensor3<T, ExecSpace> o;        ///< output [Tq, H, Dv]
  Matrix<T, ExecSpace> lse;              ///< output [H, Tq]
  PackedSequences<ExecSpace> seqs;       ///< the packing
  AttentionMask<ExecSpace> mask;         ///< optional, without per-entry vectors
  Vector<const T, ExecSpace> sinks;      ///< [H], as FusedAttentionForward's; optional

  /// The dense call's arguments on the flat entry [1, H, T, ·] of each
  /// packed tensor (lse [1, H, Tq]), over the same memory; the mask as
  /// given (the packed call adds its sequences' lengths to it).
  FusedAttentionForward<T, ExecSpace> dense() const {
    FusedAttentionForward<T, ExecSpace> d;
    d.q = impl::flat_entry(q), d.k = impl::flat_entry(k), d.v = impl::flat_entry(v);
    d.o = impl::flat_entry(o), d.lse = impl::flat_values(lse);
    d.mask = mask, d.sinks = sinks;
    return d;
  }
};

/// The arguments of fused_attention_varlen_backward: the forward's tensors,
/// packing and mask, dout = dL/dO and the gradients to write (overwritten).
template <class T, class ExecSpace>
struct FusedAttentionVarlenBackward {
  StridedTensor3<const T, ExecSpace> q;     ///< [Tq, H, D]
  StridedTensor3<const T, ExecSpace> k;     ///< [Tk, Hkv, D]
  StridedTensor3<const T, ExecSpace> v;     ///< [Tk, Hkv, Dv]
  StridedTensor3<const T, ExecSpace> o;     ///< the forward's output [Tq, H, Dv]
  Matrix<const T, ExecSpace> lse;           ///< the forward's [H, Tq]
  StridedTensor3<const T, ExecSpace> dout;  ///< [Tq, H, Dv]
  StridedTensor3<T, ExecSpace> dq;          ///< output [Tq, H, D]
  StridedTensor3<T, ExecSpace> dk;          ///< output [Tk, Hkv, D]
  StridedTensor3<T, ExecSpace> dv;          ///< output [Tk, Hkv, Dv]
  PackedSequences<ExecSpace> seqs;          ///< the forward's
  AttentionMask<ExecSpace> mask;            ///< the forward's
  Vector<const T, ExecSpace> sinks;         ///< the forward's [H]; optional
  Vector<T, ExecSpace> dsinks;              ///< output [H]; optional, with sinks only

  /// The dense call's arguments, as FusedAttentionVarlenForward::dense()
  /// makes them (the dense struct's workspaces left empty).
  FusedAttentionBackward<T, ExecSpace> dense() const {
    FusedAttentionBackward<T, ExecSpace> d;
    d.q = impl::flat_entry(q), d.k = impl::flat_entry(k), d.v = impl::flat_entry(v);
    d.o = impl::flat_entry(o), d.lse = impl::flat_values(lse);
    d.dout = impl::flat_entry(dout);
    d.dq = impl::flat_entry(dq), d.dk = impl::flat_entry(dk), d.dv = impl::flat_entry(dv);
    d.mask = mask, d.sinks = sinks, d.dsinks = dsinks;
    return d;
  }
};

}  // namespace kdnn::attention

#define KDNN_FUSED_ATTENTION_VARLEN_OPERATORS(PREFIX, ExecSpace, T)                              \
  PREFIX void fused_attention_varlen_forward(const ExecSpace&,                                   \
                                             const FusedAttentionVarlenForward<T, ExecSpace>&,   \
                                             const FusedAttentionOptions&);                      \
  PREFIX void fused_attention_varlen_backward(const ExecSpace&,                                  \
                                              const FusedAttentionVarlenBackward<T, ExecSpace>&, \
                                              const FusedAttentionOptions&);

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
template <class ExecSpace, class T>
void fused_attention_varlen_forward(const ExecSpace& space,
                                    const FusedAttentionVarlenForward<T, ExecSpace>& args,
                                    const FusedAttentionOptions& opts = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::fused_attention_varlen_forward<ExecSpace, T>(space, args, opts);
}

/// dq, dk, dv of packed sequences from the forward's q, k, v, o, lse and
/// dout = dL/dO [Tq, H, Dv], with the forward's packing, options and mask
/// (fused_attention_backward's method: deterministic, no atomics; with
/// Hkv < H, buffers of H·Tk·(D + Dv) values for the call). Asynchronous on
/// `space` after the host-side checks.
template <class ExecSpace, class T>
void fused_attention_varlen_backward(const ExecSpace& space,
                                     const FusedAttentionVarlenBackward<T, ExecSpace>& args,
                                     const FusedAttentionOptions& opts = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::fused_attention_varlen_backward<ExecSpace, T>(space, args, opts);
}

/// fused_attention_varlen_forward with its tensors, packing and mask as
/// arguments (T is o's scalar type).
template <class ExecSpace, class QView, class KView, class VView, class OView, class LView>
void fused_attention_varlen_forward(const ExecSpace& space, const QView& q, const KView& k,
                                    const VView& v, const OView& o, const LView& lse,
                                    const PackedSequences<ExecSpace>& seqs,
                                    const FusedAttentionOptions& opts = {},
                                    const AttentionMask<ExecSpace>& mask = {}) {
  using T = typename OView::non_const_value_type;
  fused_attention_varlen_forward(
      space, FusedAttentionVarlenForward<T, ExecSpace>{q, k, v, o, lse, seqs, mask}, opts);
}

/// fused_attention_varlen_backward with its tensors, packing and mask as
/// arguments (T is dq's scalar type).
template <class ExecSpace, class QView, class KView, class VView, class OView, class LView,
          class GView, class DQView, class DKView, class DVView>
void fused_attention_varlen_backward(const ExecSpace& space, const QView& q, const KView& k,
                                     const VView& v, const OView& o, const LView& lse,
                                     const GView& dout, const DQView& dq, const DKView& dk,
                                     const DVView& dv, const PackedSequences<ExecSpace>& seqs,
                                     const FusedAttentionOptions& opts = {},
                                     const AttentionMask<ExecSpace>& mask = {}) {
  using T = typename DQView::non_const_value_type;
  fused_attention_varlen_backward(
      space,
      FusedAttentionVarlenBackward<T, ExecSpace>{q, k, v, o, lse, dout, dq, dk, dv, seqs, mask},
      opts);
}

}  // namespace kdnn::attention

#include "kdnn/attention/impl/fused_attention_varlen_impl.hpp"
