#pragma once
// Host <-> device helpers for the Sinkhorn tests: batches live on the default
// execution space, data is built and checked on the host in double.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kdnn/core/error.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"
#include "sinkhorn_reference.hpp"

namespace kdnn_test {

using Space = Kokkos::DefaultExecutionSpace;
template <class T>
using Batch = kdnn::sinkhorn::Batch<T, Space>;
using Report = kdnn::sinkhorn::Report<Space>;

template <class T>
Batch<T> to_device(const std::vector<double>& host, int batch, int n) {
  Batch<T> v("batch", batch, n, n);
  auto h = Kokkos::create_mirror_view(v);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) h(b, i, j) = T(host[(std::size_t(b) * n + i) * n + j]);
  Kokkos::deep_copy(v, h);
  return v;
}

template <class View>
std::vector<double> to_host(const View& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<double> out(h.size());
  for (std::size_t b = 0; b < h.extent(0); ++b)
    for (std::size_t i = 0; i < h.extent(1); ++i)
      for (std::size_t j = 0; j < h.extent(2); ++j)
        out[(b * h.extent(1) + i) * h.extent(2) + j] = double(h(b, i, j));
  return out;
}

template <class View>
std::vector<double> to_host_1d(const View& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<double>(h.data(), h.data() + h.size());
}

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

/// Matrix b of a flattened batch.
inline Mat matrix(const std::vector<double>& all, int b, int n) {
  return Mat(all.begin() + std::size_t(b) * n * n, all.begin() + std::size_t(b + 1) * n * n);
}

/// Runs `f` and returns the kdnn::Error message it throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kdnn::Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_KDNN_ERROR(stmt, fragment)                                          \
  do {                                                                             \
    const std::string kdnn_msg_ = ::kdnn_test::error_of([&] { stmt; });            \
    EXPECT_NE(kdnn_msg_.find(fragment), std::string::npos)                         \
        << "expected kdnn::Error containing \"" << (fragment) << "\", got \""     \
        << kdnn_msg_ << "\"";                                                      \
  } while (0)

}  // namespace kdnn_test
