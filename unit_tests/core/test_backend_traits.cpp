// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Backend traits are keyed on the execution space: a space whose memory the
// host can reach is not thereby a host backend (a CUDA build with UVM).
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/backend_traits.hpp"

namespace {

using kdnn::impl::BackendTraits;

/// An execution space kdnn does not know whose memory is host memory (as
/// Kokkos::Cuda's is with UVM): before the traits were keyed on the
/// execution space it counted as a host and took host loops on warps.
struct DeviceWithHostReachableMemory {
  using memory_space = Kokkos::HostSpace;
};

TEST(BackendTraits, KeyedOnTheExecutionSpaceNotOnItsMemory) {
  static_assert(!BackendTraits<DeviceWithHostReachableMemory>::is_host);
  static_assert(BackendTraits<DeviceWithHostReachableMemory>::is_gpu);
  EXPECT_TRUE(BackendTraits<Kokkos::DefaultHostExecutionSpace>::is_host);
  EXPECT_FALSE(BackendTraits<Kokkos::DefaultHostExecutionSpace>::is_gpu);
  EXPECT_EQ(BackendTraits<Kokkos::DefaultHostExecutionSpace>::warp_width(), 1);
#if defined(KOKKOS_ENABLE_SERIAL)
  static_assert(BackendTraits<Kokkos::Serial>::is_host);
#endif
#if defined(KOKKOS_ENABLE_OPENMP)
  static_assert(BackendTraits<Kokkos::OpenMP>::is_host);
#endif
#if defined(KOKKOS_ENABLE_CUDA)
  static_assert(BackendTraits<Kokkos::Cuda>::is_gpu);
  EXPECT_EQ(BackendTraits<Kokkos::Cuda>::warp_width(), 32);
#endif
}

TEST(BackendTraits, AutomaticShapeFollowsTheBackend) {
  using kdnn::KernelForm;
  using kdnn::impl::use_gpu_form;
  using Host = Kokkos::DefaultHostExecutionSpace;
  EXPECT_FALSE(use_gpu_form<Host>(KernelForm::automatic));
  EXPECT_FALSE(use_gpu_form<Host>(KernelForm::host));
  EXPECT_TRUE(use_gpu_form<Host>(KernelForm::gpu));
  EXPECT_TRUE(use_gpu_form<DeviceWithHostReachableMemory>(KernelForm::automatic));
  EXPECT_FALSE(use_gpu_form<DeviceWithHostReachableMemory>(KernelForm::host));
}

}  // namespace
