// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Explicit instantiation of the fused attention, dense and packed, and of
// the runs that hold its kernels (impl/fused_attention_impl.hpp), for the
// pairs of core/impl/eti.hpp.
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/fused_attention_varlen.hpp"

namespace kdnn::attention::impl {

#define KDNN_FUSED_ATTENTION_INSTANTIATE(ExecSpace, T)          \
  KDNN_FUSED_ATTENTION_OPERATORS(template, ExecSpace, T)        \
  KDNN_FUSED_ATTENTION_VARLEN_OPERATORS(template, ExecSpace, T) \
  KDNN_FUSED_ATTENTION_RUNS(template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_FUSED_ATTENTION_INSTANTIATE)
#undef KDNN_FUSED_ATTENTION_INSTANTIATE

}  // namespace kdnn::attention::impl
