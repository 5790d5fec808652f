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
#include "kdnn/core/impl/view_checks.hpp"
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
  /// says).
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

}  // namespace kdnn::attention

#define KDNN_FUSED_ATTENTION_OPERATORS(PREFIX, ExecSpace, T)                                \
  PREFIX void fused_attention_forward(                                                      \
      const ExecSpace&, const StridedTensor4<const T, ExecSpace>&,                          \
      const StridedTensor4<const T, ExecSpace>&, const StridedTensor4<const T, ExecSpace>&, \
      const StridedTensor4<T, ExecSpace>&, const Tensor3<T, ExecSpace>&,                    \
      const FusedAttentionOptions&, const AttentionMask<ExecSpace>&, impl::MaskCheck);      \
  PREFIX void fused_attention_backward(                                                     \
      const ExecSpace&, const StridedTensor4<const T, ExecSpace>&,                          \
      const StridedTensor4<const T, ExecSpace>&, const StridedTensor4<const T, ExecSpace>&, \
      const StridedTensor4<const T, ExecSpace>&, const Tensor3<const T, ExecSpace>&,        \
      const StridedTensor4<const T, ExecSpace>&, const StridedTensor4<T, ExecSpace>&,       \
      const StridedTensor4<T, ExecSpace>&, const StridedTensor4<T, ExecSpace>&,             \
      const impl::FusedBackwardScratch<T, ExecSpace>&, const FusedAttentionOptions&,        \
      const AttentionMask<ExecSpace>&, impl::MaskCheck);

namespace kdnn::attention {

namespace impl {
/// The backward's scratch, each View the caller's or, left empty, allocated
/// for the call: delta [B, H, S] (the rows' dO·O) and, with Hkv < H, the
/// query heads' shares of dK and dV [B, H, Sk, D] and [B, H, Sk, Dv].
template <class T, class ExecSpace>
struct FusedBackwardScratch {
  Tensor3<T, ExecSpace> delta;
  Tensor4<T, ExecSpace> dk_shares, dv_shares;
};

KDNN_FUSED_ATTENTION_OPERATORS(KDNN_TEMPLATE_EXEC_SPACE_T, ExecSpace, T)
#define KDNN_FUSED_ATTENTION_EXTERN(ExecSpace, T) \
  KDNN_FUSED_ATTENTION_OPERATORS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_FUSED_ATTENTION_EXTERN)
#undef KDNN_FUSED_ATTENTION_EXTERN
}  // namespace impl

/// O and lse from q, k, v (see above). Asynchronous on `space` after the
/// host-side checks.
template <class ExecSpace, class QView, class KView, class VView, class OView, class LView>
void fused_attention_forward(const ExecSpace& space, const QView& q, const KView& k, const VView& v,
                             const OView& o, const LView& lse,
                             const FusedAttentionOptions& opts = {},
                             const AttentionMask<ExecSpace>& mask = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, QView, 4, "[B, H, S, D]",
                          "attention::fused_attention_forward: q");
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, KView, 4, "[B, Hkv, Sk, D]",
                          "attention::fused_attention_forward: k");
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, VView, 4, "[B, Hkv, Sk, Dv]",
                          "attention::fused_attention_forward: v");
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, OView, 4, "[B, H, S, Dv]",
                          "attention::fused_attention_forward: o");
  KDNN_CHECK_VIEW(ExecSpace, LView, 3, "[B, H, S]", "attention::fused_attention_forward: lse");
  KDNN_CHECK_OUTPUT(OView, "attention::fused_attention_forward: o");
  KDNN_CHECK_OUTPUT(LView, "attention::fused_attention_forward: lse");
  KDNN_CHECK_SAME_TYPE(QView, OView, "attention::fused_attention_forward: q and o");
  KDNN_CHECK_SAME_TYPE(KView, OView, "attention::fused_attention_forward: k and o");
  KDNN_CHECK_SAME_TYPE(VView, OView, "attention::fused_attention_forward: v and o");
  KDNN_CHECK_SAME_TYPE(LView, OView, "attention::fused_attention_forward: lse and o");
  using T = typename OView::non_const_value_type;
  impl::fused_attention_forward<ExecSpace, T>(space, q, k, v, o, lse, opts, mask,
                                              impl::MaskCheck::here);
}

/// dq, dk, dv from the forward's q, k, v, o, lse and dout = dL/dO, with the
/// forward's options and mask: the probabilities are recomputed tile by tile
/// from lse. `delta` [B, H, S] is a workspace the caller owns (it receives
/// the rows' dO·O); the overload without it allocates one per call. With
/// Hkv < H, dk and dv [B, Hkv, Sk, ·] are the sums over each group's query
/// heads, taken in head order from per-query-head shares in buffers of
/// B·H·Sk·(D + Dv) values allocated for the call.
/// Deterministic: no atomics, every sum in a fixed order. Asynchronous on
/// `space` after the host-side checks.
template <class ExecSpace, class QView, class KView, class VView, class OView, class LView,
          class GView, class DQView, class DKView, class DVView, class DeltaView>
void fused_attention_backward(const ExecSpace& space, const QView& q, const KView& k,
                              const VView& v, const OView& o, const LView& lse, const GView& dout,
                              const DQView& dq, const DKView& dk, const DVView& dv,
                              const DeltaView& delta, const FusedAttentionOptions& opts = {},
                              const AttentionMask<ExecSpace>& mask = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
#define KDNN_IMPL_ARG(name) "attention::fused_attention_backward: " name
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, QView, 4, "[B, H, S, D]", KDNN_IMPL_ARG("q"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, KView, 4, "[B, Hkv, Sk, D]", KDNN_IMPL_ARG("k"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, VView, 4, "[B, Hkv, Sk, Dv]", KDNN_IMPL_ARG("v"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, OView, 4, "[B, H, S, Dv]", KDNN_IMPL_ARG("o"));
  KDNN_CHECK_VIEW(ExecSpace, LView, 3, "[B, H, S]", KDNN_IMPL_ARG("lse"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, GView, 4, "[B, H, S, Dv]", KDNN_IMPL_ARG("dout"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, DQView, 4, "[B, H, S, D]", KDNN_IMPL_ARG("dq"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, DKView, 4, "[B, Hkv, Sk, D]", KDNN_IMPL_ARG("dk"));
  KDNN_CHECK_STRIDED_VIEW(ExecSpace, DVView, 4, "[B, Hkv, Sk, Dv]", KDNN_IMPL_ARG("dv"));
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
  KDNN_CHECK_VIEW(ExecSpace, DeltaView, 3, "[B, H, S]", KDNN_IMPL_ARG("delta"));
  KDNN_CHECK_OUTPUT(DeltaView, KDNN_IMPL_ARG("delta"));
  KDNN_CHECK_SAME_TYPE(DeltaView, DQView, KDNN_IMPL_ARG("delta and dq"));
#undef KDNN_IMPL_ARG
  using T = typename DQView::non_const_value_type;
  impl::fused_attention_backward<ExecSpace, T>(space, q, k, v, o, lse, dout, dq, dk, dv,
                                               {delta, {}, {}}, opts, mask, impl::MaskCheck::here);
}

/// The same, with the [B, H, S] workspace allocated for the call.
template <class ExecSpace, class QView, class KView, class VView, class OView, class LView,
          class GView, class DQView, class DKView, class DVView>
void fused_attention_backward(const ExecSpace& space, const QView& q, const KView& k,
                              const VView& v, const OView& o, const LView& lse, const GView& dout,
                              const DQView& dq, const DKView& dk, const DVView& dv,
                              const FusedAttentionOptions& opts = {},
                              const AttentionMask<ExecSpace>& mask = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  using T = typename DQView::non_const_value_type;
  fused_attention_backward(space, q, k, v, o, lse, dout, dq, dk, dv, Tensor3<T, ExecSpace>(), opts,
                           mask);
}

}  // namespace kdnn::attention

#include "kdnn/attention/impl/fused_attention_impl.hpp"
