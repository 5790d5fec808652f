// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The Sinkhorn operators' table of forms (core/impl/forms.hpp): two GPU
// forms by matrix size, the thread form (one thread per matrix, all of it in
// registers: forward_thread_kernel.hpp, cg_backward_thread_kernel.hpp,
// unrolled_backward_thread_kernel.hpp) for the small n of mHC, and the lane
// form (gpu_matrix_kernel.hpp: a matrix's rows over n vector lanes) for
// n in {8, 16, 32}; every other call runs the team kernels. A matrix of the
// thread form is at most 16 values, too few to share between lanes: the
// lane form spends more on exchanges and reductions than on arithmetic at
// those sizes.
#include <Kokkos_Core.hpp>
#include <array>
#include <type_traits>

#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/compiled_sizes.hpp"
#include "kdnn/core/impl/forms.hpp"
#include "kdnn/core/impl/team_plan.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/sinkhorn/impl/gpu_matrix_kernel.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::sinkhorn::impl {

/// The matrix sizes n the thread forms are compiled for.
using ThreadMatrixSizes = kdnn::impl::CompiledSizes<1, 2, 3, 4>;

/// Which of the two GPU forms.
enum class MatrixForm { thread, lanes };

/// The kernels of a form: it hands on which form and the compile-time n.
template <MatrixForm Which>
struct MatrixFormOf {
  template <class S, class F>
  static void visit(const Launch&, const F& f) {
    f(std::integral_constant<MatrixForm, Which>{}, std::integral_constant<int, S::values[0]>{});
  }
};

using SinkhornForms = kdnn::impl::Forms<
    kdnn::impl::Form<KernelForm::gpu, kdnn::impl::SizeLine<ThreadMatrixSizes>,
                     kdnn::impl::SizeMatch::exact, MatrixFormOf<MatrixForm::thread>>,
    kdnn::impl::Form<KernelForm::gpu, kdnn::impl::SizeLine<LaneFormSizes>,
                     kdnn::impl::SizeMatch::exact, MatrixFormOf<MatrixForm::lanes>>>;

/// Runs the form the table gives n where the launch asks for a GPU form
/// (kdnn::impl::use_gpu_form): thread(size) for the thread form, after the
/// launch's team size and vector length are checked
/// (kdnn::impl::check_launch_limits) as the other forms check them, though
/// it uses neither; lanes(size) for the lane form where the backend has n
/// vector lanes, which says whether it ran (size: the
/// std::integral_constant<int, n>). Says whether a form ran; if not, the
/// caller's team kernels run.
template <class ExecSpace, class Thread, class Lanes>
bool run_matrix_form(const char* op, const ExecSpace& space, const Launch& launch, int n,
                     const Thread& thread, const Lanes& lanes) {
  bool ran = false;
  SinkhornForms::visit(space, launch, std::array<int, 1>{n},
                       [&](auto form, auto size, const char*) {
                         if constexpr (decltype(form)::value == MatrixForm::thread) {
                           kdnn::impl::check_launch_limits<ExecSpace>(op, launch);
                           thread(size);
                           ran = true;
                         } else if (kdnn::impl::BackendTraits<ExecSpace>::is_host ||
                                    n <= Kokkos::TeamPolicy<ExecSpace>::vector_length_max()) {
                           ran = lanes(size);
                         }
                       });
  return ran;
}

}  // namespace kdnn::sinkhorn::impl
