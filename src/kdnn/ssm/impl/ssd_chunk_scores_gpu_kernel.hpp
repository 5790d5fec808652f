// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// CB = C·Bᵀ of every chunk, once per group, GPU form (ssd_gpu_chunks.hpp):
// the scores the forward's output kernel weighs by each head's decays. The
// heads of a group share B and C, so with H/G heads per group the output
// kernel would otherwise compute the same product H/G times (N multiply-adds
// per pair of steps, as many as its product with X̃ at N = P).
//
// A team owns BR rows (steps i) of one chunk's CB for one (b, g): Cᵀ of its
// steps [N, LDR] in scratch, then the chunk's steps j ≤ i0 + BR − 1 in
// tiles of BK, Bᵀ [N, LDK], each thread writing its RM × RN micro-tile
// (SsdGpuChunks::micro_product, the product the output kernel computes
// itself when it runs alone: the same operands, the same order, the same
// bits). CB is stored [B·chunks·G, pad(Q)·pad(Q)], row-major per chunk,
// steps past the chunk 0; tiles above the diagonal are not written.
#include "kdnn/ssm/impl/ssd_gpu_chunks.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T, int P, int N>
struct SsdChunkScoresGpuKernel
    : SsdGpuChunks<SsdChunkScoresGpuKernel<ExecSpace, T, P, N>, ExecSpace, T, P, N> {
  using Base = SsdGpuChunks<SsdChunkScoresGpuKernel, ExecSpace, T, P, N>;
  using Base::BK;
  using Base::BR;
  using Base::LDK;
  using Base::LDR;
  using Base::RM;
  using Base::RN;
  using typename Base::Member;
  ChunkScores<T, ExecSpace> scores;

  /// Row blocks per chunk of Q steps.
  static int row_blocks(int Q) { return (Q + BR - 1) / BR; }
  /// One team per (b, chunk, g, row block), where SsdGpuChunks has one per
  /// head.
  long long teams() const {
    return (long long)this->x.extent(0) * this->chunks * this->Bm.extent(2) * this->blocks;
  }

  struct Work {
    T *ct, *bt;  ///< Cᵀ [N, LDR], Bᵀ [N, LDK]
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s, int) {
    Work w;
    w.ct = s.take<T>(N * LDR);
    w.bt = s.take<T>(N * LDK);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    const auto k = this->group_chunk(item / this->blocks);
    const int i0 = item % this->blocks * BR;
    const int rows = k.n - i0 < BR ? k.n - i0 : BR;
    if (rows <= 0) return;  // past a short last chunk: the whole team
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver, this->Q);
    Base::template load_steps_transposed<BR, LDR>(team, this->Cm, k, i0, rows, w.ct);
    T* out = &scores(this->scores_row(k.b, k.c, k.g), 0);
    const int ldo = scores_ld<T>(this->Q);
    for (int j0 = 0; j0 < i0 + rows; j0 += BK) {
      const int cols = k.n - j0 < BK ? k.n - j0 : BK;
      team.team_barrier();  // Cᵀ is complete, the previous tile done with
      Base::template load_steps_transposed<BK, LDK>(team, this->Bm, k, j0, cols, w.bt);
      team.team_barrier();
      Base::threads(team, [&](int t) {
        T uv[RM * RN];
        Base::template micro_product<N>(t, w.ct, w.bt, uv);
        const int r0 = Base::micro_row(t), c0 = Base::micro_col(t);
        KDNN_IMPL_UNROLL
        for (int i = 0; i < RM; ++i) {
          KDNN_IMPL_UNROLL
          for (int j = 0; j < RN; ++j) out[(i0 + r0 + i) * ldo + j0 + c0 + j] = uv[i * RN + j];
        }
      });
    }
  }
};

}  // namespace kdnn::ssm::impl
