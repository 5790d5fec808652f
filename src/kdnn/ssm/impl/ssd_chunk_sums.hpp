// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The operands of the chunk sums of outer products, which both of their GPU
// forms take (the FMA form, ssd_chunk_state_gpu_kernel.hpp, and the
// tensor-core form, ssd_chunk_state_mma_kernel.hpp):
//  * each chunk's state from a zero state, S_c[n, p] = Σ_j B_j[n]·dend_j·
//    dt_j·x_j[p] (the forward's first kernel), and its total decay;
//  * with `gradient`, the gradient its Y_off sends to the state entering it,
//    dS_c[n, p] = Σ_j C_j[n]·e_j·dy_j[p] (the backward's chunk dstates);
// and the per-step factors both forms scale x (or dy) by: one exp per step.
#include <Kokkos_Core.hpp>

#include "kdnn/core/compat.hpp"
#include "kdnn/ssm/impl/ssd_chunks.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T>
struct SsdChunkSums {
  ChunkStates<T, ExecSpace> states;  ///< [B, H, ≥chunks, N·P]: S_c, or dS_c
  Kokkos::View<T***, Kokkos::LayoutRight, typename ExecSpace::memory_space>
      decay;                       ///< [B, H, chunks] (not with `gradient`)
  Tensor4<const T, ExecSpace> dy;  ///< [B, L, H, P] (with `gradient`)
  bool gradient = false;           ///< dS_c instead of S_c

  /// The chunk's cumulative log-decays and sequence starts into cum and seg
  /// (kernel.scan_decays over its steps padded to the GPU forms' tiles) and
  /// each step's factor on its row of x or dy into scale, one exp per step:
  /// dend_i·dt_i (as the host form rounds it), or e_i. All are ready on
  /// return; returns the chunk's whole decay (0 across a sequence start).
  template <class Kernel, class Member, class Chunk>
  KOKKOS_INLINE_FUNCTION T step_factors(const Member& team, const Kernel& kernel, const Chunk& k,
                                        double* cum, int* seg, T* scale) const {
    using Base = typename Kernel::Base;
    const int span = Kernel::Shape::pad(k.n);
    kernel.scan_decays(team, k, span, cum, seg);
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, k.n), [&](int i) {
      scale[i] = gradient ? Base::entering(cum, seg, i)
                          : Base::leaving(cum, seg, i, span - 1) * kernel.dt(k.b, k.t0 + i, k.h);
    });
    team.team_barrier();
    return Base::entering(cum, seg, span - 1);
  }
};

}  // namespace kdnn::ssm::impl
