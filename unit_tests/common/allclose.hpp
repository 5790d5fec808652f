// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Comparisons of flat results with a reference:
//  * EXPECT_ALLCLOSE(actual, expected, rtol, atol): every element satisfies
//    |a − e| <= atol + rtol·|e| (NumPy's allclose; NaN is never close); a
//    failure reports how many elements fail and the worst one (index, both
//    values, the excess over its bound).
//  * rel_error(a, b) = ||a − b|| / ||b||, for norm-wise tolerances.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

namespace kdnn_test {

inline ::testing::AssertionResult allclose(const char* actual_expr, const char* expected_expr,
                                           const char*, const char*,
                                           const std::vector<double>& actual,
                                           const std::vector<double>& expected, double rtol,
                                           double atol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << actual_expr << " has " << actual.size() << " elements, "
                                         << expected_expr << " has " << expected.size();
  }
  std::size_t failures = 0, worst = 0;
  double worst_excess = -1;
  for (std::size_t k = 0; k < actual.size(); ++k) {
    const double diff = std::abs(actual[k] - expected[k]);
    const double bound = atol + rtol * std::abs(expected[k]);
    const bool close = diff <= bound;  // false for NaN
    if (close) continue;
    ++failures;
    const double excess = std::isnan(diff) ? INFINITY : diff / std::max(bound, 1e-300);
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = k;
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(17);
  os << actual_expr << " is not close to " << expected_expr << " (rtol=" << rtol
     << ", atol=" << atol << "): " << failures << " of " << actual.size()
     << " elements differ; worst at index " << worst << ": " << actual[worst] << " vs "
     << expected[worst] << " (|diff| = " << std::abs(actual[worst] - expected[worst]) << ", "
     << worst_excess << "x its bound)";
  return ::testing::AssertionFailure() << os.str();
}

#define EXPECT_ALLCLOSE(actual, expected, rtol, atol) \
  EXPECT_PRED_FORMAT4(::kdnn_test::allclose, actual, expected, rtol, atol)
#define ASSERT_ALLCLOSE(actual, expected, rtol, atol) \
  ASSERT_PRED_FORMAT4(::kdnn_test::allclose, actual, expected, rtol, atol)

/// ||a − b|| / max(||b||, tiny).
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    num += (a[k] - b[k]) * (a[k] - b[k]);
    den += b[k] * b[k];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

}  // namespace kdnn_test
