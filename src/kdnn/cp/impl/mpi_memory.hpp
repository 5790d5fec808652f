// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What MPI may be handed directly: host memory always; device memory only
// when the MPI library says it is CUDA-aware (Open MPI's
// MPIX_Query_cuda_support). Otherwise buffers are staged through host
// memory. And the MPI datatypes of the element types.
#include <mpi.h>
#if defined(KOKKOS_ENABLE_CUDA) && defined(OPEN_MPI) && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <Kokkos_Core.hpp>
#include <string>
#include <type_traits>

#include "kdnn/core/float16.hpp"

namespace kdnn::cp::impl {

/// The MPI datatype that moves elements of type T: float, double, int
/// (sequence ids), or a 16-bit storage type (as its bits, MPI_UINT16_T).
template <class T>
MPI_Datatype mpi_type() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int> ||
                    is_float16_storage_v<T>,
                "float, double, int or a 16-bit storage type");
  if constexpr (std::is_same_v<T, int>) return MPI_INT;
  if constexpr (is_float16_storage_v<T>) return MPI_UINT16_T;
  return std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
}

/// The MPI datatype of a reduction's (MPI_SUM's) elements: float or double
/// only; a 16-bit value is summed in its compute type, never as bits.
template <class T>
MPI_Datatype mpi_sum_type() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "MPI sums run in float or double");
  return mpi_type<T>();
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
