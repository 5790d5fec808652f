// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Explicit instantiation of the kdnn::ssm operators, and of the conv's steps
// (impl/causal_conv1d_impl.hpp, which the context-parallel conv composes),
// for the pairs of core/impl/eti.hpp, from the signature macros of their
// headers.
#include "kdnn/ssm/causal_conv1d.hpp"
#include "kdnn/ssm/causal_conv1d_update.hpp"
#include "kdnn/ssm/dt_softplus.hpp"

namespace kdnn::ssm::impl {

#define KDNN_SSM_INSTANTIATE(ExecSpace, T)                    \
  KDNN_CAUSAL_CONV1D_OPERATORS(template, ExecSpace, T)        \
  KDNN_CONV_STEPS(template, ExecSpace, T)                     \
  KDNN_CAUSAL_CONV1D_UPDATE_OPERATORS(template, ExecSpace, T) \
  KDNN_DT_SOFTPLUS_OPERATORS(template, ExecSpace, T)
KDNN_ETI_FOR_EACH_STORAGE(KDNN_SSM_INSTANTIATE)
#undef KDNN_SSM_INSTANTIATE

}  // namespace kdnn::ssm::impl
