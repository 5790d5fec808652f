// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// One thread's N×N matrix between memory and registers
// (core/impl/matrix_copy.hpp): every element lands where it belongs, by the
// 16-byte pieces (a contiguous matrix on a 16-byte boundary) and value by
// value (any other start or row stride), and a store writes nothing outside
// the matrix.
#include <gtest/gtest.h>

#include <vector>

#include "kdnn/core/impl/matrix_copy.hpp"
#include "views.hpp"

namespace {

namespace ki = kdnn::impl;
using kdnn_test::Space;

template <class T>
class MatrixCopy : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(MatrixCopy, Types);

/// Thread b: load_matrix of matrix b of `buffer` (at off + b·N·ld) into
/// registers, written out value by value to `loaded`; and `source`'s
/// matrix b, read value by value, stored by store_matrix into `stored` at
/// the same place.
template <class T, int N>
struct CopyKernel {
  Kokkos::View<const T*, Space> buffer;
  Kokkos::View<T***, Kokkos::LayoutRight, Space> loaded;
  Kokkos::View<const T***, Kokkos::LayoutRight, Space> source;
  Kokkos::View<T*, Space> stored;
  int off, ld;

  KOKKOS_INLINE_FUNCTION void operator()(int b) const {
    T m[N][N];
    ki::load_matrix<N>(buffer.data() + off + b * N * ld, ld, m);
    for (int i = 0; i < N; ++i) {
      for (int j = 0; j < N; ++j) loaded(b, i, j) = m[i][j];
    }
    for (int i = 0; i < N; ++i) {
      for (int j = 0; j < N; ++j) m[i][j] = source(b, i, j);
    }
    ki::store_matrix<N>(m, stored.data() + off + b * N * ld, ld);
  }
};

template <class T, int N>
void check(int off, int ld) {
  SCOPED_TRACE("N=" + std::to_string(N) + " off=" + std::to_string(off) +
               " ld=" + std::to_string(ld));
  const int batch = 5, size = off + batch * N * ld + 3;
  std::vector<double> buffer(size), source(std::size_t(batch) * N * N), sentinel(size, -7.0);
  for (int k = 0; k < size; ++k) buffer[k] = 1000 + k;
  for (std::size_t k = 0; k < source.size(); ++k) source[k] = double(k);
  const auto buffer_d = kdnn_test::to_device<T*>(buffer, size);
  const auto source_d = kdnn_test::to_device<T***>(source, batch, N, N);
  const auto stored_d = kdnn_test::to_device<T*>(sentinel, size);
  Kokkos::View<T***, Kokkos::LayoutRight, Space> loaded_d("loaded", batch, N, N);
  Kokkos::parallel_for(Kokkos::RangePolicy<Space>(0, batch),
                       CopyKernel<T, N>{buffer_d, loaded_d, source_d, stored_d, off, ld});
  const auto loaded = kdnn_test::to_host(loaded_d);
  const auto stored = kdnn_test::to_host(stored_d);
  std::vector<double> want_stored = sentinel;
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < N; ++i) {
      for (int j = 0; j < N; ++j) {
        const int at = off + b * N * ld + i * ld + j;
        const std::size_t reg = (std::size_t(b) * N + i) * N + j;
        EXPECT_EQ(loaded[reg], buffer[at]) << "b=" << b << " i=" << i << " j=" << j;
        want_stored[at] = source[reg];
      }
    }
  }
  EXPECT_EQ(stored, want_stored);  // the matrices in place, the rest untouched
}

template <class T, int N>
void check_layouts() {
  for (int off : {0, 1, 2, 4}) {  // a View's data is aligned: off = 0 starts on 16 bytes
    check<T, N>(off, N);
    check<T, N>(off, N + 1);
  }
}

TYPED_TEST(MatrixCopy, EveryValueInPlaceAndNothingElse) {
  using T = TypeParam;
  check_layouts<T, 1>();
  check_layouts<T, 2>();
  check_layouts<T, 3>();
  check_layouts<T, 4>();
}

TEST(MatrixCopy, PiecesOnlyForAContiguousAlignedMultipleOf16Bytes) {
  alignas(16) float f[64] = {};
  alignas(16) double d[64] = {};
  EXPECT_TRUE(ki::moves_in_pieces<4>(f, 4));
  EXPECT_TRUE(ki::moves_in_pieces<2>(f, 2));
  EXPECT_FALSE(ki::moves_in_pieces<4>(f + 1, 4));  // 4 bytes past a boundary
  EXPECT_FALSE(ki::moves_in_pieces<4>(f, 5));      // rows apart
  EXPECT_FALSE(ki::moves_in_pieces<3>(f, 3));      // 36 bytes
  EXPECT_FALSE(ki::moves_in_pieces<1>(f, 1));      // 4 bytes
  EXPECT_TRUE(ki::moves_in_pieces<4>(f + 4, 4));
  EXPECT_TRUE(ki::moves_in_pieces<2>(d, 2));
  EXPECT_FALSE(ki::moves_in_pieces<3>(d + 2, 3));  // 72 bytes
  EXPECT_FALSE(ki::moves_in_pieces<2>(d + 1, 2));
  EXPECT_TRUE(ki::moves_in_pieces<4>(d + 2, 4));
}

}  // namespace
