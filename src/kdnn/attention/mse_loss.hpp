// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::attention MSE loss: L = Σ (o − t)² / N over all N elements of the
// output o and target t (PyTorch's mse_loss, reduction "mean"; eigenMHA's
// loss), and its gradient dL/do = 2 (o − t) / N, times the incoming gradient
// of L (`scale`, 1 for L itself). An empty tensor gives NaN, as in PyTorch.
#include <Kokkos_Core.hpp>

#include "kdnn/attention/types.hpp"
#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/impl/view_checks.hpp"

#define KDNN_MSE_LOSS_OPERATORS(PREFIX, ExecSpace, T)                                             \
  PREFIX double mse_loss(const ExecSpace&, const Tensor3<const T, ExecSpace>&,                    \
                         const Tensor3<const T, ExecSpace>&);                                     \
  PREFIX void mse_loss_backward(const ExecSpace&, const Tensor3<const T, ExecSpace>&,             \
                                const Tensor3<const T, ExecSpace>&, const Tensor3<T, ExecSpace>&, \
                                double);

namespace kdnn::attention {

namespace impl {
KDNN_MSE_LOSS_OPERATORS(KDNN_TEMPLATE_EXEC_SPACE_T, ExecSpace, T)
#define KDNN_MSE_LOSS_EXTERN(ExecSpace, T) KDNN_MSE_LOSS_OPERATORS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_MSE_LOSS_EXTERN)
#undef KDNN_MSE_LOSS_EXTERN
}  // namespace impl

/// The loss, summed in double. Blocks until it is computed on `space`.
template <class ExecSpace, class OView, class TView>
double mse_loss(const ExecSpace& space, const OView& output, const TView& target) {
  const kdnn::impl::SpaceLock exclusive(space);
  KDNN_CHECK_VIEW(ExecSpace, OView, 3, "[B, S, E]", "attention::mse_loss: output");
  KDNN_CHECK_VIEW(ExecSpace, TView, 3, "[B, S, E]", "attention::mse_loss: target");
  KDNN_CHECK_SAME_TYPE(OView, TView, "attention::mse_loss: output and target");
  using T = typename OView::non_const_value_type;
  return impl::mse_loss<ExecSpace, T>(space, output, target);
}

/// d_output = scale · 2 (output − target) / N. Asynchronous on `space`.
template <class ExecSpace, class OView, class TView, class DView>
void mse_loss_backward(const ExecSpace& space, const OView& output, const TView& target,
                       const DView& d_output, double scale = 1.0) {
  const kdnn::impl::SpaceLock exclusive(space);
  KDNN_CHECK_VIEW(ExecSpace, OView, 3, "[B, S, E]", "attention::mse_loss_backward: output");
  KDNN_CHECK_VIEW(ExecSpace, TView, 3, "[B, S, E]", "attention::mse_loss_backward: target");
  KDNN_CHECK_VIEW(ExecSpace, DView, 3, "[B, S, E]", "attention::mse_loss_backward: d_output");
  KDNN_CHECK_OUTPUT(DView, "attention::mse_loss_backward: d_output");
  KDNN_CHECK_SAME_TYPE(OView, DView, "attention::mse_loss_backward: output and d_output");
  KDNN_CHECK_SAME_TYPE(TView, DView, "attention::mse_loss_backward: target and d_output");
  using T = typename DView::non_const_value_type;
  impl::mse_loss_backward<ExecSpace, T>(space, output, target, d_output, scale);
}

}  // namespace kdnn::attention

#include "kdnn/attention/impl/mse_loss_impl.hpp"
