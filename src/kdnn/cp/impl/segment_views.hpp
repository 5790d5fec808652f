// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The views of one segment of a rank's local steps (cp/sequence_layout.hpp:
// its segments one after another): a [B, L_r, ·] tensor's rows of the
// segment, a block of K−1 rows of the halo, and the segment's sequence ids.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <type_traits>
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

/// Steps [b, e) of v's dimension 1, the other dimensions whole.
template <class View>
auto sequence_steps(const View& v, std::int64_t b, std::int64_t e) {
  const auto steps = std::make_pair(std::size_t(b), std::size_t(e));
  constexpr unsigned rank = unsigned(View::rank);
  static_assert(rank >= 2 && rank <= 4, "a [B, S, ...] View of rank 2, 3 or 4");
  if constexpr (rank == 2) {
    return Kokkos::subview(v, Kokkos::ALL, steps);
  } else if constexpr (rank == 3) {
    return Kokkos::subview(v, Kokkos::ALL, steps, Kokkos::ALL);
  } else {
    return Kokkos::subview(v, Kokkos::ALL, steps, Kokkos::ALL, Kokkos::ALL);
  }
}

/// Rows [range) of a [B, ·, C] View, as a LayoutStride View (empty stays empty).
template <class View>
auto rows_of(const View& v, std::pair<int, int> range) {
  using Strided =
      Kokkos::View<typename View::data_type, Kokkos::LayoutStride, typename View::memory_space>;
  if (!validate::given(v)) return Strided();
  return Strided(sequence_steps(v, range.first, range.second));
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
  Kokkos::deep_copy(space, copy, sequence_steps(seq_idx, range.first, range.second));
  return copy;
}

/// Rows [range) of a LayoutRight View [B, L, ...] (rank 2 to 4) as a View
/// of the same type: the View's own memory when the range is all of it or
/// B = 1 (an unmanaged View into it), else a new View, filled with the rows
/// when `copy_in` (an input), or not (an output, for put_rows). Empty stays
/// empty.
template <class View, class ExecSpace>
View right_rows(const ExecSpace& space, const View& v, std::pair<int, int> range, bool copy_in) {
  static_assert(std::is_same_v<typename View::array_layout, Kokkos::LayoutRight>);
  const int n = range.second - range.first;
  if (!validate::given(v) || (range.first == 0 && std::size_t(n) == v.extent(1))) return v;
  const std::size_t e2 = View::rank > 2 ? v.extent(2) : 0, e3 = View::rank > 3 ? v.extent(3) : 0;
  // A View of type V with v's extents but n rows, over `first` (a pointer
  // into v, or the allocation's properties).
  const auto shaped = [&](auto type, const auto& first) {
    using V = typename decltype(type)::type;
    if constexpr (View::rank == 2) return V(first, v.extent(0), n);
    if constexpr (View::rank == 3) return V(first, v.extent(0), n, e2);
    if constexpr (View::rank == 4) return V(first, v.extent(0), n, e2, e3);
  };
  if (v.extent(0) == 1) {
    return shaped(std::common_type<View>(), v.data() + std::size_t(range.first) * v.stride(1));
  }
  using Owned = Kokkos::View<typename View::non_const_data_type, Kokkos::LayoutRight,
                             typename View::memory_space>;
  Owned rows = shaped(
      std::common_type<Owned>(),
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kdnn::cp::segment_rows")));
  if (copy_in) Kokkos::deep_copy(space, rows, sequence_steps(v, range.first, range.second));
  return rows;
}

/// Rows [range) of `dst` = `rows`, unless right_rows gave dst's own memory.
template <class ExecSpace, class Dst, class Rows>
void put_rows(const ExecSpace& space, const Dst& dst, std::pair<int, int> range, const Rows& rows) {
  if (!validate::given(dst) || rows.data() == dst.data() + std::size_t(range.first) * dst.stride(1))
    return;
  Kokkos::deep_copy(space, sequence_steps(dst, range.first, range.second), rows);
}

}  // namespace kdnn::cp::impl
