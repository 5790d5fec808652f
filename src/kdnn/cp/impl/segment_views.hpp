// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The views of one segment of a rank's local steps (cp/sequence_layout.hpp:
// its segments one after another): a [B, L_r, ·] tensor's rows of the
// segment, a block of K−1 rows of the halo, and the segment's sequence ids.
#include <Kokkos_Core.hpp>
#include <utility>
#include <vector>

#include "kdnn/core/tensor.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/cp/sequence_layout.hpp"

namespace kdnn::cp::impl {

/// Local steps [first, first + steps) of a rank: one of its segments.
struct LocalRows {
  int first, steps;
  std::pair<int, int> range() const { return {first, first + steps}; }
};

/// The local rows of each of `segments`, in their order.
inline std::vector<LocalRows> local_rows(const std::vector<Segment>& segments) {
  std::vector<LocalRows> rows;
  int at = 0;
  for (const Segment& s : segments) {
    rows.push_back({at, int(s.steps())});
    at += int(s.steps());
  }
  return rows;
}

/// Rows [range) of a [B, ·, C] View, as a LayoutStride View (empty stays empty).
template <class View>
auto rows_of(const View& v, std::pair<int, int> range) {
  using Strided =
      Kokkos::View<typename View::data_type, Kokkos::LayoutStride, typename View::memory_space>;
  if (!validate::given(v)) return Strided();
  return Strided(Kokkos::subview(v, Kokkos::ALL, range, Kokkos::ALL));
}

/// Columns [range) of seq_idx [B, L] (empty stays empty): the View itself
/// when they are all of it, else a copy (Matrix is LayoutRight).
template <class ExecSpace>
Matrix<const int, ExecSpace> ids_of(const ExecSpace& space,
                                    const Matrix<const int, ExecSpace>& seq_idx,
                                    std::pair<int, int> range) {
  const bool all = range.first == 0 && std::size_t(range.second) == seq_idx.extent(1);
  if (!validate::given(seq_idx) || all) return seq_idx;
  Matrix<int, ExecSpace> copy(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kdnn::cp::seq_ids"),
                              seq_idx.extent(0), std::size_t(range.second - range.first));
  Kokkos::deep_copy(space, copy, Kokkos::subview(seq_idx, Kokkos::ALL, range));
  return copy;
}

}  // namespace kdnn::cp::impl
