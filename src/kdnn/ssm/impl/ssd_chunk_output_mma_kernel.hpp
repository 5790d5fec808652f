// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The SSD forward's output kernel on tensor cores (KernelForm::tensor_cores,
// team_mma.hpp): the results SsdOutputData describes, as the FMA GPU form
// (ssd_chunk_output_gpu_kernel.hpp) computes them, with both products on
// tensor cores:
//  * Y_off = e_i·(C·H_c)_i: C's A fragments read where the product asks for
//    them (from L1, as in ssd_chunk_scores_mma_kernel.hpp), the entering
//    state H_c [N, P] streamed in tiles of BK rows n as they lie in memory;
//  * Y_diag = (CB ∘ m)·X̃ over the steps j ≤ i: the group's scores CB
//    (ssd_chunk_scores_mma_kernel.hpp, required) weighed by the decays m_ij
//    (0 above the diagonal and past the chunk) into W [BR, BK + 4] in
//    scratch, a thread per entry, then W's A fragments times the tile's
//    X̃ = dt·x [BK, P] rows.
//
// A team of four warps owns BR = 4·Mma::M steps i (64 in float, 32 in
// double) and BP = 64 values p of one chunk's y, each warp Mma::M steps by
// the 64 p in NC = 8 accumulator tiles. The scratch row strides put a
// warp's fragment reads on distinct banks (BK + 4 for W; BP + 8 words, or
// BP + 4 doubles, for the tiles of rows). The products sum in another
// order than the FMA form, so the two agree to rounding. Precision as
// SsdChunkScoresMmaKernel.
#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/team_mma.hpp"
#include "kdnn/ssm/impl/ssd_chunk_scores_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_gpu_chunks.hpp"
#include "kdnn/ssm/impl/ssd_output_data.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T, int P, int N, kdnn::impl::MmaPrecision Precision>
struct SsdChunkOutputMmaKernel
    : SsdGpuChunks<SsdChunkOutputMmaKernel<ExecSpace, T, P, N, Precision>, ExecSpace, T, P, N> {
  using Base = SsdGpuChunks<SsdChunkOutputMmaKernel, ExecSpace, T, P, N>;
  using Chunk = typename Base::Chunk;
  using Mma = kdnn::impl::MmaOf<T>;
  using typename Base::Member;
  static constexpr int NT = Base::NT;
  static constexpr int BR = NT / 32 * Mma::M;  ///< steps i per team: one m-tile per warp
  static constexpr int BP = 64;                ///< values p per team
  static constexpr int NC = BP / 8;            ///< 8-column accumulator tiles
  static constexpr int BK = 32;                ///< steps j or rows n per streamed tile
  static constexpr int CR = Mma::c_regs;
  static constexpr int LDW = BK + 4;                        ///< row stride of W
  static constexpr int LDX = BP + (sizeof(T) > 4 ? 4 : 8);  ///< row stride of X̃ and H tiles
  static_assert(P % BP == 0 && N % BK == 0, "SsdChunkOutputMmaKernel: whole blocks");
  static_assert(sizeof(T) == 4 || Precision == kdnn::impl::MmaPrecision::full,
                "SsdChunkOutputMmaKernel: a single TF32 pass is a float precision");
  SsdOutputData<ExecSpace, T> out;
  ChunkScores<const T, ExecSpace> scores;  ///< C·Bᵀ per chunk and group (with out.diag)

  /// Blocks per chunk of Q steps: row blocks times column blocks.
  static int blocks_per_chunk(int Q) { return (Q + BR - 1) / BR * (P / BP); }

  struct Work {
    double* cum;  ///< [pad(Q)]
    int* seg;     ///< [pad(Q)]
    T* wt;        ///< W [BR, LDW]
    T* rows;      ///< an X̃ or H tile [BK, LDX]
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s, int Q) {
    Work w;
    w.cum = s.take<double>(Base::Shape::pad(Q));
    w.seg = s.take<int>(Base::Shape::pad(Q));
    w.wt = s.take<T>(BR * LDW);
    w.rows = s.take<T>(BK * LDX);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    int block = 0;
    const Chunk k = this->chunk_of(item, block);
    const int i0 = block / (P / BP) * BR, p0 = block % (P / BP) * BP;
    const int rows = k.n - i0 < BR ? k.n - i0 : BR;
    if (rows <= 0) return;  // past a short last chunk: the whole team
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver, this->Q);
    this->scan_decays(team, k, Base::Shape::pad(i0 + rows), w.cum, w.seg);
    kdnn::impl::ThreadRegisters<T, NT, NC * CR, Base::kPrivate> acc;
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int e = 0; e < NC * CR; ++e) acc(t)[e] = T(0);
    });
    // Thread t's A register e in a product over a tile of BK: its (step in
    // the block, column in the tile).
    const auto place = [](int t, int e) { return kdnn::impl::mma_a_place<Mma, 1, BK>(t, e); };
    // A tile of BK rows of `source` (row r at source + r·stride, r < count;
    // zeros past it) into w.rows, columns p0 … p0 + BP, row r scaled by
    // factor(r).
    const auto load_rows = [&](const T* source, std::size_t stride, int count, const auto& factor) {
      Base::template load_rows<BK, BP, LDX>(team, source + p0, stride, count, factor, w.rows);
    };

    if (out.off) {  // y = e_i·(C·H_c)_i, H_c's rows n in tiles of BK
      const T* h = &out.states(k.b, k.h, k.c, 0);
      for (int n0 = 0; n0 < N; n0 += BK) {
        team.team_barrier();  // the previous tile is done with
        load_rows(h + std::size_t(n0) * P, P, BK, [](int) { return T(1); });
        team.team_barrier();
        const auto c_fragment = [&](int t, int e) {
          const kdnn::impl::FragmentIndex f = place(t, e);
          return f.row < rows ? this->Cm(k.b, k.t0 + i0 + f.row, k.g, n0 + f.col) : T(0);
        };
        kdnn::impl::mma_add_rows_product<Mma, Precision, NT, Base::kPrivate, 1, NC, BK>(
            team, c_fragment, w.rows, LDX, acc);
      }
      Base::threads(team, [&](int t) {  // e_i, one exp per row a thread holds
        KDNN_IMPL_UNROLL
        for (int r = 0; r < CR; ++r) {
          const int i = t / 32 * Mma::M + Mma::c(t % 32, r).row;
          const T e = i < rows ? Base::entering(w.cum, w.seg, i0 + i) : T(0);
          KDNN_IMPL_UNROLL
          for (int nc = 0; nc < NC; ++nc) acc(t)[nc * CR + r] *= e;
        }
      });
    }

    if (out.diag) {  // y += (CB ∘ m)·X̃ over the steps j ≤ i
      const T* cb = &scores(this->scores_row(k.b, k.c, k.g), 0);
      const int ld = scores_ld<T>(this->Q);
      for (int j0 = 0; j0 < i0 + rows; j0 += BK) {
        const int cols = k.n - j0 < BK ? k.n - j0 : BK;
        team.team_barrier();  // cum is complete, the previous tile done with
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BR * BK), [&](int e) {
          const int r = e / BK, s = e % BK, i = i0 + r, j = j0 + s;
          w.wt[r * LDW + s] =
              j <= i && i < k.n ? cb[i * ld + j] * Base::decay_mask(w.cum, w.seg, i, j, k.n) : T(0);
        });
        const int t0 = k.t0 + j0;
        load_rows(&this->x(k.b, t0, k.h, 0), this->x.stride(1), cols,
                  [&](int r) { return this->dt(k.b, t0 + r, k.h); });
        team.team_barrier();
        const auto w_fragment = [&](int t, int e) {
          const kdnn::impl::FragmentIndex f = place(t, e);
          return w.wt[f.row * LDW + f.col];
        };
        kdnn::impl::mma_add_rows_product<Mma, Precision, NT, Base::kPrivate, 1, NC, BK>(
            team, w_fragment, w.rows, LDX, acc);
      }
    }

    const SkipRow<T> skip = out.skip.row(k.h, P);
    // Loops over a thread's rows, then its columns, here and in the scaling
    // above: written as one loop over its registers each (a `continue` past
    // the block's rows, an exp per register), the two took CUDA 11.8's
    // compiler over 10 minutes for one kernel, against seconds in this form.
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int r = 0; r < CR; ++r) {
        const kdnn::impl::FragmentIndex c = Mma::c(t % 32, r);
        const int i = t / 32 * Mma::M + c.row;
        if (i < rows) {
          const int step = k.t0 + i0 + i;
          T* yr = &out.y(k.b, step, k.h, p0 + c.col);
          const T* xr = &this->x(k.b, step, k.h, p0 + c.col);
          KDNN_IMPL_UNROLL
          for (int nc = 0; nc < NC; ++nc) {
            const T v = acc(t)[nc * CR + r];
            yr[nc * 8] = out.diag ? v + skip.at(p0 + c.col + nc * 8) * xr[nc * 8] : yr[nc * 8] + v;
          }
        }
      }
    });
  }
};

}  // namespace kdnn::ssm::impl
