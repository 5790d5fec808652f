// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Gradients by central differences, the tests' independent reference for
// every backward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

namespace kdnn_test {

/// d loss() / d x[k] for every k, (loss(x + h·e_k) − loss(x − h·e_k)) / 2h:
/// x is changed in place and restored after each k.
template <class Loss>
std::vector<double> central_differences(std::vector<double>& x, const Loss& loss, double h) {
  std::vector<double> g(x.size());
  for (std::size_t k = 0; k < x.size(); ++k) {
    const double x0 = x[k];
    x[k] = x0 + h;
    const double up = loss();
    x[k] = x0 - h;
    const double down = loss();
    x[k] = x0;
    g[k] = (up - down) / (2 * h);
  }
  return g;
}

/// Expects grad, the gradient named `name` that a backward gave for x, to
/// match central_differences(x, loss, h) element by element within
/// tol·(1 + |the difference quotient|), naming the element that does not.
template <class Loss>
void expect_gradient(const char* name, std::vector<double>& x, const Loss& loss, double h,
                     const std::vector<double>& grad, double tol) {
  const std::vector<double> numeric = central_differences(x, loss, h);
  ASSERT_EQ(grad.size(), numeric.size()) << name;
  for (std::size_t e = 0; e < x.size(); ++e) {
    EXPECT_NEAR(grad[e], numeric[e], tol * (1 + std::abs(numeric[e]))) << name << "[" << e << "]";
  }
}

}  // namespace kdnn_test
