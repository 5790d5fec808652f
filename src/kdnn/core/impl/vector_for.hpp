// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The vector loop of one team thread over [0, n): Kokkos' ThreadVectorRange
// on a GPU (one index per lane); on a host a plain loop marked as having
// independent iterations. Kokkos' host ThreadVectorRange gives GCC no such
// hint, so a loop that stores through one pointer and loads through another
// stays scalar there. Callers keep f free of loops and of branches that
// depend on i, so that the host loop vectorises.
#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/host_simd.hpp"

namespace kdnn::impl {

template <class ExecSpace, class Member, class F>
KOKKOS_FORCEINLINE_FUNCTION void vector_for(const Member& team, int n, const F& f) {
  if constexpr (BackendTraits<ExecSpace>::is_host) {
    (void)team;
    KDNN_IMPL_INDEPENDENT_ITERATIONS
    for (int i = 0; i < n; ++i) f(i);
  } else {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, n), f);
  }
}

}  // namespace kdnn::impl
