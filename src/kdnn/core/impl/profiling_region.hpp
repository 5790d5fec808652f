// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// A Kokkos profiling region for the lifetime of a scope (pushed on
// construction, popped on destruction, also when an error unwinds it): what
// profilers (Nsight Systems through Kokkos' tools, the Kokkos tools' space
// time stack) show around kdnn's host-side steps.
#include <Kokkos_Core.hpp>

namespace kdnn::impl {

class ProfilingRegion {
 public:
  explicit ProfilingRegion(const char* name) { Kokkos::Profiling::pushRegion(name); }
  ~ProfilingRegion() { Kokkos::Profiling::popRegion(); }
  ProfilingRegion(const ProfilingRegion&) = delete;
  ProfilingRegion& operator=(const ProfilingRegion&) = delete;
};

}  // namespace kdnn::impl
