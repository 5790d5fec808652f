// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What both forms of the Sinkhorn forward take (forward_kernel.hpp and
// forward_gpu_kernel.hpp).
#include <Kokkos_Core.hpp>
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::sinkhorn::impl {

/// What both forms of the forward take: the operands, the report's views
/// and the iteration's settings.
template <class ExecSpace, class T>
struct ForwardData {
  Batch<const T, ExecSpace> X;
  Batch<T, ExecSpace> R;
  Kokkos::View<int*, typename ExecSpace::memory_space> iters_out;
  Kokkos::View<double*, typename ExecSpace::memory_space> error_out;
  int iters = 1;
  double tol = 0, eps = 0;
};

}  // namespace kdnn::sinkhorn::impl
