// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The first element of a View (row-major order, any rank up to 4, any
// strides) for which a predicate holds, found by one device reduction: the
// value checks (check_finite, check_dt) name the first bad element, its
// indices and its value, the same on every backend and thread mapping.
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include "kdnn/core/error.hpp"
#include "kdnn/core/float16.hpp"
#include "kdnn/core/impl/row_major_index.hpp"
#include "kdnn/core/impl/space_lock.hpp"

namespace kdnn::impl {

/// v(i[0], …, i[R−1]).
template <class View, std::size_t R>
KOKKOS_INLINE_FUNCTION typename View::reference_type element_at(
    const View& v, const Kokkos::Array<std::size_t, R>& i) {
  static_assert(int(View::rank) == int(R) && R >= 1 && R <= 4, "element_at: rank 1 to 4");
  if constexpr (R == 1) {
    return v(i[0]);
  } else if constexpr (R == 2) {
    return v(i[0], i[1]);
  } else if constexpr (R == 3) {
    return v(i[0], i[1], i[2]);
  } else {
    return v(i[0], i[1], i[2], i[3]);
  }
}

/// Where `bad(value)` first holds in `v`, with that value (as double); empty
/// when nowhere. `bad` sees each value in its compute type (to_compute: a
/// 16-bit storage type as float). Takes the lock of `space`'s type while it runs (fenced).
template <class ExecSpace, class View, class Bad>
std::optional<std::pair<Kokkos::Array<std::size_t, std::size_t(View::rank)>, double>>
first_element_where(const ExecSpace& space, const View& v, const Bad& bad) {
  constexpr int R = int(View::rank);
  const std::size_t n = v.size();
  if (n == 0) return std::nullopt;
  const RowMajorIndex<R> at(v);
  const SpaceLock exclusive(space);
  std::size_t first = n;
  Kokkos::parallel_reduce(
      "kdnn::first_element_where", Kokkos::RangePolicy<ExecSpace>(space, 0, n),
      KOKKOS_LAMBDA(std::size_t x, std::size_t & lowest) {
        if (x < lowest && bad(to_compute(element_at(v, at(x))))) lowest = x;
      },
      Kokkos::Min<std::size_t>(first));
  if (first >= n) return std::nullopt;  // none (Min's identity is the largest size_t)
  const auto index = at(first);
  Kokkos::View<double, typename ExecSpace::memory_space> value("kdnn::first_element_value");
  Kokkos::parallel_for(
      "kdnn::first_element_value", Kokkos::RangePolicy<ExecSpace>(space, 0, 1),
      KOKKOS_LAMBDA(int) { value() = double(to_compute(element_at(v, index))); });
  double host = 0;
  Kokkos::deep_copy(space, host, value);
  space.fence();
  return std::make_pair(index, host);
}

/// "name[i, j, …]=value" of an element found by first_element_where.
template <std::size_t R>
std::string element_name(const char* name, const Kokkos::Array<std::size_t, R>& index,
                         double value) {
  std::string s = std::string(name) + "[";
  for (std::size_t r = 0; r < R; ++r) s += (r ? ", " : "") + std::to_string(index[r]);
  return concat(s, "]=", value);
}

}  // namespace kdnn::impl
