// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Fills a View of rank 1 to 4 and any layout with one value, element by
// element through its strides (Kokkos 3.4's deep_copy of a value does not
// take a LayoutStride View of rank 3 or 4).
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/impl/row_major_index.hpp"

namespace kdnn::impl {

/// view(i...) = value for every element, asynchronously on `space`; memory
/// between the elements is not touched.
template <class ExecSpace, class View>
void fill_strided(const ExecSpace& space, const View& view,
                  const typename View::non_const_value_type& value) {
  constexpr int R = int(View::rank);
  static_assert(R >= 1 && R <= 4, "fill_strided: a View of rank 1 to 4");
  if (view.size() == 0) return;
  const RowMajorIndex<R> at(view);
  Kokkos::parallel_for(
      "kdnn::fill_strided", Kokkos::RangePolicy<ExecSpace>(space, 0, view.size()),
      KOKKOS_LAMBDA(std::size_t x) {
        const auto i = at(x);
        if constexpr (R == 1) {
          view(i[0]) = value;
        } else if constexpr (R == 2) {
          view(i[0], i[1]) = value;
        } else if constexpr (R == 3) {
          view(i[0], i[1], i[2]) = value;
        } else {
          view(i[0], i[1], i[2], i[3]) = value;
        }
      });
}

}  // namespace kdnn::impl
