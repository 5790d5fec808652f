// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The largest magnitude among a View's elements, for range checks that must
// see a NaN (Kokkos::Max drops a NaN operand depending on its position).
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <limits>
#include <type_traits>

#include "kdnn/core/compat.hpp"

namespace kdnn::impl {

/// |x|, or `inf` for NaN. Selects, not branches: a sign branch on random
/// data is mispredicted half the time (measured 7× slower than these).
KOKKOS_INLINE_FUNCTION double magnitude_or_inf(double x, double inf) {
  const double a = compat::fabs(x);
  return a == a ? a : inf;
}

/// max |x| over the elements of a View (contiguous, or a strided rank-4
/// one, whose elements are read through its strides and nothing between
/// them), +inf if one is NaN or infinite, 0 for an empty View: one reduction
/// on `space`, whose result the host waits for.
template <class ExecSpace, class View>
double largest_magnitude(const ExecSpace& space, const View& v) {
  constexpr bool strided = std::is_same_v<typename View::array_layout, Kokkos::LayoutStride>;
  static_assert(!strided || unsigned(View::rank) == 4,
                "largest_magnitude: a strided View must be of rank 4");
  const double inf = std::numeric_limits<double>::infinity();  // taken by the lambdas
  double largest = 0;
  if constexpr (strided) {
    // One row (b, h, s) per iteration and a loop along it, as selects the
    // host vectorises: no index arithmetic per element (a flat index took
    // three 64-bit divisions each) and no branch on the data.
    using T = typename View::non_const_value_type;
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
          bool nan = false;
          for (Index d = 0; d < n3; ++d) {
            const T a = compat::fabs(v(b, h, s, d));
            nan |= !(a == a);
            row = a > row ? a : row;
          }
          const double a = nan ? inf : double(row);
          m = a > m ? a : m;
        },
        Kokkos::Max<double>(largest));
  } else {
    const auto* data = v.data();
    Kokkos::parallel_reduce(
        "kdnn::largest_magnitude", Kokkos::RangePolicy<ExecSpace>(space, 0, v.span()),
        KOKKOS_LAMBDA(std::size_t i, double& m) {
          const double a = magnitude_or_inf(double(data[i]), inf);
          m = a > m ? a : m;
        },
        Kokkos::Max<double>(largest));
  }
  return largest > 0 ? largest : 0.0;  // the reducer's identity for an empty View
}

}  // namespace kdnn::impl
