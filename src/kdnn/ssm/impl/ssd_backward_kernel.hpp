// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The single-rank SSD backward in one kernel per chunk (notation:
// ssd_chunks.hpp): SsdDiagBackwardKernel's and SsdStateBackwardKernel's
// steps on operands loaded once, the Y_diag half kept in scratch instead of
// a round trip through dx, dB, dC and a da_diag buffer in global memory. The
// context-parallel backward runs the two halves as separate kernels (its
// Y_diag half overlaps the state exchange between ranks); both add the same
// terms in the same order (a compiler may still vectorise a reduction in one
// and not in the other: the results agree to rounding).
#include "kdnn/ssm/impl/ssd_diag_backward_kernel.hpp"
#include "kdnn/ssm/impl/ssd_gradients.hpp"
#include "kdnn/ssm/impl/ssd_state_backward_kernel.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T>
struct SsdBackwardKernel : SsdStateBackwardKernel<ExecSpace, T> {
  using Chunk = typename SsdChunks<ExecSpace, T>::Chunk;
  using State = SsdStateBackwardKernel<ExecSpace, T>;
  using Diag = SsdDiagBackwardKernel<ExecSpace, T>;
  using typename State::Member;
  /// The Y_diag half's kernel on the same inputs (its steps are called; it
  /// is never launched from here).
  Diag diag;

  struct Work {
    typename Diag::Work diag;
    typename State::Work state;  ///< decays, C, Bᵀ, X̃ and dY shared with diag
  };
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int Qp, int Pp, int Np) {
    Work w;
    w.diag = Diag::carve(s, Qp, Pp, Np);
    w.state.d = w.diag.d;
    w.state.c = w.diag.c;
    w.state.bt = w.diag.bt;
    w.state.xr = w.diag.xr;
    w.state.dy = w.diag.dy;
    State::carve_own(s, w.state, Qp, Pp, Np);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    this->for_each_chunk(team, [&](const Chunk& k, kdnn::impl::ScratchCarver& scratch) {
      one_chunk(team, k, carve(scratch, this->Qp, this->Pp, this->Np));
    });
  }

  KOKKOS_INLINE_FUNCTION void one_chunk(const Member& team, const Chunk& k, const Work& w) const {
    const int Qp = this->Qp, Pp = this->Pp, Np = this->Np;
    diag.load(team, k, w.diag);
    this->load_states(team, k, w.state);
    team.team_barrier();
    diag.products(team, k, w.diag);
    this->finish(team, k, w.state,
                 DiagInScratch<T>{w.diag.dxr, w.diag.dbt, w.diag.dc, w.diag.da, Qp, Pp, Np});
  }
};

}  // namespace kdnn::ssm::impl
