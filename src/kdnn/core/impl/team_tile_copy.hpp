// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Copies of a tile of rows into team scratch, padded with zeros to the
// whole tiles team_gemm works on. The source is `rows` rows of `n`
// contiguous values, row r starting at row(r) (a pointer into a LayoutRight
// view); the tile has `all` ≥ rows rows.
//   team_copy_rows:       dst[r·ld + d]  (row-major, ld ≥ width ≥ n; the
//                         columns [n, width) and the rows past `rows` zero)
//   team_copy_transposed: dst[d·ld + r]  (ld ≥ all; rows past `rows` zero)
// The row-major copy reads and writes contiguously (a plain vectorised
// copy on a host); the transposed one writes with stride ld, so kernels
// keep it out of their inner loops. Both multiply the values by `factor`
// (1: a plain copy). The caller synchronises the team before dst is read.
#include <Kokkos_Core.hpp>

namespace kdnn::impl {

template <class Member, class T, class RowPtr>
KOKKOS_INLINE_FUNCTION void team_copy_rows(const Member& team, const RowPtr& row, int rows, int all,
                                           int n, int width, T* dst, int ld, T factor = T(1)) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, all), [&](int r) {
    T* out = dst + std::size_t(r) * ld;
    const int live = r < rows ? n : 0;
    if (live > 0) {
      const T* in = row(r);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, live),
                           [&](int d) { out[d] = factor * in[d]; });
    }
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, live, width),
                         [&](int d) { out[d] = T(0); });
  });
}

template <class Member, class T, class RowPtr>
KOKKOS_INLINE_FUNCTION void team_copy_transposed(const Member& team, const RowPtr& row, int rows,
                                                 int all, int n, T* dst, int ld, T factor = T(1)) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, all), [&](int r) {
    if (r < rows) {
      const T* in = row(r);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n),
                           [&](int d) { dst[std::size_t(d) * ld + r] = factor * in[d]; });
    } else {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n),
                           [&](int d) { dst[std::size_t(d) * ld + r] = T(0); });
    }
  });
}

}  // namespace kdnn::impl
