// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The SSD backward's dX̃ gradient on tensor cores (KernelForm::tensor_cores,
// team_mma.hpp): what SsdGradientGpuKernel<…, SsdGradient::dx> computes
// with FMAs (ssd_gradient_gpu_kernel.hpp), with both products on tensor
// cores, for the rows j of a chunk:
//
//   dX̃_j = dend_j·(B_j·dH) + Σ_{i≥j} CB_ij·m_ij·dY_i,
//
//  * the state term: B's A fragments read where the product asks for them
//    (from L1, as in ssd_chunk_scores_mma_kernel.hpp), dH = dH_{c+1} [N, P]
//    streamed in tiles of BK rows n as they lie in memory;
//  * the diagonal term: the group's scores CB (ssd_chunk_scores_mma_kernel.hpp,
//    required) read transposed and weighed by the decays (0 below the
//    diagonal and past the chunk) into W [BR, BK + 4] in scratch, then W's
//    A fragments times the tile's dY [BK, P] rows.
//
// Then as the FMA form: dx = dt·dX̃ + D·dy, and per step the sums the
// finishing kernel takes (SsdStepSums: row_a = dend·X̃·(B·dH), sx = Σ_p
// x·dX̃, sd = Σ_p dy·x). A team of four warps owns BR = 4·Mma::M steps j
// (64 in float, 32 in double) and every p (the sums run over a whole row),
// each warp Mma::M steps by P in NC = P / 8 accumulator tiles. A row's sums
// are taken in a fixed order: each (row, column of an 8-column tile) has
// one owner (Mma::c), which adds its tiles; one thread per row then adds the
// 8 partials. Precision as SsdChunkScoresMmaKernel.
#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/team_mma.hpp"
#include "kdnn/ssm/impl/ssd_chunk_scores_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_gpu_chunks.hpp"
#include "kdnn/ssm/impl/ssd_gradients.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T, int P, int N, kdnn::impl::MmaPrecision Precision>
struct SsdDxMmaKernel
    : SsdGpuChunks<SsdDxMmaKernel<ExecSpace, T, P, N, Precision>, ExecSpace, T, P, N> {
  using Base = SsdGpuChunks<SsdDxMmaKernel, ExecSpace, T, P, N>;
  using Chunk = typename Base::Chunk;
  using Mma = kdnn::impl::MmaOf<T>;
  using typename Base::Member;
  static constexpr int NT = Base::NT;
  static constexpr int BR = NT / 32 * Mma::M;  ///< steps j per team: one m-tile per warp
  static constexpr int NC = P / 8;             ///< 8-column accumulator tiles
  static constexpr int BK = 32;                ///< steps i or rows n per streamed tile
  static constexpr int CR = Mma::c_regs;
  static constexpr int LDW = BK + 4;                       ///< row stride of W
  static constexpr int LDX = P + (sizeof(T) > 4 ? 4 : 8);  ///< row stride of dY and dH tiles
  static_assert(N % BK == 0, "SsdDxMmaKernel: whole tiles of dH");
  static_assert(sizeof(T) == 4 || Precision == kdnn::impl::MmaPrecision::full,
                "SsdDxMmaKernel: a single TF32 pass is a float precision");

  Tensor4<const T, ExecSpace> dy;           ///< [B, L, H, P]
  Vector<const T, ExecSpace> D;             ///< [H] or empty
  bool has_d = false;                       ///< whether D is given
  ChunkStates<const T, ExecSpace> dstates;  ///< dH_{c+1}
  SsdGradients<ExecSpace, T> g;             ///< dx
  SsdStepSums<ExecSpace> sums;              ///< row_a, sx, sd
  ChunkScores<const T, ExecSpace> scores;   ///< C·Bᵀ per chunk and group

  /// Row blocks per chunk of Q steps.
  static int blocks_per_chunk(int Q) { return (Q + BR - 1) / BR; }

  struct Work {
    double* cum;  ///< [pad(Q)]
    T* wt;        ///< W [BR, LDW]; the row sums' partials [2, BR, 8]
    T* rows;      ///< a dY or dH tile [BK, LDX]
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s, int Q) {
    static_assert(LDW >= 2 * 8, "the row sums' partials fit in W");
    Work w;
    w.cum = s.take<double>(Base::Shape::pad(Q));
    w.wt = s.take<T>(BR * LDW);
    w.rows = s.take<T>(BK * LDX);
    return w;
  }

  KOKKOS_INLINE_FUNCTION T xt(const Chunk& k, int s, int p) const {  // X̃ = dt·x
    const int t = k.t0 + s;
    return this->dt(k.b, t, k.h) * this->x(k.b, t, k.h, p);
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    int block = 0;
    const Chunk k = this->chunk_of(item, block);
    const int j0 = block * BR;
    const int rows = k.n - j0 < BR ? k.n - j0 : BR;
    if (rows <= 0) return;  // past a short last chunk: the whole team
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver, this->Q);
    this->scan_decays(team, k, Base::Shape::pad(k.n), w.cum);  // dend needs cum_last
    kdnn::impl::ThreadRegisters<T, NT, NC * CR, Base::kPrivate> acc;
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int e = 0; e < NC * CR; ++e) acc(t)[e] = T(0);
    });
    // Thread t's A register e in a product over a tile of BK: its (step in
    // the block, column in the tile).
    const auto place = [](int t, int e) { return kdnn::impl::mma_a_place<Mma, 1, BK>(t, e); };
    const auto one = [](int) { return T(1); };

    // acc = B·dH, dH's rows n in tiles of BK.
    const T* dh = &dstates(k.b, k.h, k.c, 0);
    for (int n0 = 0; n0 < N; n0 += BK) {
      team.team_barrier();  // the previous tile is done with
      Base::template load_rows<BK, P, LDX>(team, dh + std::size_t(n0) * P, P, BK, one, w.rows);
      team.team_barrier();
      const auto b_fragment = [&](int t, int e) {
        const kdnn::impl::FragmentIndex f = place(t, e);
        return f.row < rows ? this->Bm(k.b, k.t0 + j0 + f.row, k.g, n0 + f.col) : T(0);
      };
      kdnn::impl::mma_add_rows_product<Mma, Precision, NT, Base::kPrivate, 1, NC, BK>(
          team, b_fragment, w.rows, LDX, acc);
    }
    // row_a = dend·X̃·(B·dH), then the state term's rows scaled by dend.
    T* const partials = w.wt;
    row_partials(team, acc, rows, partials, [&](int j, int p) { return xt(k, j0 + j, p); });
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int j) {
      sums.row_a(k.b, k.h, k.t0 + j0 + j) = double(dend(k, w, j0 + j)) * sum_of_row(partials, j);
    });
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int r = 0; r < CR; ++r) {
        const int j = t / 32 * Mma::M + Mma::c(t % 32, r).row;
        const T f = j < rows ? dend(k, w, j0 + j) : T(0);
        KDNN_IMPL_UNROLL
        for (int nc = 0; nc < NC; ++nc) acc(t)[nc * CR + r] *= f;
      }
    });

    // acc += W·dY over the steps i ≥ j, W[j, i] = CB[i][j]·m_ij.
    const T* cb = &scores(this->scores_row(k.b, k.c, k.g), 0);
    const int ld = scores_ld<T>(this->Q);
    for (int i0 = j0; i0 < k.n; i0 += BK) {
      const int count = k.n - i0 < BK ? k.n - i0 : BK;
      team.team_barrier();  // the row sums are read, the previous tile done with
      // Along a row of CB (consecutive j) for coalesced reads.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * BR), [&](int e) {
        const int s = e / BR, r = e % BR, i = i0 + s, j = j0 + r;
        w.wt[r * LDW + s] =
            j <= i && i < k.n ? cb[i * ld + j] * Base::decay_mask(w.cum, i, j, k.n) : T(0);
      });
      Base::template load_rows<BK, P, LDX>(team, &dy(k.b, k.t0 + i0, k.h, 0), dy.stride(1), count,
                                           one, w.rows);
      team.team_barrier();
      const auto w_fragment = [&](int t, int e) {
        const kdnn::impl::FragmentIndex f = place(t, e);
        return w.wt[f.row * LDW + f.col];
      };
      kdnn::impl::mma_add_rows_product<Mma, Precision, NT, Base::kPrivate, 1, NC, BK>(
          team, w_fragment, w.rows, LDX, acc);
    }
    team.team_barrier();  // W is free for the row sums
    store(team, k, j0, rows, partials, acc);
  }

  /// dend_j = exp(cum_last − cum_j).
  KOKKOS_INLINE_FUNCTION static T dend(const Chunk& k, const Work& w, int j) {
    return compat::exp(T(w.cum[k.n - 1] - w.cum[j]));
  }

  /// dx = dt·dX̃ + D·dy, and sx = Σ_p x·dX̃, sd = Σ_p dy·x of each row.
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void store(const Member& team, const Chunk& k, int j0, int rows,
                                    T* partials, Acc& acc) const {
    const T dh = has_d ? D(k.h) : T(0);
    T* const sx = partials;
    T* const sd = partials + BR * 8;
    // Loops over a thread's rows, then its columns (as in
    // ssd_chunk_output_mma_kernel.hpp, for CUDA 11.8's compiler).
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int r = 0; r < CR; ++r) {
        const kdnn::impl::FragmentIndex c = Mma::c(t % 32, r);
        const int j = t / 32 * Mma::M + c.row;
        T px = 0, pd = 0;
        if (j < rows) {
          const int step = k.t0 + j0 + j;
          const T dtj = this->dt(k.b, step, k.h);
          const T* xr = &this->x(k.b, step, k.h, c.col);
          const T* dyr = &dy(k.b, step, k.h, c.col);
          T* out = &g.dx(k.b, step, k.h, c.col);
          KDNN_IMPL_UNROLL
          for (int nc = 0; nc < NC; ++nc) {
            const T dxt = acc(t)[nc * CR + r];  // dX̃
            out[nc * 8] = dtj * dxt + dh * dyr[nc * 8];
            px += xr[nc * 8] * dxt;
            pd += dyr[nc * 8] * xr[nc * 8];
          }
        }
        sx[j * 8 + c.col] = px;
        sd[j * 8 + c.col] = pd;
      }
    });
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int j) {
      const int step = k.t0 + j0 + j;
      sums.sx(k.b, k.h, step) = sum_of_row(sx, j);
      sums.sd(k.b, k.h, step) = sum_of_row(sd, j);
    });
  }

  /// partials[j·8 + col] = Σ_nc acc·y(j, p) over the accumulator registers
  /// of (row j, column col of each 8-column tile), p = nc·8 + col, for the
  /// block's rows j < rows (y is read only there); 0 past them. A barrier
  /// must follow.
  template <class Acc, class Y>
  KOKKOS_INLINE_FUNCTION void row_partials(const Member& team, Acc& acc, int rows, T* partials,
                                           const Y& y) const {
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int r = 0; r < CR; ++r) {
        const kdnn::impl::FragmentIndex c = Mma::c(t % 32, r);
        const int j = t / 32 * Mma::M + c.row;
        T part = 0;
        if (j < rows) {
          KDNN_IMPL_UNROLL
          for (int nc = 0; nc < NC; ++nc) part += acc(t)[nc * CR + r] * y(j, nc * 8 + c.col);
        }
        partials[j * 8 + c.col] = part;
      }
    });
  }
  /// The 8 partials of row j, added in order.
  KOKKOS_INLINE_FUNCTION static double sum_of_row(const T* partials, int j) {
    T s = 0;
    for (int c = 0; c < 8; ++c) s += partials[j * 8 + c];
    return double(s);
  }
};

}  // namespace kdnn::ssm::impl
