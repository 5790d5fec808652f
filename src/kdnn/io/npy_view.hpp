// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// A .npy array in memory (read_npy, allocate_npy) seen as a Kokkos View of
// any rank without a copy: LayoutRight over the array's own host buffer, so
// an operator can read its inputs and compute its outputs in place.
#include <Kokkos_Core.hpp>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kdnn/core/error.hpp"
#include "kdnn/io/npy.hpp"

namespace kdnn::io {

/// An unmanaged host View in C order, e.g. HostView<const float***>.
template <class DataType>
using HostView = Kokkos::View<DataType, Kokkos::LayoutRight, Kokkos::HostSpace,
                              Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

namespace impl {

template <class View, class Pointer, std::size_t... I>
View wrap(Pointer data, const std::vector<std::size_t>& shape, std::index_sequence<I...>) {
  return View(data, shape[I]...);
}

template <class View, class Array>
View view_of(Array& array, const std::string& name) {
  using T = typename View::non_const_value_type;
  constexpr auto rank = static_cast<std::size_t>(View::rank);
  if (array.dtype != dtype_of<T>()) {
    fail(name, " has dtype ", dtype_name(array.dtype), ", expected ", dtype_name(dtype_of<T>()));
  }
  if (array.shape.size() != rank) {
    fail(name, " has shape ", format_shape(array.shape), ", expected a ", rank, "-d array");
  }
  return wrap<View>(array.template data<T>(), array.shape, std::make_index_sequence<rank>());
}

}  // namespace impl

/// The elements of `array` as a View of DataType (e.g. `float***`), no copy.
/// Throws kdnn::Error naming `name` when the dtype or the rank differ.
template <class DataType>
HostView<DataType> view_of(NpyArray& array, const std::string& name) {
  return impl::view_of<HostView<DataType>>(array, name);
}

/// Read-only: DataType must have const elements (e.g. `const double**`).
template <class DataType>
HostView<DataType> view_of(const NpyArray& array, const std::string& name) {
  static_assert(std::is_const<typename HostView<DataType>::value_type>::value,
                "a const NpyArray is viewed with const elements");
  return impl::view_of<HostView<DataType>>(array, name);
}

}  // namespace kdnn::io
