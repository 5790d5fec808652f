// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::attention strided batched GEMM on per-head tensors [B, H, rows, cols]:
//   C ← β·C + α·op_c(op_a(A)·op_b(B))   for every (b, h),
// with op_a(A) M×K, op_b(B) K×N and C M×N (N×M when op_c transposes). Its
// backward, for dC = dL/dC (the output), with P = op_a(A)·op_b(B) and
// dP = α·op_c⁻¹(dC):
//   d op_a(A) = dP·op_b(B)ᵀ,   d op_b(B) = op_a(A)ᵀ·dP,   dC_in = β·dC,
// each written as one GEMM per (b, h) with the transposes folded in
// (impl/batched_gemm_impl.hpp). α and β are always applied (β = 0 ignores
// what C held).
#include <Kokkos_Core.hpp>

#include "kdnn/attention/types.hpp"
#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/impl/view_checks.hpp"

#define KDNN_BATCHED_GEMM_OPERATORS(PREFIX, ExecSpace, T)                                        \
  PREFIX void batched_gemm(const ExecSpace&, Op, Op, Op, T, const Tensor4<const T, ExecSpace>&,  \
                           const Tensor4<const T, ExecSpace>&, T, const Tensor4<T, ExecSpace>&); \
  PREFIX void batched_gemm_backward(                                                             \
      const ExecSpace&, Op, Op, Op, T, const Tensor4<const T, ExecSpace>&,                       \
      const Tensor4<const T, ExecSpace>&, T, const Tensor4<const T, ExecSpace>&,                 \
      const Tensor4<T, ExecSpace>&, const Tensor4<T, ExecSpace>&, const Tensor4<T, ExecSpace>&);

namespace kdnn::attention {

namespace impl {
KDNN_BATCHED_GEMM_OPERATORS(KDNN_TEMPLATE_EXEC_SPACE_T, ExecSpace, T)
#define KDNN_BATCHED_GEMM_EXTERN(ExecSpace, T) \
  KDNN_BATCHED_GEMM_OPERATORS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_BATCHED_GEMM_EXTERN)
#undef KDNN_BATCHED_GEMM_EXTERN
}  // namespace impl

/// C ← β·C + α·op_c(op_a(A)·op_b(B)) per (b, h). Asynchronous on `space`.
template <class ExecSpace, class AView, class BView, class CView>
void batched_gemm(const ExecSpace& space, Op op_a, Op op_b, Op op_c,
                  typename CView::const_value_type alpha, const AView& A, const BView& B,
                  typename CView::const_value_type beta, const CView& C) {
  const kdnn::impl::SpaceLock exclusive(space);
  KDNN_CHECK_VIEW(ExecSpace, AView, 4, "[B, H, rows, cols]", "attention::batched_gemm: A");
  KDNN_CHECK_VIEW(ExecSpace, BView, 4, "[B, H, rows, cols]", "attention::batched_gemm: B");
  KDNN_CHECK_VIEW(ExecSpace, CView, 4, "[B, H, rows, cols]", "attention::batched_gemm: C");
  KDNN_CHECK_OUTPUT(CView, "attention::batched_gemm: C");
  KDNN_CHECK_SAME_TYPE(AView, CView, "attention::batched_gemm: A and C");
  KDNN_CHECK_SAME_TYPE(BView, CView, "attention::batched_gemm: B and C");
  using T = typename CView::non_const_value_type;
  impl::batched_gemm<ExecSpace, T>(space, op_a, op_b, op_c, alpha, A, B, beta, C);
}

/// From dC = dL/dC of batched_gemm's output: dA and dB (each skipped if
/// default-constructed) and dC_in = β·dC, the gradient for the C it read
/// (skipped if default-constructed). Asynchronous on `space`.
template <class ExecSpace, class AView, class BView, class DCView, class DAView, class DBView,
          class DCInView>
void batched_gemm_backward(const ExecSpace& space, Op op_a, Op op_b, Op op_c,
                           typename DAView::const_value_type alpha, const AView& A, const BView& B,
                           typename DAView::const_value_type beta, const DCView& dC,
                           const DAView& dA, const DBView& dB, const DCInView& dC_in) {
  const kdnn::impl::SpaceLock exclusive(space);
#define KDNN_IMPL_SHAPE "[B, H, rows, cols]"
  KDNN_CHECK_VIEW(ExecSpace, AView, 4, KDNN_IMPL_SHAPE, "attention::batched_gemm_backward: A");
  KDNN_CHECK_VIEW(ExecSpace, BView, 4, KDNN_IMPL_SHAPE, "attention::batched_gemm_backward: B");
  KDNN_CHECK_VIEW(ExecSpace, DCView, 4, KDNN_IMPL_SHAPE, "attention::batched_gemm_backward: dC");
  KDNN_CHECK_VIEW(ExecSpace, DAView, 4, KDNN_IMPL_SHAPE, "attention::batched_gemm_backward: dA");
  KDNN_CHECK_VIEW(ExecSpace, DBView, 4, KDNN_IMPL_SHAPE, "attention::batched_gemm_backward: dB");
  KDNN_CHECK_VIEW(ExecSpace, DCInView, 4, KDNN_IMPL_SHAPE,
                  "attention::batched_gemm_backward: dC_in");
  KDNN_CHECK_OUTPUT(DAView, "attention::batched_gemm_backward: dA");
  KDNN_CHECK_OUTPUT(DBView, "attention::batched_gemm_backward: dB");
  KDNN_CHECK_OUTPUT(DCInView, "attention::batched_gemm_backward: dC_in");
  KDNN_CHECK_SAME_TYPE(AView, DAView, "attention::batched_gemm_backward: A and dA");
  KDNN_CHECK_SAME_TYPE(BView, DAView, "attention::batched_gemm_backward: B and dA");
  KDNN_CHECK_SAME_TYPE(DCView, DAView, "attention::batched_gemm_backward: dC and dA");
  KDNN_CHECK_SAME_TYPE(DBView, DAView, "attention::batched_gemm_backward: dB and dA");
  KDNN_CHECK_SAME_TYPE(DCInView, DAView, "attention::batched_gemm_backward: dC_in and dA");
#undef KDNN_IMPL_SHAPE
  using T = typename DAView::non_const_value_type;
  impl::batched_gemm_backward<ExecSpace, T>(space, op_a, op_b, op_c, alpha, A, B, beta, dC, dA, dB,
                                            dC_in);
}

}  // namespace kdnn::attention

#include "kdnn/attention/impl/batched_gemm_impl.hpp"
