// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::attention Linear layer, as PyTorch's nn.Linear: y = x·Wᵀ + b for
// x [B, S, in], W [out, in], b [out] (optional), y [B, S, out]; and its
// backward: dx = dy·W, dW = dyᵀ·x and db = Σ dy over B and S, the weight
// gradients written or added (WgradMode). Each product is one GEMM over the
// B·S rows (core/impl/gemm.hpp, Kokkos Kernels).
#include <Kokkos_Core.hpp>

#include "kdnn/attention/types.hpp"
#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/impl/view_checks.hpp"

#define KDNN_LINEAR_OPERATORS(PREFIX, ExecSpace, T)                                                \
  PREFIX void linear_forward(const ExecSpace&, const Tensor3<const T, ExecSpace>&,                 \
                             const Matrix<const T, ExecSpace>&, const Vector<const T, ExecSpace>&, \
                             const Tensor3<T, ExecSpace>&);                                        \
  PREFIX void linear_backward(                                                                     \
      const ExecSpace&, const Tensor3<const T, ExecSpace>&, const Matrix<const T, ExecSpace>&,     \
      const Tensor3<const T, ExecSpace>&, const Tensor3<T, ExecSpace>&,                            \
      const Matrix<T, ExecSpace>&, const Vector<T, ExecSpace>&, WgradMode);

namespace kdnn::attention {

namespace impl {
KDNN_LINEAR_OPERATORS(KDNN_TEMPLATE_EXEC_SPACE_T, ExecSpace, T)
#define KDNN_LINEAR_EXTERN(ExecSpace, T) KDNN_LINEAR_OPERATORS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_LINEAR_EXTERN)
#undef KDNN_LINEAR_EXTERN
}  // namespace impl

/// y = x·Wᵀ + b; pass a default-constructed View as b for no bias.
/// Asynchronous on `space`.
template <class ExecSpace, class XView, class WView, class BView, class YView>
void linear_forward(const ExecSpace& space, const XView& x, const WView& W, const BView& b,
                    const YView& y) {
  const kdnn::impl::SpaceLock exclusive(space);
  KDNN_CHECK_VIEW(ExecSpace, XView, 3, "[B, S, in]", "attention::linear_forward: x");
  KDNN_CHECK_VIEW(ExecSpace, WView, 2, "[out, in]", "attention::linear_forward: W");
  KDNN_CHECK_VIEW(ExecSpace, BView, 1, "[out]", "attention::linear_forward: b");
  KDNN_CHECK_VIEW(ExecSpace, YView, 3, "[B, S, out]", "attention::linear_forward: y");
  KDNN_CHECK_OUTPUT(YView, "attention::linear_forward: y");
  KDNN_CHECK_SAME_TYPE(XView, YView, "attention::linear_forward: x and y");
  KDNN_CHECK_SAME_TYPE(WView, YView, "attention::linear_forward: W and y");
  KDNN_CHECK_SAME_TYPE(BView, YView, "attention::linear_forward: b and y");
  using T = typename YView::non_const_value_type;
  impl::linear_forward<ExecSpace, T>(space, x, W, b, y);
}

/// From dy = dL/dy: dx = dy·W (skipped if dx is default-constructed),
/// dW = dyᵀ·x and db = Σ_{B,S} dy (db skipped if default-constructed),
/// overwritten (WgradMode::set) or added to (WgradMode::add).
/// Asynchronous on `space`.
template <class ExecSpace, class XView, class WView, class DYView, class DXView, class DWView,
          class DBView>
void linear_backward(const ExecSpace& space, const XView& x, const WView& W, const DYView& dy,
                     const DXView& dx, const DWView& dW, const DBView& db,
                     WgradMode mode = WgradMode::set) {
  const kdnn::impl::SpaceLock exclusive(space);
  KDNN_CHECK_VIEW(ExecSpace, XView, 3, "[B, S, in]", "attention::linear_backward: x");
  KDNN_CHECK_VIEW(ExecSpace, WView, 2, "[out, in]", "attention::linear_backward: W");
  KDNN_CHECK_VIEW(ExecSpace, DYView, 3, "[B, S, out]", "attention::linear_backward: dy");
  KDNN_CHECK_VIEW(ExecSpace, DXView, 3, "[B, S, in]", "attention::linear_backward: dx");
  KDNN_CHECK_VIEW(ExecSpace, DWView, 2, "[out, in]", "attention::linear_backward: dW");
  KDNN_CHECK_VIEW(ExecSpace, DBView, 1, "[out]", "attention::linear_backward: db");
  KDNN_CHECK_OUTPUT(DXView, "attention::linear_backward: dx");
  KDNN_CHECK_OUTPUT(DWView, "attention::linear_backward: dW");
  KDNN_CHECK_OUTPUT(DBView, "attention::linear_backward: db");
  KDNN_CHECK_SAME_TYPE(XView, DWView, "attention::linear_backward: x and dW");
  KDNN_CHECK_SAME_TYPE(WView, DWView, "attention::linear_backward: W and dW");
  KDNN_CHECK_SAME_TYPE(DYView, DWView, "attention::linear_backward: dy and dW");
  KDNN_CHECK_SAME_TYPE(DXView, DWView, "attention::linear_backward: dx and dW");
  KDNN_CHECK_SAME_TYPE(DBView, DWView, "attention::linear_backward: db and dW");
  using T = typename DWView::non_const_value_type;
  impl::linear_backward<ExecSpace, T>(space, x, W, dy, dx, dW, db, mode);
}

}  // namespace kdnn::attention

#include "kdnn/attention/impl/linear_impl.hpp"
