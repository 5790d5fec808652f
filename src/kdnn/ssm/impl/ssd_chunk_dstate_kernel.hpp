// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The SSD backward's first kernel: the gradient each chunk sends to the state
// entering it (notation: ssd_chunks.hpp).
#include "kdnn/ssm/impl/ssd_chunks.hpp"

namespace kdnn::ssm::impl {

/// The gradient the chunk's Y_off sends to the state entering it:
/// dS_c = Σ_i e_i·dy_i ⊗ C_i, stored [N, P] into dstates(b, h, c).
template <class ExecSpace, class T>
struct SsdChunkDstateKernel : SsdChunks<ExecSpace, T> {
  using Chunk = typename SsdChunks<ExecSpace, T>::Chunk;
  using Base = SsdChunks<ExecSpace, T>;
  using typename Base::Member;
  Tensor4<const T, ExecSpace> dy;     ///< [B, L, H, P]
  ChunkStates<T, ExecSpace> dstates;  ///< [B, H, chunks, N·P]

  struct Work {
    typename Base::Decays d;
    T *c, *edy, *s;
  };
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int Qp, int Pp, int Np) {
    Work w;
    w.d = Base::carve_decays(s, Qp);
    w.c = s.take<T>(std::size_t(Qp) * Np);
    w.edy = s.take<T>(std::size_t(Qp) * Pp);
    w.s = s.take<T>(std::size_t(Np) * Pp);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    this->for_each_chunk(team, [&](const Chunk& k, kdnn::impl::ScratchCarver& scratch) {
      one_chunk(team, k, carve(scratch, this->Qp, this->Pp, this->Np));
    });
  }

  /// Chunk k, in the team's scratch w.
  KOKKOS_INLINE_FUNCTION void one_chunk(const Member& team, const Chunk& k, const Work& w) const {
    const int Qp = this->Qp, Pp = this->Pp, Np = this->Np;
    this->load_decays(team, k, w.d);
    this->load_bc(team, k, this->Cm, w.c);
    team.team_barrier();
    this->fill(
        team, w.edy, Qp, Pp, k.n, this->P(), [&](int i) { return &dy(k.b, k.t0 + i, k.h, 0); },
        [&](int i) { return w.d.e[i]; });
    team.team_barrier();
    // dSᵀ... stored n-major: dS[n, p] = Σ_i C[i, n]·edy[i, p] = (Cᵀ·edy)[n, p].
    Base::gemm(team, Np, Pp, Qp, Base::GemmA::k_major(w.c, Np), w.edy, Pp, w.s, Pp, false);
    team.team_barrier();
    const int P = this->P();
    T* out = &dstates(k.b, k.h, k.c, 0);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, this->N()), [&](int j) {
      Base::vec(team, P, [&](int p) { out[j * P + p] = w.s[j * Pp + p]; });
    });
  }
};

}  // namespace kdnn::ssm::impl
