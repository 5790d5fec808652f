// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The SSD forward's output kernel, GPU form (ssd_gpu_chunks.hpp): Y_diag
// and Y_off at a chunk's steps, the results SsdOutputData describes
// (ssd_chunk_output_kernel.hpp).
//
// A team owns BR steps i0 … of one chunk and keeps Cᵀ of its steps
// [N, BR] in scratch and its RM × PC blocks of y in registers:
//  * Y_off: the entering state H_c, streamed in tiles of BK rows n [BK, P]:
//    y += C·Hᵀ over the tile's n, then y ·= e_i;
//  * Y_diag: the chunk's steps j ≤ i0 + BR − 1 in tiles of BK: Bᵀ [N, BK],
//    each thread's RM × RN micro-tile of C·Bᵀ times the decays m_ij (0
//    above the diagonal and past the chunk) to Wᵀ [BK, BR], then the tile's
//    X̃ = dt·x [BK, P] and y += W·X̃. Given `scores` (C·Bᵀ of the head's
//    group, computed once for its heads: ssd_chunk_scores_gpu_kernel.hpp),
//    a thread reads its micro-tile of C·Bᵀ from there instead, the same
//    values, and Bᵀ is not loaded (nor Cᵀ without Y_off).
#include "kdnn/ssm/impl/ssd_chunk_scores_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_gpu_chunks.hpp"
#include "kdnn/ssm/impl/ssd_output_data.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T, int P, int N>
struct SsdChunkOutputGpuKernel
    : SsdGpuChunks<SsdChunkOutputGpuKernel<ExecSpace, T, P, N>, ExecSpace, T, P, N> {
  using Base = SsdGpuChunks<SsdChunkOutputGpuKernel, ExecSpace, T, P, N>;
  using Chunk = typename Base::Chunk;
  using Base::BK;
  using Base::BR;
  using Base::CG;
  using Base::LDK;
  using Base::LDR;
  using Base::NT;
  using Base::PC;
  using Base::RM;
  using typename Base::Member;
  SsdOutputData<ExecSpace, T> out;
  /// C·Bᵀ per chunk and group (SsdChunkScoresGpuKernel), or empty: computed
  /// here.
  ChunkScores<const T, ExecSpace> scores;

  struct Work {
    double* cum;  ///< [pad(Q)]
    int* seg;     ///< [pad(Q)]
    T* ct;        ///< Cᵀ [N, LDR]
    T* tile;      ///< Bᵀ [N, LDK], or an X̃ or H tile [BK, P]
    T* wt;        ///< Wᵀ [BK, LDR]
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s, int Q) {
    Work w;
    w.cum = s.take<double>(Base::Shape::pad(Q));
    w.seg = s.take<int>(Base::Shape::pad(Q));
    w.ct = s.take<T>(N * LDR);
    w.tile = s.take<T>(N * LDK > BK * P ? N * LDK : BK * P);
    w.wt = s.take<T>(BK * LDR);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    int block = 0;
    const Chunk k = this->chunk_of(item, block);
    const int i0 = block * BR;
    const int rows = k.n - i0 < BR ? k.n - i0 : BR;
    if (rows <= 0) return;  // past a short last chunk: the whole team
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver, this->Q);
    const int span = Base::Shape::pad(i0 + rows);  // the steps j ≤ i the block sees
    this->scan_decays(team, k, span, w.cum, w.seg);
    const bool given_scores = scores.extent(0) > 0;
    if (out.off || !given_scores) {
      Base::template load_steps_transposed<BR, LDR>(team, this->Cm, k, i0, rows, w.ct);
    }
    kdnn::impl::ThreadRegisters<T, NT, RM * PC, Base::kPrivate> acc;
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int e = 0; e < RM * PC; ++e) acc(t)[e] = T(0);
    });

    if (out.off) {  // y = e_i·C_i·H_cᵀ, H_c's rows n in tiles of BK
      const T* h = &out.states(k.b, k.h, k.c, 0);
      for (int n0 = 0; n0 < N; n0 += BK) {
        team.team_barrier();  // Cᵀ is complete, the previous tile done with
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * P),
                             [&](int e) { w.tile[e] = h[n0 * P + e]; });
        team.team_barrier();
        Base::threads(team, [&](int t) {
          Base::add_product(w.ct + n0 * LDR + (t / CG) * RM, LDR, w.tile, t % CG, acc(t));
        });
      }
      Base::threads(team, [&](int t) {
        const int r0 = (t / CG) * RM;
        KDNN_IMPL_UNROLL
        for (int i = 0; i < RM; ++i) {
          const T e = Base::entering(w.cum, w.seg, i0 + r0 + i);
          KDNN_IMPL_UNROLL
          for (int j = 0; j < PC; ++j) acc(t)[i * PC + j] *= e;
        }
      });
    }

    if (out.diag) {  // y += (C·Bᵀ ∘ m)·X̃ over the steps j ≤ i
      for (int j0 = 0; j0 < i0 + rows; j0 += BK) {
        const int cols = k.n - j0 < BK ? k.n - j0 : BK;
        team.team_barrier();  // Cᵀ and cum are complete, the previous tile done with
        if (given_scores) {
          const T* cb = &scores(this->scores_row(k.b, k.c, k.g), 0);
          Base::threads(team, [&](int t) {
            Base::template stored_weights<false, false>(t, cb, scores_ld<T>(this->Q), w.cum, w.seg,
                                                        i0, j0, k.n, w.wt);
          });
        } else {
          Base::template load_steps_transposed<BK, LDK>(team, this->Bm, k, j0, cols, w.tile);
          team.team_barrier();
          Base::threads(team, [&](int t) {
            Base::template decay_weights<N, false>(t, w.ct, w.tile, w.cum, w.seg, i0, j0, k.n,
                                                   w.wt);
          });
        }
        team.team_barrier();  // every thread is done reading Bᵀ
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * P), [&](int e) {
          const int s = e / P, p = e % P;
          T v = T(0);
          if (s < cols) {
            const int t = k.t0 + j0 + s;
            v = this->dt(k.b, t, k.h) * this->x(k.b, t, k.h, p);
          }
          w.tile[s * P + p] = v;
        });
        team.team_barrier();
        Base::threads(team, [&](int t) {
          Base::add_product(w.wt + (t / CG) * RM, LDR, w.tile, t % CG, acc(t));
        });
      }
    }

    const SkipRow<T> skip = out.skip.row(k.h, P);
    Base::threads(team, [&](int t) {
      const int r0 = (t / CG) * RM, c = t % CG;
      KDNN_IMPL_UNROLL
      for (int i = 0; i < RM; ++i) {
        if (r0 + i >= rows) continue;
        const int step = k.t0 + i0 + r0 + i;
        T* yt = &out.y(k.b, step, k.h, 0);
        const T* xr = &this->x(k.b, step, k.h, 0);
        KDNN_IMPL_UNROLL
        for (int j = 0; j < PC; ++j) {
          const int p = c + CG * j;
          const T v = acc(t)[i * PC + j];
          yt[p] = out.diag ? v + skip.at(p) * xr[p] : yt[p] + v;
        }
      }
    });
  }
};

}  // namespace kdnn::ssm::impl
