// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The largest magnitude among a View's elements, for range checks that must
// see a NaN (Kokkos::Max drops a NaN operand depending on its position).
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <limits>

namespace kdnn::impl {

/// max |x| over the elements of a contiguous View, +inf if one is NaN or
/// infinite, 0 for an empty View: one reduction on `space`, whose result the
/// host waits for.
template <class ExecSpace, class View>
double largest_magnitude(const ExecSpace& space, const View& v) {
  const auto* data = v.data();
  const double inf = std::numeric_limits<double>::infinity();  // taken by the lambda
  double largest = 0;
  Kokkos::parallel_reduce(
      "kdnn::largest_magnitude", Kokkos::RangePolicy<ExecSpace>(space, 0, v.span()),
      KOKKOS_LAMBDA(std::size_t i, double& m) {
        const double x = double(data[i]);
        const double a = x != x ? inf : (x < 0 ? -x : x);
        if (a > m) m = a;
      },
      Kokkos::Max<double>(largest));
  return largest > 0 ? largest : 0.0;  // the reducer's identity for an empty View
}

}  // namespace kdnn::impl
