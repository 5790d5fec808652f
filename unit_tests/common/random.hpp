// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Seeded random fills for test data (host, double, no Kokkos).
#include <cstddef>
#include <random>
#include <vector>

namespace kdnn_test {

inline std::vector<double> uniform(std::size_t count, double lo, double hi, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(count);
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<double> normal(std::size_t count, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> v(count);
  for (auto& x : v) x = dist(gen);
  return v;
}

}  // namespace kdnn_test
