// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Fills a View of rank 1 to 4 and any layout with one value, element by
// element through its strides (Kokkos 3.4's deep_copy of a value does not
// take a LayoutStride View of rank 3 or 4).
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/impl/row_major_index.hpp"

namespace kdnn::impl {

/// The fill's kernel: element x of the row-major order gets `value`. A
/// functor, not a lambda: nvcc refuses a device lambda whose first use of a
/// captured variable is inside `if constexpr`.
template <class View>
struct FillStrided {
  static constexpr int R = int(View::rank);
  View view;
  typename View::non_const_value_type value;
  RowMajorIndex<R> at;

  KOKKOS_INLINE_FUNCTION void operator()(std::size_t x) const {
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
  }
};

/// view(i...) = value for every element, asynchronously on `space`; memory
/// between the elements is not touched.
template <class ExecSpace, class View>
void fill_strided(const ExecSpace& space, const View& view,
                  const typename View::non_const_value_type& value) {
  static_assert(int(View::rank) >= 1 && int(View::rank) <= 4,
                "fill_strided: a View of rank 1 to 4");
  if (view.size() == 0) return;
  Kokkos::parallel_for("kdnn::fill_strided", Kokkos::RangePolicy<ExecSpace>(space, 0, view.size()),
                       FillStrided<View>{view, value, RowMajorIndex<int(View::rank)>(view)});
}

}  // namespace kdnn::impl
