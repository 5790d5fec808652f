// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// CB = C·Bᵀ of every chunk, once per group, on tensor cores
// (KernelForm::tensor_cores, team_mma.hpp): the scores
// SsdChunkScoresGpuKernel computes with FMAs, stored the same way (row
// stride scores_ld, rows past the chunk and tiles above the diagonal not
// written), for the output kernel and the backward's dX̃ to read.
//
// A team of four warps owns BR = 4·Mma::M rows (steps i) of one chunk's CB
// for one (b, g): 64 in float, 32 in double. Each warp reads the A
// fragments of its Mma::M rows of C where a tile's product asks for them
// (from L1 after the first tile): kept in registers for the whole block
// instead, with 3×TF32's splits, they took 168 registers at N = 64 and all
// 255 at N = 128 in float (ptxas, sm_90, CUDA 13), against 66-72 read. It
// multiplies them by the chunk's steps j ≤ i0 + BR − 1 in tiles of BK = 32, B [BK, N + 4] in
// scratch: the row stride N + 4 puts the 32 lanes' B fragment reads (8
// rows × 4 k) on distinct banks. Precision P for float: 3×TF32 (float32
// accuracy, the default) or one TF32 pass (Launch::allow_tf32); double
// runs FP64 tensor cores. The products sum over k in another order than
// the FMA form, so the two agree to rounding.
#include "kdnn/core/impl/register_team.hpp"
#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/team_mma.hpp"
#include "kdnn/ssm/impl/ssd_chunk_scores_gpu_kernel.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T, int N, kdnn::impl::MmaPrecision Precision>
struct SsdChunkScoresMmaKernel
    : SsdChunks<ExecSpace, T>,
      kdnn::impl::RegisterTeam<SsdChunkScoresMmaKernel<ExecSpace, T, N, Precision>, ExecSpace,
                               128> {
  using Mma = kdnn::impl::MmaOf<T>;
  using Team = kdnn::impl::RegisterTeam<SsdChunkScoresMmaKernel, ExecSpace, 128>;
  using Team::kPrivate;
  using Team::threads;
  using typename Team::Member;
  static constexpr int NT = 128;
  static constexpr int BR = NT / 32 * Mma::M;  ///< rows per team: one m-tile per warp
  static constexpr int BK = 32;                ///< steps per streamed tile
  static constexpr int NK = BK / 8;            ///< 8-step accumulator tiles per tile
  static constexpr int CR = Mma::c_regs;
  static constexpr int LDB = N + 4;  ///< row stride of the B tile
  static_assert(N % Mma::K == 0, "SsdChunkScoresMmaKernel: whole k-steps");
  static_assert(sizeof(T) == 4 || Precision == kdnn::impl::MmaPrecision::full,
                "SsdChunkScoresMmaKernel: a single TF32 pass is a float precision");

  ChunkScores<T, ExecSpace> scores;
  int blocks = 1;  ///< row blocks per chunk

  /// Row blocks per chunk of Q steps.
  static int row_blocks(int Q) { return (Q + BR - 1) / BR; }
  /// One team per (b, g, chunk, row block).
  long long teams() const {
    return (long long)this->x.extent(0) * this->Bm.extent(2) * this->chunks * blocks;
  }

  static KOKKOS_INLINE_FUNCTION T* carve(kdnn::impl::ScratchCarver& s, int) {
    return s.take<T>(BK * LDB);
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    const auto k = this->group_chunk(item / blocks);
    const int i0 = item % blocks * BR;
    const int rows = k.n - i0 < BR ? k.n - i0 : BR;
    if (rows <= 0) return;  // past a short last chunk: the whole team
    kdnn::impl::ScratchCarver carver(scratch);
    T* const tile = carve(carver, this->Q);
    T* const out = &scores(this->scores_row(k.b, k.c, k.g), 0);
    const int ld = scores_ld<T>(this->Q);

    // Thread t's A register e: C(i0 + row, col) of its fragment, 0 past the
    // block's rows.
    const auto c_fragment = [&](int t, int e) {
      const kdnn::impl::FragmentIndex f = kdnn::impl::mma_a_place<Mma, 1, N>(t, e);
      return f.row < rows ? this->Cm(k.b, k.t0 + i0 + f.row, k.g, f.col) : T(0);
    };
    kdnn::impl::ThreadRegisters<T, NT, NK * CR, kPrivate> acc;
    for (int j0 = 0; j0 < i0 + rows; j0 += BK) {
      const int cols = k.n - j0 < BK ? k.n - j0 : BK;
      team.team_barrier();  // the previous tile is done with
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * N), [&](int e) {
        const int s = e / N, m = e % N;
        tile[s * LDB + m] = s < cols ? this->Bm(k.b, k.t0 + j0 + s, k.g, m) : T(0);
      });
      team.team_barrier();
      kdnn::impl::mma_rows_by_tile<Mma, Precision, NT, kPrivate, 1, NK, N>(team, c_fragment, tile,
                                                                           LDB, acc);
      threads(team, [&](int t) {
        KDNN_IMPL_UNROLL
        for (int nk = 0; nk < NK; ++nk) {
          KDNN_IMPL_UNROLL
          for (int r = 0; r < CR; ++r) {
            const kdnn::impl::FragmentIndex c = Mma::c(t % 32, r);
            const int i = i0 + t / 32 * Mma::M + c.row, j = j0 + nk * 8 + c.col;
            if (i < k.n && j < ld) out[i * ld + j] = acc(t)[nk * CR + r];
          }
        }
      });
    }
  }
};

}  // namespace kdnn::ssm::impl
