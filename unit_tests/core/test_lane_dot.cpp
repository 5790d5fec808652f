// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Dot products of a lane's registers with a vector in team scratch
// (core/impl/lane_dot.hpp): lane_dot_shared with one chain gives lane_dot's
// bits (the 16-byte pieces change the reads, not the sum), and with two or
// four chains the sum the header states (chain c over k ≡ c mod C in order,
// then (0 + 1) + (2 + 3)), bitwise on a host (this file is compiled without
// contraction of a·b + c, as the library's host build may contract: see
// unit_tests/CMakeLists.txt). The kernel runs on the test backend: on a GPU
// the vector is read from shared memory by the N lanes of a team thread,
// each with its own row; the device contracts, so there one chain must give
// lane_dot's bits and the chains the stated sum to rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/lane_dot.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "random.hpp"
#include "views.hpp"

namespace {

namespace ki = kdnn::impl;
using kdnn_test::Space;

template <class T>
class LaneDot : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(LaneDot, Types);

/// One team thread with N lanes (1 on a host, which plays them in turn):
/// y to scratch, then lane i's row i of `a` to its registers and
/// out(c, i) = lane_dot_shared<N, C>(row, y) for C = 1, 2, 4 (c = 0, 1, 2)
/// and out(3, i) = lane_dot<N>(row, y).
template <class T, int N>
struct DotKernel {
  using Member = typename Kokkos::TeamPolicy<Space>::member_type;
  Kokkos::View<const T**, Kokkos::LayoutRight, Space> a;
  Kokkos::View<const T*, Space> y;
  Kokkos::View<T**, Kokkos::LayoutRight, Space> out;

  static KOKKOS_INLINE_FUNCTION std::size_t scratch_bytes() {
    return ki::layout_bytes([](ki::ScratchCarver& s) { s.take<T>(N); });
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    ki::ScratchCarver carver(ki::team_scratch_base(team, 0, scratch_bytes()));
    T* ys = carver.take<T>(N);
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, N), [&](int k) { ys[k] = y(k); });
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, N), [&](int i) {
      T row[N];
      for (int k = 0; k < N; ++k) row[k] = a(i, k);
      out(0, i) = ki::lane_dot_shared<N, 1>(row, ys);
      out(1, i) = ki::lane_dot_shared<N, 2>(row, ys);
      out(2, i) = ki::lane_dot_shared<N, 4>(row, ys);
      out(3, i) = ki::lane_dot<N>(row, ys);
    });
  }
};

/// The sum of C chains as the header states it.
template <class T>
T chains_reference(const std::vector<T>& a, const std::vector<T>& y, int C) {
  std::vector<T> s(C);
  for (std::size_t k = 0; k < a.size(); ++k) {
    const T t = a[k] * y[k];
    s[k % C] = k < std::size_t(C) ? t : s[k % C] + t;
  }
  if (C == 1) return s[0];
  if (C == 2) return s[0] + s[1];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

template <class T, int N>
void check(unsigned seed) {
  SCOPED_TRACE("N=" + std::to_string(N));
  // Mixed signs and magnitudes, so that a different order gives other bits.
  auto av = kdnn_test::uniform(std::size_t(N) * N, -1.0, 1.0, seed);
  auto yv = kdnn_test::uniform(N, -1.0, 1.0, seed + 1);
  for (int k = 0; k < N; ++k) yv[k] *= 1 + 100 * (k % 3);
  const auto a = kdnn_test::to_device<T**>(av, N, N);
  const auto y = kdnn_test::to_device<T*>(yv, N);
  Kokkos::View<T**, Kokkos::LayoutRight, Space> out("out", 4, N);
  const DotKernel<T, N> kernel{a, y, out};
  const bool gpu = ki::BackendTraits<Space>::is_gpu;
  Kokkos::parallel_for(
      Kokkos::TeamPolicy<Space>(1, 1, gpu ? N : 1)
          .set_scratch_size(
              0, Kokkos::PerTeam(ki::team_scratch_request(DotKernel<T, N>::scratch_bytes()))),
      kernel);
  const auto got = kdnn_test::to_host(out);
  std::vector<T> yt(N);
  for (int k = 0; k < N; ++k) yt[k] = T(yv[k]);
  bool chains_differ = false;
  for (int i = 0; i < N; ++i) {
    std::vector<T> row(N);
    for (int k = 0; k < N; ++k) row[k] = T(av[i * N + k]);
    const T in_order = chains_reference(row, yt, 1);
    EXPECT_EQ(T(got[0 * N + i]), T(got[3 * N + i])) << "one chain against lane_dot, row " << i;
    if (gpu) {  // contracted on the device: to rounding, N roundings of Σ|a_k y_k| at most
      double magnitude = 0;
      for (int k = 0; k < N; ++k) magnitude += std::fabs(double(row[k]) * double(yt[k]));
      const double bound = 2.0 * N * std::numeric_limits<T>::epsilon() * magnitude;
      for (int c = 0; c < 3; ++c) {
        EXPECT_NEAR(double(got[c * N + i]), double(chains_reference(row, yt, 1 << c)), bound)
            << (1 << c) << " chains, row " << i;
      }
    } else {
      EXPECT_EQ(T(got[3 * N + i]), in_order) << "lane_dot, row " << i;
      EXPECT_EQ(T(got[1 * N + i]), chains_reference(row, yt, 2)) << "two chains, row " << i;
      EXPECT_EQ(T(got[2 * N + i]), chains_reference(row, yt, 4)) << "four chains, row " << i;
    }
    chains_differ = chains_differ || chains_reference(row, yt, 4) != in_order;
  }
  EXPECT_TRUE(chains_differ) << "data too tame: the chains' order left every bit unchanged";
}

TYPED_TEST(LaneDot, PiecesKeepTheOrderAndChainsSumAsStated) {
  using T = TypeParam;
  check<T, 4>(1);
  check<T, 8>(2);
  check<T, 16>(3);
  check<T, 32>(4);
}

}  // namespace
