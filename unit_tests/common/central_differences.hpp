// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Gradients by central differences, the tests' independent reference for
// every backward.
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

}  // namespace kdnn_test
