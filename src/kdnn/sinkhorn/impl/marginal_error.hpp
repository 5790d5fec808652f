// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The marginal error of a Sinkhorn iterate from its row and column sums, by
// one team thread's vector lanes.
#include "kdnn/core/compat.hpp"
#include "kdnn/core/nan_max.hpp"

namespace kdnn::sinkhorn::impl {

/// max(max_i |rows_i − 1|, max_j |cols_j − 1|) over n sums each; NaN if any
/// sum is NaN.
template <class Member, class C>
KOKKOS_INLINE_FUNCTION double marginal_error(const Member& team, int n, const C* rows,
                                             const C* cols) {
  return lane_nan_max(team, 2 * n, [&](int k) {
    return compat::fabs(double(k < n ? rows[k] : cols[k - n]) - 1.0);
  });
}

}  // namespace kdnn::sinkhorn::impl
