// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Systems side by side in SIMD lanes (core/impl/lanes.hpp): the lane type's
// width, its lane access, and col_dot on lanes giving each lane exactly what
// the same product on plain numbers gives.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "contraction.hpp"
#include "kdnn/core/impl/col_dot.hpp"
#include "kdnn/core/impl/lanes.hpp"

namespace {

using kdnn::impl::Lanes;

TEST(Lanes, WidthIsOneWithoutVectorisation) {
  EXPECT_EQ((Lanes<float, false>::width), 1);
  EXPECT_EQ((Lanes<double, false>::width), 1);
  static_assert(std::is_same_v<Lanes<float, false>::type, float>);
}

TEST(Lanes, HostVectorsHoldSixteenBytes) {
#if KDNN_IMPL_HOST_SIMD
  EXPECT_EQ((Lanes<float, true>::width), 4);
  EXPECT_EQ((Lanes<double, true>::width), 2);
#else
  GTEST_SKIP() << "no host lane vectors with this compiler";
#endif
}

TEST(Lanes, BroadcastAndLaneAccess) {
  using C = Lanes<double, true>::type;
  constexpr int L = Lanes<double, true>::width;
  C v = kdnn::impl::broadcast<C>(2);
  for (int l = 0; l < L; ++l) EXPECT_EQ(kdnn::impl::lane(v, l), 2.0);
  for (int l = 0; l < L; ++l) kdnn::impl::set_lane(v, l, 0.5 + l);
  for (int l = 0; l < L; ++l) EXPECT_EQ(kdnn::impl::lane(v, l), 0.5 + l);
}

/// col_dot's finish: out[j] = s (a functor, callable from host-device code).
template <class V>
struct StoreTo {
  V* out;
  KOKKOS_INLINE_FUNCTION void operator()(int j, V s) const { out[j] = s; }
};

template <class T>
void expect_col_dot_per_lane() {
  using C = typename Lanes<T, true>::type;
  constexpr int L = Lanes<T, true>::width;
  std::mt19937 rng(3);
  std::normal_distribution<T> normal;
  // Column counts around the blocks of 4 (and 8, 16 for plain numbers).
  for (int rows : {1, 2, 5}) {
    for (int cols : {1, 3, 4, 5, 8, 9, 17}) {
      const int ld = cols | 1;
      std::vector<T> A(std::size_t(L) * rows * ld), x(std::size_t(L) * rows);
      for (auto& a : A) a = normal(rng);
      for (auto& value : x) value = normal(rng);
      std::vector<C> Ac(std::size_t(rows) * ld), xc(rows);
      for (int l = 0; l < L; ++l) {
        for (int k = 0; k < rows * ld; ++k) kdnn::impl::set_lane(Ac[k], l, A[l * rows * ld + k]);
        for (int i = 0; i < rows; ++i) kdnn::impl::set_lane(xc[i], l, x[l * rows + i]);
      }
      std::vector<C> lanes_out(cols);
      kdnn::impl::col_dot<Kokkos::DefaultHostExecutionSpace>(
          0, rows, cols, Ac.data(), ld, xc.data(), StoreTo<C>{lanes_out.data()});
      for (int l = 0; l < L; ++l) {
        std::vector<T> plain(cols);
        kdnn::impl::col_dot<Kokkos::DefaultHostExecutionSpace>(
            0, rows, cols, A.data() + l * rows * ld, ld, x.data() + l * rows,
            StoreTo<T>{plain.data()});
        for (int j = 0; j < cols; ++j) {
          const T got = kdnn::impl::lane(lanes_out[j], l);
          if (!kdnn_test::host_contracts()) {  // the same sums in the same order
            EXPECT_EQ(got, plain[j])
                << "rows=" << rows << " cols=" << cols << " lane " << l << " column " << j;
          } else {  // one of the two may be contracted: a rounding per term apart
            T bound = 0;
            for (int i = 0; i < rows; ++i) {
              bound += std::abs(A[l * rows * ld + i * ld + j] * x[l * rows + i]);
            }
            const T unit = std::numeric_limits<T>::epsilon();
            EXPECT_LE(std::abs(got - plain[j]), 2 * rows * unit * bound)
                << "rows=" << rows << " cols=" << cols << " lane " << l << " column " << j;
          }
        }
      }
    }
  }
}

TEST(Lanes, ColDotGivesEachLaneThePlainResult) {
  expect_col_dot_per_lane<float>();
  expect_col_dot_per_lane<double>();
}

}  // namespace
