// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The indices of a flat, row-major element number: for the kernels that walk
// a strided View one element per iteration (on a GPU consecutive threads
// then touch consecutive elements of a row, which is coalesced).
#include <Kokkos_Core.hpp>
#include <cstddef>

namespace kdnn::impl {

/// x = ((i0·n1 + i1)·n2 + i2)·… → (i0, i1, …, i_{R−1}), the last index
/// varying fastest, over the extents of a View of rank R.
template <int R>
class RowMajorIndex {
 public:
  template <class View>
  explicit RowMajorIndex(const View& v) {
    static_assert(int(View::rank) == R, "RowMajorIndex: a View of rank R");
    for (int r = 0; r < R; ++r) extent_[r] = v.extent(r);
  }

  KOKKOS_INLINE_FUNCTION Kokkos::Array<std::size_t, R> operator()(std::size_t x) const {
    Kokkos::Array<std::size_t, R> i;
    for (int r = R - 1; r > 0; --r) {
      i[r] = x % extent_[r];
      x /= extent_[r];
    }
    i[0] = x;
    return i;
  }

 private:
  std::size_t extent_[R] = {};  // extent_[0] bounds nothing: i0 is what is left
};

}  // namespace kdnn::impl
