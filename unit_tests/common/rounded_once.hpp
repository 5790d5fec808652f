// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Checks for operators that store in a 16-bit type and compute in float
// (core/float16.hpp): each output must be its exact value computed in float
// and rounded once to the 16-bit type, so that its error against a double
// reference is at most half a unit in the last place of that type (the
// rounding) plus the float computation's own error. A kernel that rounded
// an intermediate to 16 bits, or computed in 16 bits, errs by about a unit
// or more and fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

#include "allclose.hpp"
#include "views.hpp"

namespace kdnn_test {

/// The values as a View of T would hold them (rounded to T), as double.
template <class T>
std::vector<double> quantized(std::vector<double> values) {
  for (double& v : values) v = as_double(stored_as<T>(v));
  return values;
}

/// The spacing of T's values around |x| (the subnormal spacing below the
/// smallest normal): 2^(e − m) for 2^e ≤ |x| < 2^(e+1), m mantissa bits.
template <class T>
double ulp_of(double x) {
  static_assert(kdnn::is_float16_storage_v<T>, "ulp_of: a 16-bit storage type");
  constexpr bool bf16 = std::is_same_v<T, kdnn::bfloat16>;
  constexpr int mantissa = bf16 ? 7 : 10, emin = bf16 ? -126 : -14;
  const double a = std::fabs(x);
  const int e = a > 0 ? std::max(std::ilogb(a), emin) : emin;
  return std::ldexp(1.0, e - mantissa);
}

/// The largest error of `got` against `want` in units of T's spacing at
/// `want`, after taking off `fp32_tol`·(1 + |want|) (the float
/// computation's error); NaN and infinities must be where `want` has them.
template <class T>
double rounding_error_in_ulps(const std::vector<double>& got, const std::vector<double>& want,
                              double fp32_tol, const char* what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (!std::isfinite(want[i]) || !std::isfinite(got[i])) {
      const bool same = std::isnan(want[i]) ? std::isnan(got[i]) : got[i] == want[i];
      EXPECT_TRUE(same) << what << "[" << i << "] = " << got[i] << ", expected " << want[i];
      continue;
    }
    const double excess = std::fabs(got[i] - want[i]) - fp32_tol * (1 + std::fabs(want[i]));
    worst = std::max(worst, excess / ulp_of<T>(want[i]));
  }
  return worst;
}

/// Expects every element of `got` within half a unit of T of `want` plus
/// `fp32_tol`·(1 + |want|).
template <class T>
void expect_rounded_once(const std::vector<double>& got, const std::vector<double>& want,
                         double fp32_tol, const char* what) {
  EXPECT_LE(rounding_error_in_ulps<T>(got, want, fp32_tol, what), 0.5) << what;
}

/// For the tests typed over every storage type: a 16-bit T's results
/// rounded once (expect_rounded_once with `tol` for the float computation),
/// a float or double T's within `tol` relative and absolute.
template <class T>
void expect_close_as_stored(const std::vector<double>& got, const std::vector<double>& want,
                            double tol, const char* what) {
  if constexpr (kdnn::is_float16_storage_v<T>) {
    expect_rounded_once<T>(got, want, tol, what);
  } else {
    EXPECT_ALLCLOSE(got, want, tol, tol) << what;
  }
}

}  // namespace kdnn_test
