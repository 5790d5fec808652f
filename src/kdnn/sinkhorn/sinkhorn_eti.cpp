// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Explicit instantiation of the Sinkhorn operators for the pairs of
// core/impl/eti.hpp, from the signatures of KDNN_SINKHORN_OPERATORS.
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::sinkhorn::impl {

#define KDNN_SINKHORN_INSTANTIATE(ExecSpace, T) KDNN_SINKHORN_OPERATORS(template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_SINKHORN_INSTANTIATE)
#undef KDNN_SINKHORN_INSTANTIATE

}  // namespace kdnn::sinkhorn::impl
