// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What both forms of the Sinkhorn unrolled backward take
// (unrolled_backward_kernel.hpp and unrolled_backward_gpu_kernel.hpp).
#include <Kokkos_Core.hpp>
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::sinkhorn::impl {

/// What both forms of the unrolled backward take: the operands and the
/// forward's settings.
template <class ExecSpace, class T>
struct UnrolledBackwardData {
  Batch<const T, ExecSpace> X, G;
  Batch<T, ExecSpace> dX;
  int iters = 1;
  double eps = 0;
};

}  // namespace kdnn::sinkhorn::impl
