// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The Sinkhorn operators' thread form (one thread per matrix, all of it in
// registers: forward_thread_kernel.hpp, cg_backward_thread_kernel.hpp,
// unrolled_backward_thread_kernel.hpp) for the small n of mHC, and when an
// operator takes it. A matrix is at most 16 values there, too few to share
// between lanes: the lane form
// (gpu_matrix_kernel.hpp) spends more on exchanges and reductions than on
// arithmetic at those sizes.
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/compiled_sizes.hpp"
#include "kdnn/core/impl/team_plan.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::sinkhorn::impl {

/// The matrix sizes n the thread forms are compiled for.
using ThreadMatrixSizes = kdnn::impl::CompiledSizes<1, 2, 3, 4>;

/// The thread form for n = N in ThreadMatrixSizes: calls
/// run(std::integral_constant<int, N>) where the launch asks for a GPU form
/// (kdnn::impl::use_gpu_form), and says whether it did. The launch's team
/// size and vector length are checked (kdnn::impl::check_launch_limits)
/// whether or not the form uses them.
template <class ExecSpace, class Run>
bool run_thread_form(const char* op, const Launch& launch, int n, const Run& run) {
  if (!kdnn::impl::use_gpu_form<ExecSpace>(launch.form) || !ThreadMatrixSizes::contains(n)) {
    return false;
  }
  kdnn::impl::check_launch_limits<ExecSpace>(op, launch);
  return ThreadMatrixSizes::dispatch(n, run);
}

}  // namespace kdnn::sinkhorn::impl
