// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The chunk sums of outer products (ssd_chunk_sums.hpp: S_c, or dS_c with
// `gradient`), FMA GPU form (ssd_gpu_chunks.hpp).
//
// A team owns BR rows n of one chunk's result. It scans the chunk's
// log-decays and takes each step's factor (dend_j·dt_j, or e_j: one exp per
// step) into scratch, then walks the chunk's steps in tiles of BK: per tile
// a B (or C) tile [BK, BR] (steps × the team's n) and the scaled rows of x
// (or dy) [BK, P] in scratch, and each thread adds its RM × PC block of
// their product to its registers.
#include "kdnn/ssm/impl/ssd_chunk_sums.hpp"
#include "kdnn/ssm/impl/ssd_gpu_chunks.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T, int P, int N>
struct SsdChunkStateGpuKernel
    : SsdGpuChunks<SsdChunkStateGpuKernel<ExecSpace, T, P, N>, ExecSpace, T, P, N>,
      SsdChunkSums<ExecSpace, T> {
  using Base = SsdGpuChunks<SsdChunkStateGpuKernel, ExecSpace, T, P, N>;
  using Chunk = typename Base::Chunk;
  using Base::BK;
  using Base::BR;
  using Base::CG;
  using Base::LDR;
  using Base::NT;
  using Base::PC;
  using Base::RM;
  using typename Base::Member;
  using Sums = SsdChunkSums<ExecSpace, T>;
  using Sums::decay;
  using Sums::dy;
  using Sums::gradient;
  using Sums::states;

  static constexpr int kBlocks = N / BR;  ///< row blocks per chunk

  struct Work {
    double* cum;  ///< [pad(Q)]
    int* seg;     ///< [pad(Q)]
    T* scale;     ///< [pad(Q)]: step i's factor on its row of x or dy
    T *bt, *xs;   ///< B or C tile [BK, LDR], scaled x or dy tile [BK, P]
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s, int Q) {
    Work w;
    w.cum = s.take<double>(Base::Shape::pad(Q));
    w.seg = s.take<int>(Base::Shape::pad(Q));
    w.scale = s.take<T>(Base::Shape::pad(Q));
    w.bt = s.take<T>(BK * LDR);
    w.xs = s.take<T>(BK * P);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    int block = 0;
    const Chunk k = this->chunk_of(item, block);
    const int n0 = block * BR;
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver, this->Q);
    kdnn::impl::ThreadRegisters<T, NT, RM * PC, Base::kPrivate> acc;
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int e = 0; e < RM * PC; ++e) acc(t)[e] = T(0);
    });
    const T whole = this->step_factors(team, *this, k, w.cum, w.seg, w.scale);
    const auto& bc = gradient ? this->Cm : this->Bm;
    const auto& rows = gradient ? dy : this->x;
    for (int j0 = 0; j0 < k.n; j0 += BK) {
      const int cols = k.n - j0 < BK ? k.n - j0 : BK;
      if (j0 > 0) team.team_barrier();  // the previous tile is done with
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * BR), [&](int e) {
        const int s = e / BR, r = e % BR;
        w.bt[s * LDR + r] = s < cols ? bc(k.b, k.t0 + j0 + s, k.g, n0 + r) : T(0);
      });
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * P), [&](int e) {
        const int s = e / P, p = e % P;
        T v = T(0);
        if (s < cols) v = w.scale[j0 + s] * rows(k.b, k.t0 + j0 + s, k.h, p);
        w.xs[s * P + p] = v;
      });
      team.team_barrier();
      Base::threads(
          team, [&](int t) { Base::add_product(w.bt + (t / CG) * RM, LDR, w.xs, t % CG, acc(t)); });
    }
    Base::threads(team, [&](int t) {
      const int r0 = (t / CG) * RM, c = t % CG;
      KDNN_IMPL_UNROLL
      for (int i = 0; i < RM; ++i) {
        T* out = &states(k.b, k.h, k.c, (n0 + r0 + i) * P);
        KDNN_IMPL_UNROLL
        for (int j = 0; j < PC; ++j) out[c + CG * j] = acc(t)[i * PC + j];
      }
    });
    if (block == 0 && !gradient) {
      Kokkos::single(Kokkos::PerTeam(team), [&]() { decay(k.b, k.h, k.c) = whole; });
    }
  }
};

}  // namespace kdnn::ssm::impl
