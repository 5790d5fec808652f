// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The largest magnitude among a View's elements, for range checks that must
// see a NaN (Kokkos::Max drops a NaN operand depending on its position).
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <limits>
#include <type_traits>

namespace kdnn::impl {

/// |x|, or `inf` for NaN.
KOKKOS_INLINE_FUNCTION double magnitude_or_inf(double x, double inf) {
  return x != x ? inf : (x < 0 ? -x : x);
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
    const std::size_t n1 = v.extent(1), n2 = v.extent(2), n3 = v.extent(3);
    Kokkos::parallel_reduce(
        "kdnn::largest_magnitude", Kokkos::RangePolicy<ExecSpace>(space, 0, v.size()),
        KOKKOS_LAMBDA(std::size_t i, double& m) {
          const std::size_t d = i % n3, r = i / n3;
          const double a = magnitude_or_inf(double(v(r / n2 / n1, r / n2 % n1, r % n2, d)), inf);
          if (a > m) m = a;
        },
        Kokkos::Max<double>(largest));
  } else {
    const auto* data = v.data();
    Kokkos::parallel_reduce(
        "kdnn::largest_magnitude", Kokkos::RangePolicy<ExecSpace>(space, 0, v.span()),
        KOKKOS_LAMBDA(std::size_t i, double& m) {
          const double a = magnitude_or_inf(double(data[i]), inf);
          if (a > m) m = a;
        },
        Kokkos::Max<double>(largest));
  }
  return largest > 0 ? largest : 0.0;  // the reducer's identity for an empty View
}

}  // namespace kdnn::impl
