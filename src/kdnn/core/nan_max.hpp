// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Maxima that propagate NaN, for error statistics: std::max and Kokkos::Max
// drop a NaN operand depending on its position, which would turn "the input
// was NaN" into "the error is 0".
#include <Kokkos_Core.hpp>

namespace kdnn {

/// max(a, b), NaN if either is NaN.
KOKKOS_INLINE_FUNCTION double nan_max(double a, double b) {
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}

/// The NaN-propagating maximum of f(k) >= 0, k = 0..count−1, over a team
/// thread's vector lanes (0 when count = 0). Built from Kokkos' own reducers:
/// the maximum of the values, plus the sum of the NaN ones (0 or NaN).
template <class Member, class F>
KOKKOS_INLINE_FUNCTION double lane_nan_max(const Member& team, int count, const F& f) {
  double max = 0, nan_sum = 0;
  const auto lanes = Kokkos::ThreadVectorRange(team, count);
  Kokkos::parallel_reduce(
      lanes,
      [&](int k, double& m) {
        const double v = f(k);
        if (v > m) m = v;
      },
      Kokkos::Max<double>(max));
  Kokkos::parallel_reduce(
      lanes,
      [&](int k, double& s) {
        const double v = f(k);
        if (v != v) s += v;
      },
      nan_sum);
  return (max > 0 ? max : 0.0) + nan_sum;
}

/// lane_nan_max for one thread: the same maximum, the same NaN.
template <class F>
KOKKOS_INLINE_FUNCTION double thread_nan_max(int count, const F& f) {
  double max = 0, nan_sum = 0;
  for (int k = 0; k < count; ++k) {
    const double v = f(k);
    if (v > max) max = v;
    if (v != v) nan_sum += v;
  }
  return max + nan_sum;
}

}  // namespace kdnn
