// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Counts the memory allocated through Kokkos while an AllocationCounter
// lives, from Kokkos' tools callbacks: for tests of what a call allocates.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <string>

namespace kdnn_test {

/// Bytes allocated through Kokkos (any memory space) while counting: the
/// current total and its peak.
struct AllocationCounter {
  static inline std::int64_t current = 0, peak = 0;
  static inline std::string labels;  ///< "space:label:bytes " of each allocation, for messages
  static void allocate(Kokkos::Profiling::SpaceHandle space, const char* label, const void*,
                       std::uint64_t bytes) {
    current += std::int64_t(bytes);
    peak = std::max(peak, current);
    labels += std::string(space.name) + ":" + label + ":" + std::to_string(bytes) + " ";
  }
  static void deallocate(Kokkos::Profiling::SpaceHandle, const char*, const void*,
                         std::uint64_t bytes) {
    current -= std::int64_t(bytes);
  }
  AllocationCounter() {
    current = peak = 0;
    labels.clear();
    Kokkos::Tools::Experimental::set_allocate_data_callback(&allocate);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(&deallocate);
  }
  ~AllocationCounter() {
    Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(nullptr);
  }
  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;
};

}  // namespace kdnn_test
