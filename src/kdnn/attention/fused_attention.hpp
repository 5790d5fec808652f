// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::attention fused scaled-dot-product attention ("flash" attention) on
// per-head tensors: q [B, H, S, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv],
//   O = dropout(softmax(scale·q·kᵀ under the mask))·v     [B, H, S, Dv]
// where query head h reads key/value head h / (H / Hkv): Hkv = H is
// multi-head attention, Hkv < H (dividing it) grouped-query attention, and
// Hkv = 1 multi-query attention; and lse [B, H, S], the log-sum-exp of each query's visible scaled
// scores (−inf for a row with no visible key, whose O row is 0). The probabilities are never
// stored: memory O(B·H·S·D), not O(B·H·S·Sk). The mask is softmax.hpp's AttentionMask, dropout
// dropout.hpp's generator with the same element indices as the unfused path, so both paths drop the
// same entries.
//
// The 4-D tensors (q, k, v, o, and the backward's dout, dq, dk, dv) may have
// any strides whose last dimension is contiguous (stride 1, checked): a
// PyTorch [B, S, H, D] tensor, or a slice of a packed [B, S, 3, H, D] one,
// is read in place as [B, H, S, D] through its strides. An output's elements
// must not overlap (no stride 0). lse and the backward's workspaces are
// LayoutRight.
#include <Kokkos_Core.hpp>

#include "kdnn/attention/dropout.hpp"
#include "kdnn/attention/softmax.hpp"
#include "kdnn/attention/types.hpp"
#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/launch.hpp"

namespace kdnn::attention {

/// How fused_attention_backward splits its work; every schedule gives
/// run-to-run bitwise-identical results (no atomics).
enum class FusedBackwardSchedule {
  automatic,      ///< per_head on a host backend when B·H ≥ the space's concurrency, else
                  ///< per_key_block
  per_head,       ///< one team per (b, h): five tile products per pair of tiles, B·H teams
  per_key_block,  ///< one team per key block (dK, dV) and one per query block (dQ): seven
                  ///< tile products per pair of tiles, B·H·(S/bq + Sk/bk) teams
};

struct FusedAttentionOptions {
  double scale = 1.0;  ///< the scores' scale (finite), e.g. 1/√D
  /// The scores' cap: a scaled score s is used as softcap·tanh(s/softcap)
  /// (Gemma 2's and flash-attn's softcap), within (−softcap, softcap);
  /// 0: none. Finite, >= 0.
  double softcap = 0.0;
  DropoutOptions dropout;  ///< on the probabilities; p = 0: none
  /// Team size and vector length (0: chosen per backend), and the kernels'
  /// form: the forward and the backward have GPU forms for D and Dv each
  /// in {32, 64, 128, 256} (the backward in double up to 128), chosen by
  /// KernelForm::automatic on a GPU backend or by ::gpu anywhere, and
  /// tensor-core forms for D and Dv each in {32, 64, 128}, chosen by
  /// automatic on a CUDA device of compute capability 8.0 or later or by
  /// ::tensor_cores anywhere (float in 3×TF32, or one TF32 pass with
  /// `launch.allow_tf32`); both pick their own team size and vector length
  /// (the backward's form is the per_key_block split whatever `backward`
  /// says). A D or Dv past 256, the GPU forms' largest, is an error on a
  /// GPU backend and with ::gpu or ::tensor_cores; the host form on a host
  /// backend takes any.
  Launch launch;
  FusedBackwardSchedule backward = FusedBackwardSchedule::automatic;  ///< the backward's split
  /// Refuse a scale with which a score scale·q_i·k_j of finite q and k
  /// could pass T's largest value (|scale|·D·max|q|·max|k| above half of
  /// it): a reduction over q and k that the host waits for.
  bool check_scores = false;
  /// Refuse a NaN or an infinity in q, k, v (and the backward's dout),
  /// naming the first: a reduction over each that the host waits for.
  /// Without it they propagate, as in PyTorch (docs/api.md).
  bool check_finite = false;
};

/// The arguments of fused_attention_forward.
template <class T, class ExecSpace>
struct FusedAttentionForward {
  StridedTensor4<const T, ExecSpace> q;  ///< [B, H, S, D]
  StridedTensor4<const T, ExecSpace> k;  ///< [B, Hkv, Sk, D]
  StridedTensor4<const T, ExecSpace> v;  ///< [B, Hkv, Sk, Dv]
  StridedTensor4<T, ExecSpace> o;        ///< output [B, H, S, Dv]
  Tensor3<T, ExecSpace> lse;             ///< output [B, H, S]
  AttentionMask<ExecSpace> mask;         ///< optional (every key visible)
  /// [H]: attention sinks (gpt-oss's), one logit per query head that joins
  /// every row's softmax denominator as a key with no value:
  /// O_i = Σ_j e^{s_ij}·v_j / (e^{sink_h} + Σ_j e^{s_ij}), and lse includes
  /// it. A row that sees no key then has O_i = 0 and lse = sink_h; a sink
  /// of −inf is none. Optional.
  Vector<const T, ExecSpace> sinks;
};

/// The arguments of fused_attention_backward: the forward's tensors and
/// mask, dout = dL/dO and the gradients to write (overwritten, or added to
/// with `accumulate`). The workspaces are the caller's or, left empty,
/// allocated for the call.
template <class T, class ExecSpace>
struct FusedAttentionBackward {
  StridedTensor4<const T, ExecSpace> q;     ///< [B, H, S, D]
  StridedTensor4<const T, ExecSpace> k;     ///< [B, Hkv, Sk, D]
  StridedTensor4<const T, ExecSpace> v;     ///< [B, Hkv, Sk, Dv]
  StridedTensor4<const T, ExecSpace> o;     ///< the forward's output [B, H, S, Dv]
  Tensor3<const T, ExecSpace> lse;          ///< the forward's [B, H, S]
  StridedTensor4<const T, ExecSpace> dout;  ///< [B, H, S, Dv]
  StridedTensor4<T, ExecSpace> dq;          ///< output [B, H, S, D]
  StridedTensor4<T, ExecSpace> dk;          ///< output [B, Hkv, Sk, D]
  StridedTensor4<T, ExecSpace> dv;          ///< output [B, Hkv, Sk, Dv]
  AttentionMask<ExecSpace> mask;            ///< the forward's
  Vector<const T, ExecSpace> sinks;         ///< the forward's [H]; optional
  /// output [H], the sinks' gradient (overwritten); optional, with sinks only.
  Vector<T, ExecSpace> dsinks;
  Tensor3<T, ExecSpace> delta;  ///< workspace [B, H, S] (the rows' dO·O); optional
  /// Workspaces with Hkv < H: the query heads' shares of dK and dV,
  /// [B, H, Sk, D] and [B, H, Sk, Dv]; optional.
  Tensor4<T, ExecSpace> dk_shares, dv_shares;
  /// Add the gradients into dq, dk and dv (their values on entry) instead
  /// of overwriting them: a sum over blocks of keys or queries (context
  /// parallelism's) needs no buffer of its own. dsinks is overwritten.
  bool accumulate = false;
};

}  // namespace kdnn::attention

#define KDNN_FUSED_ATTENTION_OPERATORS(PREFIX, ExecSpace, T)                          \
  PREFIX void fused_attention_forward(const ExecSpace&,                               \
                                      const FusedAttentionForward<T, ExecSpace>&,     \
                                      const FusedAttentionOptions&, impl::MaskCheck); \
  PREFIX void fused_attention_backward(const ExecSpace&,                              \
                                       const FusedAttentionBackward<T, ExecSpace>&,   \
                                       const FusedAttentionOptions&, impl::MaskCheck);

namespace kdnn::attention {

namespace impl {
KDNN_FUSED_ATTENTION_OPERATORS(KDNN_TEMPLATE_EXEC_SPACE_T, ExecSpace, T)
#define KDNN_FUSED_ATTENTION_EXTERN(ExecSpace, T) \
  KDNN_FUSED_ATTENTION_OPERATORS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_FUSED_ATTENTION_EXTERN)
#undef KDNN_FUSED_ATTENTION_EXTERN
}  // namespace impl

/// O and lse from q, k, v (see above). Asynchronous on `space` after the
/// host-side checks, which throw kdnn::Error naming the argument.
template <class ExecSpace, class T>
void fused_attention_forward(const ExecSpace& space,
                             const FusedAttentionForward<T, ExecSpace>& args,
                             const FusedAttentionOptions& opts = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::fused_attention_forward<ExecSpace, T>(space, args, opts, impl::MaskCheck::here);
}

/// dq, dk, dv from the forward's q, k, v, o, lse and dout = dL/dO, with the
/// forward's options and mask: the probabilities are recomputed tile by tile
/// from lse. With Hkv < H, dk and dv [B, Hkv, Sk, ·] are the sums over each
/// group's query heads, taken in head order from per-query-head shares
/// (B·H·Sk·(D + Dv) values: args' workspaces, or allocated for the call).
/// Deterministic: no atomics, every sum in a fixed order. Asynchronous on
/// `space` after the host-side checks.
template <class ExecSpace, class T>
void fused_attention_backward(const ExecSpace& space,
                              const FusedAttentionBackward<T, ExecSpace>& args,
                              const FusedAttentionOptions& opts = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::fused_attention_backward<ExecSpace, T>(space, args, opts, impl::MaskCheck::here);
}

/// fused_attention_forward with its tensors and mask as arguments (T is o's
/// scalar type; each View converts to its FusedAttentionForward member).
template <class ExecSpace, class QView, class KView, class VView, class OView, class LView>
void fused_attention_forward(const ExecSpace& space, const QView& q, const KView& k, const VView& v,
                             const OView& o, const LView& lse,
                             const FusedAttentionOptions& opts = {},
                             const AttentionMask<ExecSpace>& mask = {}) {
  using T = typename OView::non_const_value_type;
  fused_attention_forward(space, FusedAttentionForward<T, ExecSpace>{q, k, v, o, lse, mask}, opts);
}

/// fused_attention_backward with its tensors and mask as arguments, and
/// `delta`, the [B, H, S] workspace (T is dq's scalar type).
template <class ExecSpace, class QView, class KView, class VView, class OView, class LView,
          class GView, class DQView, class DKView, class DVView, class DeltaView>
void fused_attention_backward(const ExecSpace& space, const QView& q, const KView& k,
                              const VView& v, const OView& o, const LView& lse, const GView& dout,
                              const DQView& dq, const DKView& dk, const DVView& dv,
                              const DeltaView& delta, const FusedAttentionOptions& opts = {},
                              const AttentionMask<ExecSpace>& mask = {}) {
  using T = typename DQView::non_const_value_type;
  fused_attention_backward(
      space,
      FusedAttentionBackward<T, ExecSpace>{q, k, v, o, lse, dout, dq, dk, dv, mask, {}, {}, delta},
      opts);
}

/// The same, with the [B, H, S] workspace allocated for the call.
template <class ExecSpace, class QView, class KView, class VView, class OView, class LView,
          class GView, class DQView, class DKView, class DVView>
void fused_attention_backward(const ExecSpace& space, const QView& q, const KView& k,
                              const VView& v, const OView& o, const LView& lse, const GView& dout,
                              const DQView& dq, const DKView& dk, const DVView& dv,
                              const FusedAttentionOptions& opts = {},
                              const AttentionMask<ExecSpace>& mask = {}) {
  using T = typename DQView::non_const_value_type;
  fused_attention_backward(
      space, FusedAttentionBackward<T, ExecSpace>{q, k, v, o, lse, dout, dq, dk, dv, mask}, opts);
}

}  // namespace kdnn::attention

#include "kdnn/attention/impl/fused_attention_impl.hpp"
