// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Element-by-element walks of strided Views: RowMajorIndex
// (core/impl/row_major_index.hpp) gives each flat number its indices, last
// index fastest, past 2^32 elements too; fill_strided
// (core/impl/strided_fill.hpp) writes every element of a strided View and
// nothing between them.
#include <gtest/gtest.h>

#include <array>
#include <cstddef>

#include "kdnn/core/impl/row_major_index.hpp"
#include "kdnn/core/impl/strided_fill.hpp"
#include "views.hpp"

namespace {

namespace ki = kdnn::impl;
using kdnn_test::Space;

template <class DataType>
using Unmanaged = Kokkos::View<DataType, Kokkos::LayoutRight, Kokkos::HostSpace,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

TEST(RowMajorIndex, CountsThroughEveryElementInOrder) {
  // Extents of 1 among them: a bound of 1 must give index 0 and carry.
  const Unmanaged<float****> v(nullptr, 2, 3, 1, 5);
  const ki::RowMajorIndex<4> at(v);
  std::size_t x = 0;
  for (std::size_t a = 0; a < 2; ++a)
    for (std::size_t b = 0; b < 3; ++b)
      for (std::size_t d = 0; d < 5; ++d, ++x) {
        const auto i = at(x);
        EXPECT_EQ(i[0], a);
        EXPECT_EQ(i[1], b);
        EXPECT_EQ(i[2], 0u);
        EXPECT_EQ(i[3], d) << "x=" << x;
      }
  const Unmanaged<double*> line(nullptr, 7);
  EXPECT_EQ(ki::RowMajorIndex<1>(line)(6)[0], 6u);
}

TEST(RowMajorIndex, HoldsPastTwoToTheThirtyTwoElements) {
  // 3·2^20·2^10·5 ≈ 1.6·10^10 elements: 64-bit arithmetic throughout.
  const std::size_t n1 = std::size_t(1) << 20, n2 = std::size_t(1) << 10;
  const Unmanaged<float****> v(nullptr, 3, n1, n2, 5);
  const ki::RowMajorIndex<4> at(v);
  const auto last = at(v.size() - 1);
  EXPECT_EQ(last[0], 2u);
  EXPECT_EQ(last[1], n1 - 1);
  EXPECT_EQ(last[2], n2 - 1);
  EXPECT_EQ(last[3], 4u);
  const auto i = at((std::size_t(1) << 32) + 7);  // = ((0·n1 + 838860)·n2 + 820)·5 + 3
  EXPECT_EQ(i[0], 0u);
  EXPECT_EQ(i[1], 838860u);
  EXPECT_EQ(i[2], 820u);
  EXPECT_EQ(i[3], 3u);
}

TEST(FillRank4, WritesEveryElementOfAStridedViewAndNothingBetween) {
  using Full = Kokkos::View<double****, Kokkos::LayoutRight, Space::memory_space>;
  const Full full("full", 2, 4, 3, 6);
  Kokkos::deep_copy(full, -1.0);
  const std::pair<int, int> heads(1, 3), cols(2, 5);
  const auto part = Kokkos::subview(full, Kokkos::ALL, heads, Kokkos::ALL, cols);
  static_assert(std::is_same_v<typename decltype(part)::array_layout, Kokkos::LayoutStride>);
  ki::fill_strided(Space(), part, 7.0);
  Space().fence();
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), full);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 4; ++h)
      for (int i = 0; i < 3; ++i)
        for (int d = 0; d < 6; ++d) {
          const bool inside =
              h >= heads.first && h < heads.second && d >= cols.first && d < cols.second;
          EXPECT_EQ(host(b, h, i, d), inside ? 7.0 : -1.0) << b << h << i << d;
        }
  // An empty View: nothing to do, and no launch over a zero range.
  const auto none =
      Kokkos::subview(full, Kokkos::ALL, std::pair<int, int>(0, 0), Kokkos::ALL, Kokkos::ALL);
  ki::fill_strided(Space(), none, 3.0);
}

}  // namespace
