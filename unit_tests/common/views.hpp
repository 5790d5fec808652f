// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Host <-> device copies for tests, any rank: data is built and checked on
// the host as flat row-major std::vector<double>, operators run on Views of
// the tests' execution space (Space below). Views of the 16-bit storage
// types convert as the library does (core/float16.hpp): a double is rounded
// to float, then to nearest even.
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include "kdnn/core/float16.hpp"
#include "random.hpp"  // the fills tests build data with

namespace kdnn_test {

/// The execution space the tests run on: Kokkos' default, or (in a GPU
/// build's kdnn_unit_tests_host) the host space the library also compiles.
#if defined(KDNN_TEST_HOST_SPACE)
using Space = Kokkos::DefaultHostExecutionSpace;
#else
using Space = Kokkos::DefaultExecutionSpace;
#endif

/// A LayoutRight View of `DataType` (e.g. float***) on the default space.
template <class DataType>
using DeviceView = Kokkos::View<DataType, Kokkos::LayoutRight, Space::memory_space>;

/// `x` stored as T (float, double or a 16-bit storage type).
template <class T>
T stored_as(double x) {
  return kdnn::from_compute<T>(kdnn::compute_t<T>(x));
}

/// A stored value as double (exact).
template <class T>
double as_double(T x) {
  return double(kdnn::to_compute(x));
}

/// A LayoutRight View in MemorySpace with the given extents holding
/// `values` (row-major), converted to its value type.
template <class DataType, class MemorySpace, class... Extents>
Kokkos::View<DataType, Kokkos::LayoutRight, MemorySpace> to_view(const std::vector<double>& values,
                                                                 Extents... extents) {
  using View = Kokkos::View<DataType, Kokkos::LayoutRight, MemorySpace>;
  View view("kdnn_test::to_view", std::size_t(extents)...);
  if (values.size() != view.size()) {
    throw std::invalid_argument("to_view: " + std::to_string(values.size()) +
                                " values for a view of " + std::to_string(view.size()));
  }
  auto host = Kokkos::create_mirror_view(view);
  for (std::size_t k = 0; k < values.size(); ++k) {
    host.data()[k] = stored_as<typename View::non_const_value_type>(values[k]);
  }
  Kokkos::deep_copy(view, host);
  return view;
}

/// The same on the default space.
template <class DataType, class... Extents>
DeviceView<DataType> to_device(const std::vector<double>& values, Extents... extents) {
  return to_view<DataType, Space::memory_space>(values, extents...);
}

/// The elements of a contiguous View (any rank, any memory space), row-major,
/// as double.
template <class View>
std::vector<double> to_host(const View& view) {
  static_assert(
      std::is_same_v<typename View::array_layout, Kokkos::LayoutRight> || unsigned(View::rank) <= 1,
      "to_host: a LayoutRight (or rank-1) View");
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  std::vector<double> out(host.size());
  for (std::size_t k = 0; k < out.size(); ++k) out[k] = as_double(host.data()[k]);
  return out;
}

}  // namespace kdnn_test
