// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// exp_vectorisable (core/impl/exp_vectorisable.hpp), the host's polynomial
// e^x: for float within a few ulp of the double exp over the whole range
// where e^x is a normal float, for double of the long double exp over the
// whole range (subnormal results within one of their ulp); exact at 0, and
// the documented edges (float: 0 below ln FLT_MIN, +inf above 88; both: 0
// at −inf, NaN through).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>

#include "kdnn/core/impl/exp_vectorisable.hpp"

namespace {

using kdnn::impl::exp_vectorisable;

TEST(ExpVectorisable, FloatWithinFourUlpOverTheNormalRange) {
  double worst = 0;
  float worst_x = 0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -87.33f + float(i) * (88.0f + 87.33f) / 2000000.0f;
    const double exact = std::exp(double(x));
    const double error = std::abs(double(exp_vectorisable(x)) - exact) / exact;
    if (error > worst) worst = error, worst_x = x;
  }
  EXPECT_LE(worst, 4 * double(FLT_EPSILON)) << "worst at x = " << worst_x;
}

TEST(ExpVectorisable, FloatEdges) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_vectorisable(0.0f), 1.0f);
  EXPECT_EQ(exp_vectorisable(-inf), 0.0f);
  EXPECT_EQ(exp_vectorisable(-88.0f), 0.0f);  // below ln FLT_MIN: flushed
  EXPECT_EQ(exp_vectorisable(-1e30f), 0.0f);
  EXPECT_EQ(exp_vectorisable(88.5f), inf);
  EXPECT_EQ(exp_vectorisable(inf), inf);
  EXPECT_TRUE(std::isnan(exp_vectorisable(std::numeric_limits<float>::quiet_NaN())));
  // Halfway cases of the reduction x = n·ln 2 + r round either way.
  for (int n = -120; n <= 120; ++n) {
    const float x = (float(n) + 0.5f) * 0.69314718f;
    EXPECT_NEAR(exp_vectorisable(x) / std::exp(double(x)), 1.0, 4 * double(FLT_EPSILON)) << x;
  }
}

TEST(ExpVectorisable, DoubleWithinFourUlpOverTheWholeRange) {
  long double worst = 0;
  double worst_x = 0;
  for (int i = 0; i <= 2000000; ++i) {
    const double x = -745.0 + double(i) * (709.78 + 745.0) / 2000000.0;
    const long double exact = std::exp((long double)x);
    const long double got = exp_vectorisable(x);
    // Relative error where e^x is normal; where it is subnormal, in units
    // of the smallest normal's ulp (a subnormal's spacing).
    const long double error =
        exact >= DBL_MIN ? std::abs(got - exact) / exact : std::abs(got - exact) / DBL_MIN;
    if (error > worst) worst = error, worst_x = x;
  }
  EXPECT_LE(worst, 4 * (long double)DBL_EPSILON) << "worst at x = " << worst_x;
}

TEST(ExpVectorisable, DoubleEdges) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(exp_vectorisable(0.0), 1.0);
  EXPECT_EQ(exp_vectorisable(-inf), 0.0);
  EXPECT_EQ(exp_vectorisable(-746.0), 0.0);
  EXPECT_EQ(exp_vectorisable(-1e300), 0.0);
  EXPECT_EQ(exp_vectorisable(710.0), inf);
  EXPECT_EQ(exp_vectorisable(inf), inf);
  EXPECT_TRUE(std::isnan(exp_vectorisable(std::numeric_limits<double>::quiet_NaN())));
  // The largest finite result and the smallest subnormal ones.
  EXPECT_NEAR(exp_vectorisable(709.78) / std::exp(709.78), 1.0, 4 * DBL_EPSILON);
  EXPECT_GT(exp_vectorisable(-744.0), 0.0);
  EXPECT_NEAR(exp_vectorisable(-744.0), std::exp(-744.0), DBL_TRUE_MIN);
  for (int n = -1000; n <= 1000; n += 7) {
    const double x = (double(n) + 0.5) * 0.6931471805599453;
    EXPECT_NEAR(exp_vectorisable(x) / std::exp(x), 1.0, 4 * DBL_EPSILON) << x;
  }
}

}  // namespace
