// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Explicit instantiation of the attention operators for the pairs of
// core/impl/eti.hpp, from their signature macros; the fused attention's
// are in fused_attention_eti.cpp (a file of its own: its kernels are the
// family's largest, and a separate file compiles in parallel with these).
#include "kdnn/attention/batched_gemm.hpp"
#include "kdnn/attention/dropout.hpp"
#include "kdnn/attention/linear.hpp"
#include "kdnn/attention/mha.hpp"
#include "kdnn/attention/mse_loss.hpp"
#include "kdnn/attention/softmax.hpp"

namespace kdnn::attention::impl {

#define KDNN_ATTENTION_INSTANTIATE(ExecSpace, T)      \
  KDNN_MSE_LOSS_OPERATORS(template, ExecSpace, T)     \
  KDNN_LINEAR_OPERATORS(template, ExecSpace, T)       \
  KDNN_BATCHED_GEMM_OPERATORS(template, ExecSpace, T) \
  KDNN_SOFTMAX_OPERATORS(template, ExecSpace, T)      \
  KDNN_DROPOUT_OPERATORS(template, ExecSpace, T)      \
  KDNN_MHA_OPERATORS(template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_ATTENTION_INSTANTIATE)
#undef KDNN_ATTENTION_INSTANTIATE

}  // namespace kdnn::attention::impl
