// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Several independent small systems in the lanes of one SIMD vector, for host
// kernels whose per-system work is too small to vectorise inside one system
// (Sinkhorn's unrolled backward at n = 4: a 4-wide product per step, each
// step waiting for the last). Lanes<T, true>::type holds `width` values of T,
// one per system, and every arithmetic operator acts lane by lane; with
// GCC or Clang on a host it is a 16-byte vector (4 floats, 2 doubles: the
// SSE2 baseline; 32-byte vectors without AVX measured 2.5× slower).
// Elsewhere (a GPU, other compilers) and for Lanes<T, false> it is T itself
// with width 1, so one kernel source serves both: a lane's results are those
// of the same operations on T.
#include <type_traits>

#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/host_simd.hpp"

namespace kdnn::impl {

template <class T, bool Vectorise>
struct Lanes {
  using type = T;
  static constexpr int width = 1;
};

#if KDNN_IMPL_HOST_SIMD
template <class T>
struct Lanes<T, true> {
  using type = typename HostVector<T, 16>::type;
  static constexpr int width = HostVector<T, 16>::width;
};
#endif

/// Whether C is a lanes vector rather than a plain number.
template <class C>
constexpr bool is_lanes_v = !std::is_arithmetic_v<C>;

/// Every lane of a C set to x.
template <class C, class T>
KOKKOS_FORCEINLINE_FUNCTION C broadcast(T x) {
  if constexpr (is_lanes_v<C>) {
    using Element = std::remove_reference_t<decltype(C{}[0])>;
    return C{} + static_cast<Element>(x);
  } else {
    return C(x);
  }
}

/// Lane l of v (v itself for a plain number).
template <class C>
KOKKOS_FORCEINLINE_FUNCTION auto lane(const C& v, [[maybe_unused]] int l) {
  if constexpr (is_lanes_v<C>) {
    return v[l];
  } else {
    return v;
  }
}

/// Sets lane l of v to x.
template <class C, class T>
KOKKOS_FORCEINLINE_FUNCTION void set_lane(C& v, [[maybe_unused]] int l, T x) {
  if constexpr (is_lanes_v<C>) {
    v[l] = x;
  } else {
    v = C(x);
  }
}

}  // namespace kdnn::impl
