// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// A team loop over a tile of `outer` × `inner` (o, i) pairs in which every
// inner index i belongs to one lane and sees its pairs in order of o, so
// that f may accumulate per i (a row maximum, a row sum) without atomics,
// and the sums have the same order on every backend. On a host it is the
// plain loop nest with i innermost (contiguous, vectorised when f is
// simple) when the team is one thread; otherwise (a GPU, or a host team of
// several threads) the team's threads and lanes split i.
#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/host_simd.hpp"

namespace kdnn::impl {

template <class ExecSpace, class Member, class F>
KDNN_IMPL_HOST_FLATTEN KOKKOS_INLINE_FUNCTION void team_sweep(const Member& team, int outer,
                                                              int inner, const F& f) {
  if constexpr (BackendTraits<ExecSpace>::is_host) {
    if (team.team_size() == 1) {
      for (int o = 0; o < outer; ++o) {
        // Calls for different i are independent (the GPU form runs them on
        // different lanes), whatever the compiler can prove about f's
        // pointers: let it vectorise.
        KDNN_IMPL_INDEPENDENT_ITERATIONS
        for (int i = 0; i < inner; ++i) f(o, i);
      }
      return;
    }
  }
  Kokkos::parallel_for(Kokkos::TeamVectorRange(team, inner), [&](int i) {
    for (int o = 0; o < outer; ++o) f(o, i);
  });
}

}  // namespace kdnn::impl
