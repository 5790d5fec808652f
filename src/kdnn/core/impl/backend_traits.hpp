// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What a kernel's launch planning needs to know about a Kokkos backend, keyed
// on the execution space (as Cabana's performance traits and Kokkos Kernels'
// is_gpu_exec_space are), never on where its memory lives: a CUDA build with
// UVM memory can reach Kokkos::Cuda's memory from the host, but its kernels
// still run on warps, so it must not take host tiles or host loops.
//
// The host backends are listed (Serial, OpenMP, Threads, HPX); every other
// execution space is treated as a GPU. A GPU form is portable Kokkos code,
// so an unlisted host backend would get correct results from it, only
// slowly, whereas a host form on a GPU would be wrong (a plain loop run by
// every lane of a warp).
#include <Kokkos_Core.hpp>
#include <type_traits>

#include "kdnn/core/impl/tensor_cores.hpp"
#include "kdnn/core/launch.hpp"

namespace kdnn::impl {

/// Whether ExecSpace runs team threads and vector lanes as CPU threads and
/// loops.
template <class ExecSpace>
struct is_host_exec_space : std::false_type {};
#if defined(KOKKOS_ENABLE_SERIAL)
template <>
struct is_host_exec_space<Kokkos::Serial> : std::true_type {};
#endif
#if defined(KOKKOS_ENABLE_OPENMP)
template <>
struct is_host_exec_space<Kokkos::OpenMP> : std::true_type {};
#endif
#if defined(KOKKOS_ENABLE_THREADS)
template <>
struct is_host_exec_space<Kokkos::Threads> : std::true_type {};
#endif
#if defined(KOKKOS_ENABLE_HPX)
template <>
struct is_host_exec_space<Kokkos::Experimental::HPX> : std::true_type {};
#endif

template <class ExecSpace>
struct BackendTraits {
  using memory_space = typename ExecSpace::memory_space;

  /// A host backend: team threads and vector lanes are CPU threads and loops.
  static constexpr bool is_host = is_host_exec_space<ExecSpace>::value;
  /// A GPU backend (CUDA, HIP, SYCL, ...): vector lanes run in lock step.
  static constexpr bool is_gpu = !is_host;

  /// Lanes that execute in lock step (a CUDA warp, a HIP wavefront): the
  /// largest vector length of a team policy on a GPU backend; 1 on a host.
  static int warp_width() {
    return is_host ? 1 : Kokkos::TeamPolicy<ExecSpace>::vector_length_max();
  }
};

/// Whether a launch runs an operator's GPU form on ExecSpace (KernelForm;
/// tensor_cores asks for the GPU form where an operator has no tensor-core
/// form).
template <class ExecSpace>
constexpr bool use_gpu_form(KernelForm form) {
  return form == KernelForm::gpu || form == KernelForm::tensor_cores ||
         (form == KernelForm::automatic && BackendTraits<ExecSpace>::is_gpu);
}

/// The form an operator with a tensor-core form runs on `space` (host, gpu
/// or tensor_cores), for the launch's `asked` form and the forms it has for
/// the sizes at hand (`gpu_form`, `tensor_core_form`; the host form always):
/// tensor cores where asked for, or automatically where the device has them
/// (has_tensor_cores); else as use_gpu_form says.
template <class ExecSpace>
KernelForm chosen_form(const ExecSpace& space, KernelForm asked, bool gpu_form,
                       bool tensor_core_form) {
  if (tensor_core_form && (asked == KernelForm::tensor_cores ||
                           (asked == KernelForm::automatic && BackendTraits<ExecSpace>::is_gpu &&
                            has_tensor_cores(space)))) {
    return KernelForm::tensor_cores;
  }
  return gpu_form && use_gpu_form<ExecSpace>(asked) ? KernelForm::gpu : KernelForm::host;
}

}  // namespace kdnn::impl
