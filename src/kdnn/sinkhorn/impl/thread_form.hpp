// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The Sinkhorn operators' thread form (one thread per matrix, all of it in
// registers: forward_thread_kernel.hpp, cg_backward_thread_kernel.hpp) for
// the small n of mHC, and when an operator takes it. A matrix is at most 16
// values there, too few to share between lanes: the lane form
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

/// The sizes the lane form runs for where an operator has a thread form:
/// the others of GpuMatrixSizes take the thread form.
using LaneFormSizes = kdnn::impl::CompiledSizes<8, 16, 32>;

/// A team kernel that does nothing: what the backend allows any team.
template <class ExecSpace>
struct EmptyTeamKernel {
  KOKKOS_INLINE_FUNCTION void operator()(
      const typename Kokkos::TeamPolicy<ExecSpace>::member_type&) const {}
};

/// The launch's team size and vector length do not apply to the thread
/// form, but they are checked as the other forms check them (a vector
/// length a power of two up to the backend's maximum, a team size up to the
/// most threads a team may have), so that a request is valid or not
/// whichever form runs.
template <class ExecSpace>
void check_thread_form_launch(const char* op, const Launch& launch) {
  kdnn::impl::check_launch_request(op, launch);
  if (launch.vector_length > 0)
    kdnn::impl::check_vector_length<ExecSpace>(op, launch.vector_length);
  if (launch.team_size > 0) {
    const int max = Kokkos::TeamPolicy<ExecSpace>(1, 1).team_size_max(EmptyTeamKernel<ExecSpace>{},
                                                                      Kokkos::ParallelForTag());
    if (launch.team_size > max) {
      fail(op, ": launch.team_size=", launch.team_size, ", expected at most ", max,
           " on this backend");
    }
  }
}

/// The thread form for n = N in ThreadMatrixSizes: calls
/// run(std::integral_constant<int, N>) where the launch asks for a GPU form
/// (kdnn::impl::use_gpu_form), and says whether it did.
template <class ExecSpace, class Run>
bool run_thread_form(const char* op, const Launch& launch, int n, const Run& run) {
  if (!kdnn::impl::use_gpu_form<ExecSpace>(launch.form) || !ThreadMatrixSizes::contains(n)) {
    return false;
  }
  check_thread_form_launch<ExecSpace>(op, launch);
  return ThreadMatrixSizes::dispatch(n, run);
}

}  // namespace kdnn::sinkhorn::impl
