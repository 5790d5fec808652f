// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The SSD forward's first kernel: each chunk's state from a zero state
// (notation: ssd_chunks.hpp).
#include "kdnn/ssm/impl/ssd_chunks.hpp"

namespace kdnn::ssm::impl {

/// S_c (the chunk's state from a zero state, stored [N, P]) into
/// states(b, h, c) and exp(cum_last) into decay(b, h, c).
template <class ExecSpace, class T>
struct SsdChunkStateKernel : SsdChunks<ExecSpace, T> {
  using Chunk = typename SsdChunks<ExecSpace, T>::Chunk;
  using Base = SsdChunks<ExecSpace, T>;
  using typename Base::Member;
  ChunkStates<T, ExecSpace> states;  ///< [B, H, ≥chunks, N·P]
  Kokkos::View<T***, Kokkos::LayoutRight, typename ExecSpace::memory_space>
      decay;  ///< [B, H, chunks]

  struct Work {
    typename Base::Decays d;
    T *bt, *xs, *s;
  };
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int Qp, int Pp, int Np) {
    Work w;
    w.d = Base::carve_decays(s, Qp);
    w.bt = s.take<T>(std::size_t(Np) * Qp);
    w.xs = s.take<T>(std::size_t(Qp) * Pp);
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
    this->load_decays(team, k, w.d);
    team.team_barrier();
    this->load_b_t(team, k, w.bt);
    // Xs_j = dend_j·dt_j·x_j: S = Bᵀ·Xs (S_c above, n-major).
    this->fill(
        team, w.xs, this->Qp, this->Pp, k.n, this->P(), [&](int i) { return this->x_row(k, i); },
        [&](int i) { return w.d.dend[i] * w.d.dtv[i]; });
    team.team_barrier();
    Base::gemm(team, this->Np, this->Pp, this->Qp, Base::GemmA::rows(w.bt, this->Qp), w.xs,
               this->Pp, w.s, this->Pp, false);
    team.team_barrier();
    const int P = this->P();
    T* out = &states(k.b, k.h, k.c, 0);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, this->N()), [&](int j) {
      Base::vec(team, P, [&](int p) { out[j * P + p] = w.s[j * this->Pp + p]; });
    });
    Kokkos::single(Kokkos::PerTeam(team), [&]() { decay(k.b, k.h, k.c) = w.d.e[this->Qp - 1]; });
  }
};

}  // namespace kdnn::ssm::impl
