// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The products of a chunk's steps with each other on tensor cores
// (KernelForm::tensor_cores, team_mma.hpp), for the chunk kernels to weigh
// by the decays (SsdScores):
//  * CB = C·Bᵀ once per group: the scores SsdChunkScoresGpuKernel computes
//    with FMAs, stored the same way, for the output kernel and the
//    backward's dX̃;
//  * V = dY·X̃ᵀ once per head (X̃ = dt·x): the backward's, which its dB
//    (Vᵀ) and dC (V) kernels share (ssd_gradient_mma_kernel.hpp).
// Both are stored as ChunkScores: row stride scores_ld, rows past the chunk
// and tiles above the diagonal not written.
//
// A team of four warps owns BR = 4·Mma::M rows (steps i) of one chunk's
// product for one (b, g) or (b, h): 64 in float, 32 in double. Each warp
// reads the A fragments of its Mma::M rows (of C or dY) where a tile's
// product asks for them (from L1 after the first tile): kept in registers
// for the whole block instead, with 3×TF32's splits, they took 168
// registers at N = 64 and all 255 at N = 128 in float (ptxas, sm_90,
// CUDA 13), against 66-72 read. It multiplies them by the chunk's steps
// j ≤ i0 + BR − 1 in tiles of BK = 32 (of B, or of X̃), [BK, K + 4] in
// scratch: the row stride K + 4 puts the 32 lanes' fragment reads (8 rows
// × 4 k) on distinct banks. Precision for float: 3×TF32 (float32 accuracy,
// the default) or one TF32 pass (Launch::allow_tf32); double runs FP64
// tensor cores. The products sum over k in another order than the FMA
// form, so the two agree to rounding.
#include "kdnn/core/impl/register_team.hpp"
#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/team_mma.hpp"
#include "kdnn/ssm/impl/ssd_chunk_scores_gpu_kernel.hpp"

namespace kdnn::ssm::impl {

/// Which product of a chunk's steps an SsdChunkScoresMmaKernel stores.
enum class SsdScores {
  cb,    ///< C·Bᵀ per (b, chunk, g): ChunkScores row SsdChunks::scores_row
  dy_xt  ///< dY·X̃ᵀ per (b, chunk, h): row SsdChunks::head_scores_row
};

/// K: the size of the rows multiplied (N for cb, P for dy_xt).
template <class ExecSpace, class T, int K, SsdScores Which, kdnn::impl::MmaPrecision Precision>
struct SsdChunkScoresMmaKernel
    : SsdChunks<ExecSpace, T>,
      kdnn::impl::RegisterTeam<SsdChunkScoresMmaKernel<ExecSpace, T, K, Which, Precision>,
                               ExecSpace, 128> {
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
  static constexpr int LDB = K + 4;  ///< row stride of the tile of steps j
  static constexpr bool kGroups = Which == SsdScores::cb;
  static_assert(K % Mma::K == 0, "SsdChunkScoresMmaKernel: whole k-steps");
  static_assert(sizeof(T) == 4 || Precision == kdnn::impl::MmaPrecision::full,
                "SsdChunkScoresMmaKernel: a single TF32 pass is a float precision");

  ChunkScores<T, ExecSpace> scores;
  Tensor4<const T, ExecSpace> dy;  ///< [B, L, H, P] (dy_xt)
  int blocks = 1;                  ///< row blocks per chunk

  /// Row blocks per chunk of Q steps.
  static int row_blocks(int Q) { return (Q + BR - 1) / BR; }
  /// One team per (b, g or h, chunk, row block).
  long long teams() const {
    return (long long)this->x.extent(0) * (kGroups ? this->Bm.extent(2) : this->x.extent(2)) *
           this->chunks * blocks;
  }
  /// Where ChunkScores are [rows(), scores_ld(Q)²].
  std::size_t rows() const {
    return this->x.extent(0) * std::size_t(this->chunks) *
           (kGroups ? this->Bm.extent(2) : this->x.extent(2));
  }

  // The operands of the product at chunk step s, element m: the rows i
  // (C or dY) and the steps j (B or X̃).
  using Chunk = typename SsdChunks<ExecSpace, T>::Chunk;
  KOKKOS_INLINE_FUNCTION T row(const Chunk& k, int s, int m) const {
    if constexpr (kGroups) {
      return this->Cm(k.b, k.t0 + s, k.g, m);
    } else {
      return dy(k.b, k.t0 + s, k.h, m);
    }
  }
  KOKKOS_INLINE_FUNCTION T step(const Chunk& k, int s, int m) const {
    if constexpr (kGroups) {
      return this->Bm(k.b, k.t0 + s, k.g, m);
    } else {
      return this->xt(k, s, m);
    }
  }

  static KOKKOS_INLINE_FUNCTION T* carve(kdnn::impl::ScratchCarver& s, int) {
    return s.take<T>(BK * LDB);
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    const Chunk k = kGroups ? this->group_chunk(item / blocks) : this->chunk(item / blocks);
    const int i0 = item % blocks * BR;
    const int rows = k.n - i0 < BR ? k.n - i0 : BR;
    if (rows <= 0) return;  // past a short last chunk: the whole team
    kdnn::impl::ScratchCarver carver(scratch);
    T* const tile = carve(carver, this->Q);
    T* const out = &scores(
        kGroups ? this->scores_row(k.b, k.c, k.g) : this->head_scores_row(k.b, k.c, k.h), 0);
    const int ld = scores_ld<T>(this->Q);

    // Thread t's A register e: row(i0 + row, col) of its fragment, 0 past
    // the block's rows.
    const auto a_fragment = [&](int t, int e) {
      const kdnn::impl::FragmentIndex f = kdnn::impl::mma_a_place<Mma, 1, K>(t, e);
      return f.row < rows ? row(k, i0 + f.row, f.col) : T(0);
    };
    kdnn::impl::ThreadRegisters<T, NT, NK * CR, kPrivate> acc;
    for (int j0 = 0; j0 < i0 + rows; j0 += BK) {
      const int cols = k.n - j0 < BK ? k.n - j0 : BK;
      team.team_barrier();  // the previous tile is done with
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * K), [&](int e) {
        const int s = e / K, m = e % K;
        tile[s * LDB + m] = s < cols ? step(k, j0 + s, m) : T(0);
      });
      team.team_barrier();
      kdnn::impl::mma_rows_by_tile<Mma, Precision, NT, kPrivate, 1, NK, K>(team, a_fragment, tile,
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
