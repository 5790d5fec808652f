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

/// Per-chunk scores C·Bᵀ of each group: [B·chunks·G, pad(Q)²].
template <class T, class ExecSpace>
using ChunkScores = Kokkos::View<T**, Kokkos::LayoutRight, typename ExecSpace::memory_space>;

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

  /// Row stride of a chunk's scores.
  KOKKOS_INLINE_FUNCTION int ld() const { return Base::Shape::pad(this->Q); }
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
    const int G = int(this->Bm.extent(2)), L = int(this->x.extent(1));
    const int block = item % this->blocks, rest = item / this->blocks;
    const int c = rest % this->chunks, b = rest / this->chunks / G, g = rest / this->chunks % G;
    const int t0 = c * this->Q, n = L - t0 < this->Q ? L - t0 : this->Q;
    const int i0 = block * BR;
    const int rows = n - i0 < BR ? n - i0 : BR;
    if (rows <= 0) return;  // past a short last chunk: the whole team
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver, this->Q);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BR * N), [&](int e) {
      const int r = e / N, m = e % N;
      w.ct[m * LDR + r] = r < rows ? this->Cm(b, t0 + i0 + r, g, m) : T(0);
    });
    T* out = &scores(this->scores_row(b, c, g), 0);
    const int ldo = ld();
    for (int j0 = 0; j0 < i0 + rows; j0 += BK) {
      const int cols = n - j0 < BK ? n - j0 : BK;
      team.team_barrier();  // Cᵀ is complete, the previous tile done with
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * N), [&](int e) {
        const int s = e / N, m = e % N;
        w.bt[m * LDK + s] = s < cols ? this->Bm(b, t0 + j0 + s, g, m) : T(0);
      });
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
