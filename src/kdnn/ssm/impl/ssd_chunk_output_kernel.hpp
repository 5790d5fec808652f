// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The SSD forward's output kernel: Y_diag and Y_off at a chunk's steps
// (notation: ssd_chunks.hpp).
#include "kdnn/ssm/impl/ssd_chunks.hpp"
#include "kdnn/ssm/impl/ssd_output_data.hpp"

namespace kdnn::ssm::impl {

/// The output kernel, host form.
template <class ExecSpace, class T>
struct SsdChunkOutputKernel : SsdChunks<ExecSpace, T> {
  using Chunk = typename SsdChunks<ExecSpace, T>::Chunk;
  using Base = SsdChunks<ExecSpace, T>;
  using typename Base::Member;
  SsdOutputData<ExecSpace, T> out;

  struct Work {
    typename Base::Decays d;
    T *c, *y, *bt, *xt, *w, *ht;
  };
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int Qp, int Pp, int Np,
                                           bool diag, bool off) {
    Work w;
    w.d = Base::carve_decays(s, Qp);
    w.c = s.take<T>(std::size_t(Qp) * Np);
    w.y = s.take<T>(std::size_t(Qp) * Pp);
    w.bt = diag ? s.take<T>(std::size_t(Np) * Qp) : nullptr;
    w.xt = diag ? s.take<T>(std::size_t(Qp) * Pp) : nullptr;  // X̃ (row-major)
    w.w = diag ? s.take<T>(std::size_t(Qp) * Qp) : nullptr;
    w.ht = off ? s.take<T>(std::size_t(Np) * Pp) : nullptr;
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    this->for_each_chunk(team, [&](const Chunk& k, kdnn::impl::ScratchCarver& scratch) {
      one_chunk(team, k, carve(scratch, this->Qp, this->Pp, this->Np, out.diag, out.off));
    });
  }

  /// Chunk k, in the team's scratch w.
  KOKKOS_INLINE_FUNCTION void one_chunk(const Member& team, const Chunk& k, const Work& w) const {
    const int Qp = this->Qp, Pp = this->Pp, Np = this->Np;
    const bool diag = out.diag, off = out.off;
    this->load_decays(team, k, w.d);
    this->load_bc(team, k, this->Cm, w.c);
    if (diag) {
      this->load_b_t(team, k, w.bt);
      this->load_x(team, k, w.d.dtv, w.xt);
    }
    if (off) this->load_state(team, k, out.states, k.c, false, w.ht);
    team.team_barrier();
    if (off) Base::gemm(team, Qp, Pp, Np, Base::GemmA::rows(w.c, Np), w.ht, Pp, w.y, Pp, false);
    if (diag) {
      Base::gemm(team, Qp, Qp, Np, Base::GemmA::rows(w.c, Np), w.bt, Qp, w.w, Qp, false,
                 kdnn::impl::GemmShape::lower_out);
    }
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, Qp), [&](int i) {
      if (off) {
        T* yr = w.y + i * Pp;
        const T ei = w.d.e[i];
        Base::vec(team, Pp, [&](int p) { yr[p] *= ei; });
      }
      if (diag) {
        T* wr = w.w + i * Qp;
        Base::vec(team, Qp, [&](int j) {
          wr[j] = Base::masked(i, j, k.n, wr[j] * Base::decay_mask(w.d.cum, w.d.seg, i, j, k.n));
        });
      }
    });
    team.team_barrier();
    if (diag) {
      Base::gemm(team, Qp, Pp, Qp, Base::GemmA::rows(w.w, Qp), w.xt, Pp, w.y, Pp, off,
                 kdnn::impl::GemmShape::a_lower);
    }
    team.team_barrier();
    const int P = this->P();
    const SkipRow<T> skip = out.skip.row(k.h, P);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, k.n), [&](int i) {
      T* yt = &out.y(k.b, k.t0 + i, k.h, 0);
      const T* yr = w.y + i * Pp;
      if (diag) {
        const T* xr = &this->x(k.b, k.t0 + i, k.h, 0);
        Base::vec(team, P, [&](int p) { yt[p] = yr[p] + skip.at(p) * xr[p]; });
      } else {
        Base::vec(team, P, [&](int p) { yt[p] += yr[p]; });
      }
    });
  }
};

}  // namespace kdnn::ssm::impl
