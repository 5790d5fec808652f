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
  // An operator without a tensor-core form runs its GPU form for it.
  EXPECT_TRUE(use_gpu_form<Host>(KernelForm::tensor_cores));
}

// chosen_form: what an operator with host, GPU and tensor-core forms runs,
// given which of the last two it has for the sizes at hand. A host never
// takes tensor cores by itself (it has none); asked for them, it runs the
// form, emulated, where it exists, and the next form down elsewhere.
TEST(BackendTraits, ChosenFormFallsBackToTheFormsAnOperatorHas) {
  using kdnn::KernelForm;
  using kdnn::impl::chosen_form;
  using Host = Kokkos::DefaultHostExecutionSpace;
  const Host host;
  EXPECT_FALSE(kdnn::impl::has_tensor_cores(host));
  EXPECT_EQ(chosen_form(host, KernelForm::automatic, true, true), KernelForm::host);
  EXPECT_EQ(chosen_form(host, KernelForm::host, true, true), KernelForm::host);
  EXPECT_EQ(chosen_form(host, KernelForm::gpu, true, true), KernelForm::gpu);
  EXPECT_EQ(chosen_form(host, KernelForm::gpu, false, true), KernelForm::host);
  EXPECT_EQ(chosen_form(host, KernelForm::tensor_cores, true, true), KernelForm::tensor_cores);
  EXPECT_EQ(chosen_form(host, KernelForm::tensor_cores, true, false), KernelForm::gpu);
  EXPECT_EQ(chosen_form(host, KernelForm::tensor_cores, false, false), KernelForm::host);
#if defined(KOKKOS_ENABLE_CUDA)
  // On a GPU: tensor cores where the device has them, else the GPU form.
  const Kokkos::Cuda cuda;
  EXPECT_EQ(chosen_form(cuda, KernelForm::automatic, true, true),
            kdnn::impl::has_tensor_cores(cuda) ? KernelForm::tensor_cores : KernelForm::gpu);
  EXPECT_EQ(chosen_form(cuda, KernelForm::automatic, true, false), KernelForm::gpu);
  EXPECT_EQ(chosen_form(cuda, KernelForm::automatic, false, false), KernelForm::host);
#endif
}

}  // namespace
