// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Reductions over the quads of a tensor-core accumulator: in the m16n8 and
// m8n8 fragments (warp_mma_fragments.hpp) a row's values are spread over
// the four lanes 4g … 4g + 3 of the warp, so a row's maximum or sum over
// them is a reduction over each quad. On a GPU, two xor shuffles; on a host
// (one thread playing the team, registers side by side) the same two steps
// on the lanes' registers. Either way every lane of a quad ends with
// op(op(x₀, x₁), op(x₂, x₃)), bitwise the same value on every backend.
#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/unroll.hpp"

namespace kdnn::impl {

/// For every thread t of a team of NT (whole warps) and r < Count:
/// x(t)[x0 + r] = op over the quad of t of those registers (above).
template <int Count, class Member, class T, int NT, int M, bool Private, class Op>
KOKKOS_INLINE_FUNCTION void team_quad_reduce(const Member& team,
                                             ThreadRegisters<T, NT, M, Private>& x, int x0,
                                             const Op& op) {
  static_assert(NT % 32 == 0, "team_quad_reduce: a team of whole warps");
  if constexpr (Private) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, NT), [&](int t) {
      KDNN_IMPL_UNROLL
      for (int r = 0; r < Count; ++r) {
        T v = x(t)[x0 + r];
#if defined(__CUDA_ARCH__)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, 1));
        v = op(v, __shfl_xor_sync(0xffffffffu, v, 2));
#else
        Kokkos::abort("kdnn: team_quad_reduce with private registers needs a CUDA device");
#endif
        x(t)[x0 + r] = v;
      }
    });
  } else {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, NT / 4), [&](int quad) {
      KDNN_IMPL_UNROLL
      for (int r = 0; r < Count; ++r) {
        T* q[4] = {x(4 * quad) + x0 + r, x(4 * quad + 1) + x0 + r, x(4 * quad + 2) + x0 + r,
                   x(4 * quad + 3) + x0 + r};
        const T v = op(op(*q[0], *q[1]), op(*q[2], *q[3]));
        for (T* p : q) *p = v;
      }
    });
  }
}

}  // namespace kdnn::impl
