// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Fills a rank-4 View of any layout with one value, element by element
// through its strides (Kokkos 3.4's deep_copy of a value does not take a
// LayoutStride View of rank 4).
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/impl/row_major_index.hpp"

namespace kdnn::impl {

/// view(b, h, i, d) = value for every element, asynchronously on `space`;
/// memory between the elements is not touched.
template <class ExecSpace, class View>
void fill_rank4(const ExecSpace& space, const View& view,
                const typename View::non_const_value_type& value) {
  static_assert(unsigned(View::rank) == 4, "fill_rank4: a View of rank 4");
  if (view.size() == 0) return;
  const RowMajorIndex<4> at(view);
  Kokkos::parallel_for(
      "kdnn::fill_rank4", Kokkos::RangePolicy<ExecSpace>(space, 0, view.size()),
      KOKKOS_LAMBDA(std::size_t x) {
        const auto i = at(x);
        view(i[0], i[1], i[2], i[3]) = value;
      });
}

}  // namespace kdnn::impl
