// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What MPI may be handed directly: host memory always; device memory only
// when the MPI library says it is CUDA-aware (Open MPI's
// MPIX_Query_cuda_support). Otherwise buffers are staged through host
// memory. And the MPI datatype of float and double.
#include <mpi.h>
#if defined(KOKKOS_ENABLE_CUDA) && defined(OPEN_MPI) && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <Kokkos_Core.hpp>
#include <string>
#include <type_traits>

namespace kdnn::cp::impl {

/// The MPI datatype of float, double or int (sequence ids) elements.
template <class T>
MPI_Datatype mpi_type() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int>,
                "float, double or int");
  if constexpr (std::is_same_v<T, int>) return MPI_INT;
  return std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
}

/// Whether MPI can read and write `MemorySpace` directly.
template <class MemorySpace>
bool mpi_reaches() {
  if (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible) return true;
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

/// A buffer MPI reads or writes: `device` in the operator's memory space and,
/// when MPI cannot reach that space, a host copy.
template <class T, class ExecSpace>
struct MpiBuffer {
  using Device = Kokkos::View<T*, typename ExecSpace::memory_space>;
  Device device;
  typename Device::HostMirror host;
  bool staged = false;

  MpiBuffer(const char* label, std::size_t n)
      : device(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n),
        staged(!mpi_reaches<typename ExecSpace::memory_space>()) {
    host = staged ? Kokkos::create_mirror_view(device) : typename Device::HostMirror();
  }
  /// The pointer MPI gets.
  T* mpi_data() const { return staged ? host.data() : device.data(); }
  /// Before MPI reads it (after the pack kernel): device → host. Blocks.
  void to_mpi(const ExecSpace& space) const {
    if (staged) Kokkos::deep_copy(space, host, device);
    space.fence();
  }
  /// After MPI wrote it: host → device (ordered on `space`).
  void from_mpi(const ExecSpace& space) const {
    if (staged) Kokkos::deep_copy(space, device, host);
  }
};

}  // namespace kdnn::cp::impl
