#pragma once
// What a kernel's launch planning needs to know about a Kokkos backend.
#include <Kokkos_Core.hpp>

namespace kdnn::impl {

template <class ExecSpace>
struct BackendTraits {
  using memory_space = typename ExecSpace::memory_space;

  /// A host backend: team threads and vector lanes are CPU threads and loops.
  static constexpr bool is_host =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, memory_space>::accessible;

  /// Lanes that execute in lock step (a CUDA warp, a HIP wavefront): the
  /// largest vector length of a team policy on a GPU backend; 1 on a host.
  static int warp_width() {
    return is_host ? 1 : Kokkos::TeamPolicy<ExecSpace>::vector_length_max();
  }
};

}  // namespace kdnn::impl
