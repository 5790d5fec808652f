// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The butterfly sum over a team thread's vector lanes
// (core/impl/lane_butterfly.hpp) and the loops built on it (ButterflyLoops,
// core/impl/vector_loops.hpp): against a recursive statement of the
// butterfly, bitwise, and against the exact sum on integer data. On the CPU
// the lanes are emulated; in a GPU build the same kernel runs the shuffles
// and must give the emulation's bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/lane_butterfly.hpp"
#include "kdnn/core/impl/vector_loops.hpp"
#include "random.hpp"
#include "views.hpp"

namespace {

namespace ki = kdnn::impl;
using kdnn_test::Space;

template <class T>
class LaneButterfly : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(LaneButterfly, Types);

/// The butterfly stated recursively: the first step adds the two halves,
/// lane l < L/2 getting v_l + v_{l + L/2}; the rest is the butterfly of
/// those L/2 values.
template <class T>
T recursive_butterfly(std::vector<T> v) {
  while (v.size() > 1) {
    const std::size_t h = v.size() / 2;
    std::vector<T> w(h);
    for (std::size_t l = 0; l < h; ++l) w[l] = v[l] + v[l + h];
    v = w;
  }
  return v[0];
}

/// What ButterflyLoops<L>::sum gives for the entries x: lane l sums the
/// x_k with k mod L = l in order from zero, then the butterfly.
template <class T>
T loops_reference(const std::vector<T>& x, int L) {
  std::vector<T> part(L, T(0));
  for (std::size_t k = 0; k < x.size(); ++k) part[k % L] += x[k];
  return recursive_butterfly(part);
}

template <int L, class T>
void check_host_steps(unsigned seed) {
  SCOPED_TRACE("L=" + std::to_string(L));
  const auto r = kdnn_test::uniform(L, -1.0, 1.0, seed);
  T v[L];
  std::vector<T> ref(L);
  for (int l = 0; l < L; ++l) v[l] = ref[l] = T(r[l] * (1 + l));  // mixed magnitudes
  ki::lane_butterfly_sum<L>(v);
  const T want = recursive_butterfly(ref);
  for (int l = 0; l < L; ++l) EXPECT_EQ(v[l], want) << "lane " << l;  // bitwise

  T n[L];
  long exact = 0;
  for (int l = 0; l < L; ++l) {
    n[l] = T(int(r[l] * 1000));
    exact += long(n[l]);
  }
  ki::lane_butterfly_sum<L>(n);
  for (int l = 0; l < L; ++l) EXPECT_EQ(n[l], T(exact)) << "lane " << l;
}

TYPED_TEST(LaneButterfly, HostStepsAreTheRecursiveButterfly) {
  using T = TypeParam;
  check_host_steps<1, T>(1);
  check_host_steps<2, T>(2);
  check_host_steps<4, T>(3);
  check_host_steps<8, T>(4);
  check_host_steps<16, T>(5);
  check_host_steps<32, T>(6);
}

/// A team of two threads, each with L vector lanes: thread 0 sums x by
/// ButterflyLoops<L> (sum) and x and y together (two_sums), and every lane
/// writes the totals to out(lane, 0 … 2); thread 1 stays idle (the
/// butterfly involves the calling thread's lanes only).
template <class T, int L>
struct LoopsSum {
  using Member = typename Kokkos::TeamPolicy<Space>::member_type;
  static constexpr bool kPrivate = ki::BackendTraits<Space>::is_gpu;
  Kokkos::View<const T*, Space> x, y;
  Kokkos::View<T**, Kokkos::LayoutRight, Space> out;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    if (team.team_rank() != 0) return;
    const ki::ButterflyLoops<L, kPrivate, Member> loops{team, int(x.extent(0))};
    const T total = loops.template sum<T>([&](int k, T& s) { s += x(k); });
    const auto both = loops.template two_sums<T>([&](int k, T& sx, T& sy) {
      sx += x(k);
      sy += y(k);
    });
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, L), [&](int l) {
      out(l, 0) = total;
      out(l, 1) = both.first;
      out(l, 2) = both.second;
    });
  }
};

/// The team's vector length: L lanes where they are threads of their own
/// (a GPU), else 1 (a host plays the lanes in one thread).
constexpr int vector_length(bool lanes_private, int L) { return lanes_private ? L : 1; }

template <int L, class T>
void check_loops(unsigned seed) {
  for (int m : {0, 1, L - 1, L, L + 1, 2 * L, 3 * L + 1}) {
    SCOPED_TRACE("L=" + std::to_string(L) + " m=" + std::to_string(m));
    const auto r = kdnn_test::uniform(std::size_t(m), -1.0, 1.0, seed++);
    for (bool integers : {false, true}) {
      std::vector<T> x(m);
      double exact = 0;
      for (int k = 0; k < m; ++k) {
        x[k] = integers ? T(int(r[k] * 1000)) : T(r[k] * (1 + k % 7));
        exact += double(x[k]);
      }
      std::vector<T> y(m);
      for (int k = 0; k < m; ++k) y[k] = T(-3) * x[(k + 1) % m];
      const auto xd = kdnn_test::to_device<T*>(std::vector<double>(x.begin(), x.end()), m);
      const auto yd = kdnn_test::to_device<T*>(std::vector<double>(y.begin(), y.end()), m);
      Kokkos::View<T**, Kokkos::LayoutRight, Space> out("out", L, 3);
      LoopsSum<T, L> kernel{xd, yd, out};
      const int vector = vector_length(LoopsSum<T, L>::kPrivate, L);
      // Two team threads where the backend allows (Serial has one).
      const int threads = std::min(
          2,
          Kokkos::TeamPolicy<Space>(1, 1, vector).team_size_max(kernel, Kokkos::ParallelForTag()));
      Kokkos::parallel_for(Kokkos::TeamPolicy<Space>(1, threads, vector), kernel);
      const auto got = kdnn_test::to_host(out);
      const T want = loops_reference(x, L), want_y = loops_reference(y, L);
      for (int l = 0; l < vector; ++l) {  // bitwise
        EXPECT_EQ(T(got[3 * l]), want) << "sum, lane " << l;
        EXPECT_EQ(T(got[3 * l + 1]), want) << "two_sums' first, lane " << l;
        EXPECT_EQ(T(got[3 * l + 2]), want_y) << "two_sums' second, lane " << l;
        if (integers) {
          EXPECT_EQ(double(got[3 * l]), exact) << "lane " << l;
          EXPECT_EQ(double(got[3 * l + 2]), -3 * exact) << "lane " << l;
        }
      }
    }
  }
}

TYPED_TEST(LaneButterfly, LoopsSumEachLanesEntriesThenTheLanesOneSumOrTwo) {
  using T = TypeParam;
  check_loops<1, T>(10);
  check_loops<2, T>(20);
  check_loops<4, T>(30);
  check_loops<8, T>(40);
  check_loops<16, T>(50);
  check_loops<32, T>(60);
}

}  // namespace
