// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// check_finite, the one check behind every operator's opts.check_finite:
// kdnn's policy on non-finite data (docs/api.md) is PyTorch's, a NaN or an
// infinity in an input gives NaN (or ±inf) in the outputs that depend on it,
// unless the caller asks for it to be refused.
#include <Kokkos_Core.hpp>

#include "kdnn/core/error.hpp"
#include "kdnn/core/float16.hpp"
#include "kdnn/core/impl/first_element.hpp"

namespace kdnn::impl {

/// Throws kdnn::Error at the first element of `v` (row-major) that is NaN or
/// ±inf, e.g. "ssm::ssd_forward: x[0, 3, 1, 2]=nan, expected finite values
/// (check_finite)". An empty View (not given) passes. One reduction on
/// `space` (a wait for the host); takes the lock of its type.
template <class ExecSpace, class View>
void check_finite(const char* op, const ExecSpace& space, const char* name, const View& v) {
  using C = compute_t<typename View::non_const_value_type>;
  const auto found = first_element_where(
      space, v, KOKKOS_LAMBDA(const C& x) { return !(x - x == C(0)); });
  if (found) {
    fail(op, ": ", element_name(name, found->first, found->second),
         ", expected finite values (check_finite)");
  }
}

}  // namespace kdnn::impl
