// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Explicit instantiation of the kdnn::ssm SSD operators and of their steps
// (impl/ssd_steps.hpp, which the context-parallel SSD composes) for the pairs of
// core/impl/eti.hpp (a file of its own: the SSD's kernels are the largest of
// the family, and a separate file compiles in parallel with the conv's).
#include "kdnn/ssm/ssd.hpp"

namespace kdnn::ssm::impl {

#define KDNN_SSD_INSTANTIATE(ExecSpace, T) \
  KDNN_SSD_OPERATORS(template, ExecSpace, T) KDNN_SSD_STEPS(template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_SSD_INSTANTIATE)
#undef KDNN_SSD_INSTANTIATE

}  // namespace kdnn::ssm::impl
