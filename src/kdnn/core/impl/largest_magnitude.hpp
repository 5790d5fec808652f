// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The largest finite magnitude among a View's elements, for range checks of
// finite data (non-finite values are check_finite's: they propagate, as in
// PyTorch, unless it refuses them).
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <limits>
#include <type_traits>

#include "kdnn/core/compat.hpp"

namespace kdnn::impl {

/// |x| where x is finite, else 0. Selects, not branches: a sign branch on
/// random data is mispredicted half the time (measured 7× slower than these).
template <class T>
KOKKOS_INLINE_FUNCTION T finite_magnitude(T x, T largest) {
  const T a = compat::fabs(x);
  return a <= largest ? a : T(0);  // false for NaN and ±inf
}

/// max |x| over the finite elements of a View (contiguous, or a strided
/// rank-4 one, whose elements are read through its strides and nothing
/// between them), 0 for an empty View: one reduction on `space`, whose
/// result the host waits for.
template <class ExecSpace, class View>
double largest_finite_magnitude(const ExecSpace& space, const View& v) {
  constexpr bool strided = std::is_same_v<typename View::array_layout, Kokkos::LayoutStride>;
  static_assert(!strided || unsigned(View::rank) == 4,
                "largest_magnitude: a strided View must be of rank 4");
  using T = typename View::non_const_value_type;
  const T top = std::numeric_limits<T>::max();  // taken by the lambdas
  double largest = 0;
  if constexpr (strided) {
    // One row (b, h, s) per iteration and a loop along it, as selects the
    // host vectorises: no index arithmetic per element (a flat index took
    // three 64-bit divisions each) and no branch on the data.
    using Policy =
        Kokkos::MDRangePolicy<ExecSpace,
                              Kokkos::Rank<3, Kokkos::Iterate::Right, Kokkos::Iterate::Right>>;
    using Index = typename Policy::index_type;
    const Index n3 = Index(v.extent(3));
    Kokkos::parallel_reduce(
        "kdnn::largest_magnitude",
        Policy(space, {0, 0, 0}, {Index(v.extent(0)), Index(v.extent(1)), Index(v.extent(2))}),
        KOKKOS_LAMBDA(Index b, Index h, Index s, double& m) {
          T row = 0;
          for (Index d = 0; d < n3; ++d) {
            const T a = finite_magnitude(v(b, h, s, d), top);
            row = a > row ? a : row;
          }
          m = double(row) > m ? double(row) : m;
        },
        Kokkos::Max<double>(largest));
  } else {
    const auto* data = v.data();
    Kokkos::parallel_reduce(
        "kdnn::largest_magnitude", Kokkos::RangePolicy<ExecSpace>(space, 0, v.span()),
        KOKKOS_LAMBDA(std::size_t i, double& m) {
          const double a = double(finite_magnitude(data[i], top));
          m = a > m ? a : m;
        },
        Kokkos::Max<double>(largest));
  }
  return largest > 0 ? largest : 0.0;  // the reducer's identity for an empty View
}

}  // namespace kdnn::impl
