// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::impl::CompiledSizes: the one way an operator turns a run-time extent
// into the compile-time size its GPU form is instantiated for. The list is
// the switch: a size runs only when it is listed, and for any other size
// nothing runs and the caller's host form takes over, so no second list has
// to be kept in step with the first.
#include <Kokkos_Macros.hpp>
#include <type_traits>

namespace kdnn::impl {

template <int... List>
struct CompiledSizes {
  /// Whether d is one of the sizes.
  KOKKOS_INLINE_FUNCTION static constexpr bool contains(int d) { return ((d == List) || ...); }

  /// Calls run(std::integral_constant<int, d>{}) when d is one of the sizes;
  /// says whether it did.
  template <class Run>
  static bool dispatch(int d, const Run& run) {
    return ((d == List && (run(std::integral_constant<int, List>{}), true)) || ...);
  }
};

}  // namespace kdnn::impl
