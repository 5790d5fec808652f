// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The chunk sums of outer products (ssd_chunk_sums.hpp: S_c, or dS_c with
// `gradient`) on tensor cores (KernelForm::tensor_cores, team_mma.hpp), as
// the transposed product S_cᵀ[p, n] = Σ_j (factor_j·x_j[p])·B_j[n]: the
// steps are the k of the product, x's rows its A and B's rows its B operand,
// both read from scratch as they lie in memory (no transposing store).
//
// A team of four warps owns BP = 4·Mma::M values p (64 in float, 32 in
// double) and BN = 64 values n of one chunk's result, each warp Mma::M rows
// p by the 64 n in NC = 8 accumulator tiles (32 floats or 16 doubles a
// thread). It scans the chunk's log-decays and takes each step's factor
// (one exp per step, SsdChunkSums::step_factors), then walks the chunk's
// steps in tiles of BK = 32: the scaled rows of x (or dy) [BK, BP + pad] and
// of B (or C) [BK, BN + pad] in scratch, pad 8 words in float and 4 doubles
// in double, so that a warp's fragment reads fall on distinct banks. The
// products sum over the steps in another order than the FMA form, so the
// two agree to rounding. Precision as SsdChunkScoresMmaKernel.
#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/team_mma.hpp"
#include "kdnn/ssm/impl/ssd_chunk_sums.hpp"
#include "kdnn/ssm/impl/ssd_gpu_chunks.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T, int P, int N, kdnn::impl::MmaPrecision Precision>
struct SsdChunkStateMmaKernel
    : SsdGpuChunks<SsdChunkStateMmaKernel<ExecSpace, T, P, N, Precision>, ExecSpace, T, P, N>,
      SsdChunkSums<ExecSpace, T> {
  using Base = SsdGpuChunks<SsdChunkStateMmaKernel, ExecSpace, T, P, N>;
  using Sums = SsdChunkSums<ExecSpace, T>;
  using Chunk = typename Base::Chunk;
  using Mma = kdnn::impl::MmaOf<T>;
  using Sums::decay;
  using Sums::dy;
  using Sums::gradient;
  using Sums::states;
  using typename Base::Member;
  static constexpr int NT = Base::NT;
  static constexpr int BP = NT / 32 * Mma::M;  ///< p per team: one m-tile per warp
  static constexpr int BN = 64;                ///< n per team
  static constexpr int NC = BN / 8;            ///< 8-column accumulator tiles
  static constexpr int BK = 32;                ///< steps per streamed tile
  static constexpr int CR = Mma::c_regs;
  static constexpr int LDX = BP + (sizeof(T) > 4 ? 4 : 8);  ///< row stride of x's tile
  static constexpr int LDB = BN + (sizeof(T) > 4 ? 4 : 8);  ///< row stride of B's tile
  static constexpr int kBlocks = (P / BP) * (N / BN);       ///< blocks per chunk
  static_assert(P % BP == 0 && N % BN == 0, "SsdChunkStateMmaKernel: whole blocks");
  static_assert(sizeof(T) == 4 || Precision == kdnn::impl::MmaPrecision::full,
                "SsdChunkStateMmaKernel: a single TF32 pass is a float precision");

  struct Work {
    double* cum;  ///< [pad(Q)]
    int* seg;     ///< [pad(Q)]
    T* scale;     ///< [pad(Q)]: step i's factor on its row of x or dy
    T *xs, *bs;   ///< scaled x or dy tile [BK, LDX], B or C tile [BK, LDB]
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s, int Q) {
    Work w;
    w.cum = s.take<double>(Base::Shape::pad(Q));
    w.seg = s.take<int>(Base::Shape::pad(Q));
    w.scale = s.take<T>(Base::Shape::pad(Q));
    w.xs = s.take<T>(BK * LDX);
    w.bs = s.take<T>(BK * LDB);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    int block = 0;
    const Chunk k = this->chunk_of(item, block);
    const int p0 = block % (P / BP) * BP, n0 = block / (P / BP) * BN;
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver, this->Q);
    kdnn::impl::ThreadRegisters<T, NT, NC * CR, Base::kPrivate> acc;
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int e = 0; e < NC * CR; ++e) acc(t)[e] = T(0);
    });
    const T whole = this->step_factors(team, *this, k, w.cum, w.seg, w.scale);
    const auto& bc = gradient ? this->Cm : this->Bm;
    const auto& rows = gradient ? dy : this->x;
    // Thread t's A register e: the scaled x[step, p] of its fragment.
    const auto a = [&](int t, int e) {
      const kdnn::impl::FragmentIndex f = kdnn::impl::mma_a_place<Mma, 1, BK>(t, e);
      return w.xs[f.col * LDX + f.row];
    };
    for (int j0 = 0; j0 < k.n; j0 += BK) {
      const int cols = k.n - j0 < BK ? k.n - j0 : BK;
      if (j0 > 0) team.team_barrier();  // the previous tile is done with
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * BP), [&](int e) {
        const int s = e / BP, p = e % BP;
        T v = T(0);
        if (s < cols) v = w.scale[j0 + s] * rows(k.b, k.t0 + j0 + s, k.h, p0 + p);
        w.xs[s * LDX + p] = v;
      });
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * BN), [&](int e) {
        const int s = e / BN, n = e % BN;
        w.bs[s * LDB + n] = s < cols ? bc(k.b, k.t0 + j0 + s, k.g, n0 + n) : T(0);
      });
      team.team_barrier();
      kdnn::impl::mma_add_rows_product<Mma, Precision, NT, Base::kPrivate, 1, NC, BK>(team, a, w.bs,
                                                                                      LDB, acc);
    }
    Base::threads(team, [&](int t) {
      T* out = &states(k.b, k.h, k.c, 0);
      KDNN_IMPL_UNROLL
      for (int nc = 0; nc < NC; ++nc) {
        KDNN_IMPL_UNROLL
        for (int r = 0; r < CR; ++r) {
          const kdnn::impl::FragmentIndex c = Mma::c(t % 32, r);
          const int p = p0 + t / 32 * Mma::M + c.row, n = n0 + nc * 8 + c.col;
          out[n * P + p] = acc(t)[nc * CR + r];
        }
      }
    });
    if (block == 0 && !gradient) {
      Kokkos::single(Kokkos::PerTeam(team), [&]() { decay(k.b, k.h, k.c) = whole; });
    }
  }
};

}  // namespace kdnn::ssm::impl
