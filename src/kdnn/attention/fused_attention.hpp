#pragma once
// kdnn::attention fused scaled-dot-product attention ("flash" attention) on
// per-head tensors: q [B, H, S, D], k [B, H, Sk, D], v [B, H, Sk, Dv],
//   O = dropout(softmax(scale·q·kᵀ under the mask))·v     [B, H, S, Dv]
// and lse [B, H, S], the log-sum-exp of each query's visible scaled scores
// (−inf for a row with no visible key, whose O row is 0). The probabilities
// are never stored: memory O(B·H·S·D), not O(B·H·S·Sk). The mask is
// softmax.hpp's AttentionMask, dropout dropout.hpp's generator with the same
// element indices as the unfused path, so both paths drop the same entries.
#include <Kokkos_Core.hpp>

#include "kdnn/attention/dropout.hpp"
#include "kdnn/attention/softmax.hpp"
#include "kdnn/attention/types.hpp"
#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/view_checks.hpp"
#include "kdnn/core/launch.hpp"

namespace kdnn::attention {

struct FusedAttentionOptions {
  double scale = 1.0;      ///< the scores' scale (finite), e.g. 1/√D
  DropoutOptions dropout;  ///< on the probabilities; p = 0: none
  Launch launch;           ///< team size and vector length; 0: chosen per backend
};

}  // namespace kdnn::attention

#define KDNN_FUSED_ATTENTION_OPERATORS(PREFIX, ExecSpace, T)                                    \
  PREFIX void fused_attention_forward(                                                          \
      const ExecSpace&, const Tensor4<const T, ExecSpace>&, const Tensor4<const T, ExecSpace>&, \
      const Tensor4<const T, ExecSpace>&, const Tensor4<T, ExecSpace>&,                         \
      const Tensor3<T, ExecSpace>&, const FusedAttentionOptions&,                               \
      const AttentionMask<ExecSpace>&);

namespace kdnn::attention {

namespace impl {
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
  KDNN_CHECK_VIEW(ExecSpace, QView, 4, "[B, H, S, D]", "attention::fused_attention_forward: q");
  KDNN_CHECK_VIEW(ExecSpace, KView, 4, "[B, H, Sk, D]", "attention::fused_attention_forward: k");
  KDNN_CHECK_VIEW(ExecSpace, VView, 4, "[B, H, Sk, Dv]", "attention::fused_attention_forward: v");
  KDNN_CHECK_VIEW(ExecSpace, OView, 4, "[B, H, S, Dv]", "attention::fused_attention_forward: o");
  KDNN_CHECK_VIEW(ExecSpace, LView, 3, "[B, H, S]", "attention::fused_attention_forward: lse");
  KDNN_CHECK_OUTPUT(OView, "attention::fused_attention_forward: o");
  KDNN_CHECK_OUTPUT(LView, "attention::fused_attention_forward: lse");
  KDNN_CHECK_SAME_TYPE(QView, OView, "attention::fused_attention_forward: q and o");
  KDNN_CHECK_SAME_TYPE(KView, OView, "attention::fused_attention_forward: k and o");
  KDNN_CHECK_SAME_TYPE(VView, OView, "attention::fused_attention_forward: v and o");
  KDNN_CHECK_SAME_TYPE(LView, OView, "attention::fused_attention_forward: lse and o");
  using T = typename OView::non_const_value_type;
  impl::fused_attention_forward<ExecSpace, T>(space, q, k, v, o, lse, opts, mask);
}

}  // namespace kdnn::attention

#include "kdnn/attention/impl/fused_attention_impl.hpp"
