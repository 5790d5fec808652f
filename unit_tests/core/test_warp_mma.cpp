// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The warp-level tensor-core layer's host side: the fragment maps of the PTX
// ISA place every element of A, B and C exactly once, the emulated product
// of fragments equals the matrix product (bitwise on integer data), and the
// TF32 roundings and the 3×TF32 split keep their error bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <utility>

#include "kdnn/core/impl/warp_mma_emulated.hpp"
#include "random.hpp"

namespace {

namespace ki = kdnn::impl;

/// Every (row, col) of a rows×cols matrix is held by exactly one (lane, r).
template <class Map>
void expect_each_element_once(int rows, int cols, int regs, const Map& map) {
  std::set<std::pair<int, int>> seen;
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < regs; ++r) {
      const ki::FragmentIndex i = map(lane, r);
      ASSERT_TRUE(i.row >= 0 && i.row < rows && i.col >= 0 && i.col < cols)
          << "lane " << lane << " r " << r << " -> (" << i.row << ", " << i.col << ")";
      EXPECT_TRUE(seen.insert({i.row, i.col}).second)
          << "(" << i.row << ", " << i.col << ") held twice";
    }
  }
  EXPECT_EQ(int(seen.size()), rows * cols);
}

template <class Shape>
void expect_maps_are_bijections() {
  expect_each_element_once(Shape::M, Shape::K, Shape::a_regs, Shape::a);
  expect_each_element_once(Shape::K, Shape::N, Shape::b_regs, Shape::b);
  expect_each_element_once(Shape::M, Shape::N, Shape::c_regs, Shape::c);
}

TEST(WarpMmaFragments, EveryElementHasOneLaneAndRegister) {
  expect_maps_are_bijections<ki::MmaTf32M16N8K8>();
  expect_maps_are_bijections<ki::MmaF64M8N8K4>();
}

TEST(WarpMmaFragments, SpotValuesOfThePtxIsaFigures) {
  // Spot values of the PTX ISA's figures: lane 5 is g = 1, t = 1.
  using Tf32 = ki::MmaTf32M16N8K8;
  EXPECT_EQ(Tf32::a(5, 0).row, 1);
  EXPECT_EQ(Tf32::a(5, 1).row, 9);
  EXPECT_EQ(Tf32::a(5, 2).col, 5);
  EXPECT_EQ(Tf32::b(5, 1).row, 5);
  EXPECT_EQ(Tf32::b(5, 1).col, 1);
  EXPECT_EQ(Tf32::c(5, 3).row, 9);
  EXPECT_EQ(Tf32::c(5, 3).col, 3);
  using F64 = ki::MmaF64M8N8K4;
  EXPECT_EQ(F64::c(31, 1).row, 7);
  EXPECT_EQ(F64::c(31, 1).col, 7);
}

/// Row-major position of (row, col) in a matrix with `cols` columns.
std::size_t at(int row, int col, int cols) {
  return std::size_t(row) * std::size_t(cols) + std::size_t(col);
}

/// The emulated d = a·b + c on small integers, scattered into fragments and
/// gathered back through the maps, against the plain product.
template <class Shape>
void expect_product_of_integers(unsigned seed) {
  using T = typename Shape::value_type;
  const auto draw = [&](int n) {
    auto x = kdnn_test::uniform(std::size_t(n), -8.0, 8.0, seed++);
    for (double& e : x) e = std::round(e);
    return x;
  };
  const auto A = draw(Shape::M * Shape::K), B = draw(Shape::K * Shape::N),
             C = draw(Shape::M * Shape::N);
  ki::WarpFragment<T, Shape::a_regs> a;
  ki::WarpFragment<T, Shape::b_regs> b;
  ki::WarpFragment<T, Shape::c_regs> c, d;
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < Shape::a_regs; ++r) {
      const auto i = Shape::a(lane, r);
      a[lane][r] = T(A[at(i.row, i.col, Shape::K)]);
    }
    for (int r = 0; r < Shape::b_regs; ++r) {
      const auto i = Shape::b(lane, r);
      b[lane][r] = T(B[at(i.row, i.col, Shape::N)]);
    }
    for (int r = 0; r < Shape::c_regs; ++r) {
      const auto i = Shape::c(lane, r);
      c[lane][r] = T(C[at(i.row, i.col, Shape::N)]);
    }
  }
  ki::emulated_mma<Shape>(a, b, c, d);
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < Shape::c_regs; ++r) {
      const auto i = Shape::c(lane, r);
      double expected = C[at(i.row, i.col, Shape::N)];
      for (int k = 0; k < Shape::K; ++k) {
        expected += A[at(i.row, k, Shape::K)] * B[at(k, i.col, Shape::N)];
      }
      EXPECT_EQ(d[lane][r], T(expected)) << "lane " << lane << " r " << r;
    }
  }
}

TEST(WarpMmaEmulated, IntegerProductsAreExact) {
  for (unsigned seed = 1; seed < 40; seed += 3) {
    expect_product_of_integers<ki::MmaTf32M16N8K8>(seed);
    expect_product_of_integers<ki::MmaF64M8N8K4>(seed);
  }
}

TEST(WarpMmaEmulated, Tf32OperandsLoseTheLowMantissaBits) {
  // 1 + 2^-10 is a TF32 value; 1 + 2^-11 is not: truncated it is 1, rounded
  // (a tie) it goes away from zero to 1 + 2^-10.
  EXPECT_EQ(ki::tf32_truncated(1.0f + 0x1p-10f), 1.0f + 0x1p-10f);
  EXPECT_EQ(ki::tf32_truncated(1.0f + 0x1p-11f), 1.0f);
  EXPECT_EQ(ki::tf32_rounded(1.0f + 0x1p-11f), 1.0f + 0x1p-10f);
  EXPECT_EQ(ki::tf32_rounded(-(1.0f + 0x1p-11f)), -(1.0f + 0x1p-10f));
  EXPECT_EQ(ki::tf32_rounded(1.0f + 0x1p-12f), 1.0f);
  EXPECT_TRUE(std::isinf(ki::tf32_rounded(INFINITY)));
  EXPECT_TRUE(std::isnan(ki::tf32_rounded(NAN)));
  // A single-pass product of two TF32-read operands keeps about 10 bits.
  using Tf32 = ki::MmaTf32M16N8K8;
  EXPECT_EQ(ki::mma_operand<Tf32>(1.0f + 0x1p-12f), 1.0f);
}

TEST(WarpMmaEmulated, ThreeTf32PartsKeepFloat32Accuracy) {
  const auto x = kdnn_test::normal(4000, 17);
  double worst_split = 0, worst_three = 0, worst_single = 0;
  for (std::size_t i = 0; i + 1 < x.size(); i += 2) {
    const float a = float(x[i]), b = float(x[i + 1]);
    const auto sa = ki::tf32_split(a), sb = ki::tf32_split(b);
    worst_split = std::fmax(worst_split, std::fabs(double(a) - sa.big - sa.small) / std::fabs(a));
    const double exact = double(a) * double(b);
    const double three =
        double(sa.big) * sb.big + double(sa.big) * sb.small + double(sa.small) * sb.big;
    const double single = double(ki::tf32_truncated(a)) * ki::tf32_truncated(b);
    worst_three = std::fmax(worst_three, std::fabs(three - exact) / std::fabs(exact));
    worst_single = std::fmax(worst_single, std::fabs(single - exact) / std::fabs(exact));
  }
  EXPECT_LE(worst_split, 0x1p-22);
  EXPECT_LE(worst_three, 3 * 0x1p-22);
  EXPECT_LE(worst_single, 2 * 0x1p-10);
  EXPECT_GT(worst_single, 0x1p-12);  // the single pass really is coarser
}

}  // namespace
