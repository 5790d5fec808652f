// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The SSD backward's per-step gradients dX̃, dB and dC on tensor cores
// (KernelForm::tensor_cores, team_mma.hpp): what SsdGradientGpuKernel
// computes with FMAs (ssd_gradient_gpu_kernel.hpp, where the three sums are
// written out), with both of each one's products on tensor cores. A result
// row r (a step) is
//
//   scale_r·(U_r·S) + Σ_s W_rs·Z_s,   W_rs = V_{later, earlier}·m_{later, earlier},
//
//        U    S                scale   V, stored          s      Z
//   dX̃   B    dH [N, P]        dend    C·Bᵀ of the group  s ≥ r  dY
//   dB   X̃    dH as [P, N]     dend    dY·X̃ᵀ of the head  s ≥ r  C
//   dC   dY   H as [P, N]      e       dY·X̃ᵀ of the head  s ≤ r  B
//
// (ssd_chunk_scores_mma_kernel.hpp stores both V, rows the later step, so
// dB and dC share one product): U's A fragments read where the product asks
// for them (from L1, as in ssd_chunk_scores_mma_kernel.hpp), S streamed in
// tiles of BK rows; W built in scratch [BR, BK + 4], a thread per entry
// along V's rows (coalesced), 0 outside the causal triangle and the chunk;
// Z in tiles of BK rows as they lie in memory.
//
// Then as the FMA form: dx = dt·dX̃ + D·dy, dB and dC per head, and per step
// the sums the finishing kernel takes (SsdStepSums): with dX̃, row_a =
// dend·X̃·(B·dH), sx = Σ_p x·dX̃ and sd = Σ_p dy·x; with dC, dcum =
// e·C·(dY·H). A team of four warps owns BR = 4·Mma::M steps (64 in float,
// 32 in double) and every result column (the sums run over whole rows),
// each warp Mma::M steps in NC = KO / 8 accumulator tiles. A row's sums are
// taken in a fixed order: each (row, column of an 8-column tile) has one
// owner (Mma::c), which adds its tiles; one thread per row then adds the 8
// partials. Precision as SsdChunkScoresMmaKernel.
#include <type_traits>

#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/team_mma.hpp"
#include "kdnn/ssm/impl/ssd_chunk_scores_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_gpu_chunks.hpp"
#include "kdnn/ssm/impl/ssd_gradients.hpp"
#include "kdnn/ssm/impl/ssd_skip.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T, int P, int N, SsdGradient Which,
          kdnn::impl::MmaPrecision Precision>
struct SsdGradientMmaKernel
    : SsdGpuChunks<SsdGradientMmaKernel<ExecSpace, T, P, N, Which, Precision>, ExecSpace, T, P, N> {
  using Base = SsdGpuChunks<SsdGradientMmaKernel, ExecSpace, T, P, N>;
  using Chunk = typename Base::Chunk;
  using Mma = kdnn::impl::MmaOf<T>;
  using typename Base::Member;
  static constexpr bool kDx = Which == SsdGradient::dx;
  static constexpr bool kUpper = Which != SsdGradient::dC;  ///< partner steps s ≥ r
  template <int IfDx, int Else>  // (a conditional operator would have equal branches at N = P)
  using Pick =
      std::conditional_t<kDx, std::integral_constant<int, IfDx>, std::integral_constant<int, Else>>;
  static constexpr int KI = Pick<N, P>::value;  ///< U's size
  static constexpr int KO = Pick<P, N>::value;  ///< result columns
  static constexpr int NT = Base::NT;
  static constexpr int BR = NT / 32 * Mma::M;  ///< steps per team: one m-tile per warp
  static constexpr int NC = KO / 8;            ///< 8-column accumulator tiles
  static constexpr int BK = 32;                ///< partner steps or rows of S per tile
  static constexpr int CR = Mma::c_regs;
  static constexpr int LDW = BK + 4;                        ///< row stride of W
  static constexpr int LDX = KO + (sizeof(T) > 4 ? 4 : 8);  ///< row stride of S and Z tiles
  static_assert(KI % BK == 0, "SsdGradientMmaKernel: whole tiles of S");
  static_assert(sizeof(T) == 4 || Precision == kdnn::impl::MmaPrecision::full,
                "SsdGradientMmaKernel: a single TF32 pass is a float precision");

  Tensor4<const T, ExecSpace> dy;           ///< [B, L, H, P]
  SsdSkip<ExecSpace, T> skip;               ///< D (dx)
  ChunkStates<const T, ExecSpace> states;   ///< H_c (dC)
  ChunkStates<const T, ExecSpace> dstates;  ///< dH_{c+1} (dx, dB)
  SsdGradients<ExecSpace, T> g;             ///< dx, dBh or dCh
  SsdStepSums<ExecSpace> sums;              ///< row_a, sx, sd (dx); dcum (dC)
  /// V: C·Bᵀ per chunk and group (dx), dY·X̃ᵀ per chunk and head (dB, dC).
  ChunkScores<const T, ExecSpace> scores;

  /// Row blocks per chunk of Q steps.
  static int blocks_per_chunk(int Q) { return (Q + BR - 1) / BR; }

  struct Work {
    double* cum;  ///< [pad(Q)]
    int* seg;     ///< [pad(Q)]
    T* wt;        ///< W [BR, LDW]; the row sums' partials [2, BR, 8]
    T* rows;      ///< an S or Z tile [BK, LDX]
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s, int Q) {
    static_assert(LDW >= 2 * 8, "the row sums' partials fit in W");
    Work w;
    w.cum = s.take<double>(Base::Shape::pad(Q));
    w.seg = s.take<int>(Base::Shape::pad(Q));
    w.wt = s.take<T>(BR * LDW);
    w.rows = s.take<T>(BK * LDX);
    return w;
  }

  /// U at chunk step s, element q.
  KOKKOS_INLINE_FUNCTION T row_operand(const Chunk& k, int s, int q) const {
    if constexpr (Which == SsdGradient::dx) {
      return this->Bm(k.b, k.t0 + s, k.g, q);
    } else if constexpr (Which == SsdGradient::dB) {
      return this->xt(k, s, q);
    } else {
      return dy(k.b, k.t0 + s, k.h, q);
    }
  }
  /// Z's row at chunk step s, and the stride between its steps.
  KOKKOS_INLINE_FUNCTION const T* right(const Chunk& k, int s) const {
    if constexpr (Which == SsdGradient::dx) {
      return &dy(k.b, k.t0 + s, k.h, 0);
    } else if constexpr (Which == SsdGradient::dB) {
      return &this->Cm(k.b, k.t0 + s, k.g, 0);
    } else {
      return &this->Bm(k.b, k.t0 + s, k.g, 0);
    }
  }
  KOKKOS_INLINE_FUNCTION std::size_t right_stride() const {
    return kDx ? dy.stride(1) : Which == SsdGradient::dB ? this->Cm.stride(1) : this->Bm.stride(1);
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    int block = 0;
    const Chunk k = this->chunk_of(item, block);
    const int r0 = block * BR;
    const int rows = k.n - r0 < BR ? k.n - r0 : BR;
    if (rows <= 0) return;  // past a short last chunk: the whole team
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver, this->Q);
    // dend needs cum_last; the lower sum only the steps up to the block's.
    this->scan_decays(team, k, Base::Shape::pad(kUpper ? k.n : r0 + rows), w.cum, w.seg);
    kdnn::impl::ThreadRegisters<T, NT, NC * CR, Base::kPrivate> acc;
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int e = 0; e < NC * CR; ++e) acc(t)[e] = T(0);
    });

    state_term(team, k, w, r0, rows, acc);
    T* const partials = w.wt;
    if constexpr (Which != SsdGradient::dB) {
      // X̃·(B·dH) or C·(dY·H) of each row, before the scale.
      row_partials(team, acc, rows, partials, [&](int r, int o) -> T {
        if constexpr (kDx) {
          return this->xt(k, r0 + r, o);
        } else {
          return this->Cm(k.b, k.t0 + r0 + r, k.g, o);
        }
      });
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
        const double v = double(scale(k, w, r0 + r)) * sum_of_row(partials, r);
        (kDx ? sums.row_a : sums.dcum)(k.b, k.h, k.t0 + r0 + r) = v;
      });
    }
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int r = 0; r < CR; ++r) {
        const int i = t / 32 * Mma::M + Mma::c(t % 32, r).row;
        const T f = i < rows ? scale(k, w, r0 + i) : T(0);
        KDNN_IMPL_UNROLL
        for (int nc = 0; nc < NC; ++nc) acc(t)[nc * CR + r] *= f;
      }
    });
    diagonal_term(team, k, w, r0, rows, acc);
    team.team_barrier();  // W is free for the row sums
    store(team, k, r0, rows, partials, acc);
  }

  /// dend_r (rows j: dX̃, dB) or e_r (rows i: dC).
  KOKKOS_INLINE_FUNCTION static T scale(const Chunk& k, const Work& w, int r) {
    if constexpr (kUpper) {
      return Base::leaving(w.cum, w.seg, r, k.n - 1);
    } else {
      return Base::entering(w.cum, w.seg, r);
    }
  }

  /// Thread t's A register e in a product over a tile of BK: its (step in
  /// the block, column in the tile).
  static KOKKOS_FORCEINLINE_FUNCTION kdnn::impl::FragmentIndex place(int t, int e) {
    return kdnn::impl::mma_a_place<Mma, 1, BK>(t, e);
  }

  /// acc = U·S over KI in tiles of BK rows of S: dH [N, P] as stored (dX̃),
  /// or dH, H as [P, N] (read down the stored rows, so that neighbouring
  /// threads read consecutive p).
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void state_term(const Member& team, const Chunk& k, const Work& w, int r0,
                                         int rows, Acc& acc) const {
    const T* s = Which == SsdGradient::dC ? &states(k.b, k.h, k.c, 0) : &dstates(k.b, k.h, k.c, 0);
    for (int q0 = 0; q0 < KI; q0 += BK) {
      team.team_barrier();  // the previous tile is done with
      if constexpr (kDx) {
        Base::template load_rows<BK, KO, LDX>(
            team, s + std::size_t(q0) * P, P, BK, [](int) { return T(1); }, w.rows);
      } else {
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * KO), [&](int e) {
          const int q = e % BK, o = e / BK;
          w.rows[q * LDX + o] = s[o * P + q0 + q];
        });
      }
      team.team_barrier();
      const auto u_fragment = [&](int t, int e) {
        const kdnn::impl::FragmentIndex f = place(t, e);
        return f.row < rows ? row_operand(k, r0 + f.row, q0 + f.col) : T(0);
      };
      kdnn::impl::mma_add_rows_product<Mma, Precision, NT, Base::kPrivate, 1, NC, BK>(
          team, u_fragment, w.rows, LDX, acc);
    }
  }

  /// acc += W·Z over the partner steps s, in tiles of BK.
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void diagonal_term(const Member& team, const Chunk& k, const Work& w,
                                            int r0, int rows, Acc& acc) const {
    const T* v =
        &scores(kDx ? this->scores_row(k.b, k.c, k.g) : this->head_scores_row(k.b, k.c, k.h), 0);
    const int ld = scores_ld<T>(this->Q);
    const int first = kUpper ? r0 : 0, end = kUpper ? k.n : r0 + rows;
    for (int s0 = first; s0 < end; s0 += BK) {
      const int count = k.n - s0 < BK ? k.n - s0 : BK;
      team.team_barrier();  // cum and the row sums are done with, the previous tile too
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * BR), [&](int e) {
        // Consecutive e along a row of V (the earlier step) for coalesced reads.
        const int r = kUpper ? e % BR : e / BK, s = kUpper ? e / BR : e % BK;
        const int later = kUpper ? s0 + s : r0 + r, earlier = kUpper ? r0 + r : s0 + s;
        w.wt[r * LDW + s] =
            earlier <= later && later < k.n
                ? v[later * ld + earlier] * Base::decay_mask(w.cum, w.seg, later, earlier, k.n)
                : T(0);
      });
      Base::template load_rows<BK, KO, LDX>(
          team, right(k, s0), right_stride(), count, [](int) { return T(1); }, w.rows);
      team.team_barrier();
      const auto w_fragment = [&](int t, int e) {
        const kdnn::impl::FragmentIndex f = place(t, e);
        return w.wt[f.row * LDW + f.col];
      };
      kdnn::impl::mma_add_rows_product<Mma, Precision, NT, Base::kPrivate, 1, NC, BK>(
          team, w_fragment, w.rows, LDX, acc);
    }
  }

  /// The result rows: dx = dt·dX̃ + D·dy with sx and sd, or dB, dC.
  // Loops over a thread's rows, then its columns (as in
  // ssd_chunk_output_mma_kernel.hpp, for CUDA 11.8's compiler).
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void store(const Member& team, const Chunk& k, int r0, int rows,
                                    T* partials, Acc& acc) const {
    if constexpr (kDx) {
      const SkipRow<T> skip_h = skip.row(k.h, P);
      T* const sx = partials;
      T* const sd = partials + BR * 8;
      Base::threads(team, [&](int t) {
        KDNN_IMPL_UNROLL
        for (int r = 0; r < CR; ++r) {
          const kdnn::impl::FragmentIndex c = Mma::c(t % 32, r);
          const int j = t / 32 * Mma::M + c.row;
          T px = 0, pd = 0;
          if (j < rows) {
            const int step = k.t0 + r0 + j;
            const T dtj = this->dt(k.b, step, k.h);
            const T* xr = &this->x(k.b, step, k.h, c.col);
            const T* dyr = &dy(k.b, step, k.h, c.col);
            T* out = &g.dx(k.b, step, k.h, c.col);
            KDNN_IMPL_UNROLL
            for (int nc = 0; nc < NC; ++nc) {
              const T dxt = acc(t)[nc * CR + r];  // dX̃
              out[nc * 8] = dtj * dxt + skip_h.at(c.col + nc * 8) * dyr[nc * 8];
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
        const int step = k.t0 + r0 + j;
        sums.sx(k.b, k.h, step) = sum_of_row(sx, j);
        sums.sd(k.b, k.h, step) = sum_of_row(sd, j);
      });
    } else {
      const auto& out = Which == SsdGradient::dB ? g.dBh : g.dCh;
      Base::threads(team, [&](int t) {
        KDNN_IMPL_UNROLL
        for (int r = 0; r < CR; ++r) {
          const kdnn::impl::FragmentIndex c = Mma::c(t % 32, r);
          const int i = t / 32 * Mma::M + c.row;
          if (i < rows) {
            T* o = &out(k.b, k.t0 + r0 + i, k.h, c.col);
            KDNN_IMPL_UNROLL
            for (int nc = 0; nc < NC; ++nc) o[nc * 8] = acc(t)[nc * CR + r];
          }
        }
      });
    }
  }

  /// partials[r·8 + col] = Σ_nc acc·y(r, o) over the accumulator registers
  /// of (row r, column col of each 8-column tile), o = nc·8 + col, for the
  /// block's rows r < rows (y is read only there); 0 past them. A barrier
  /// must follow.
  template <class Acc, class Y>
  KOKKOS_INLINE_FUNCTION void row_partials(const Member& team, Acc& acc, int rows, T* partials,
                                           const Y& y) const {
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int r = 0; r < CR; ++r) {
        const kdnn::impl::FragmentIndex c = Mma::c(t % 32, r);
        const int i = t / 32 * Mma::M + c.row;
        T part = 0;
        if (i < rows) {
          KDNN_IMPL_UNROLL
          for (int nc = 0; nc < NC; ++nc) part += acc(t)[nc * CR + r] * y(i, nc * 8 + c.col);
        }
        partials[i * 8 + c.col] = part;
      }
    });
  }
  /// The 8 partials of row r, added in order.
  KOKKOS_INLINE_FUNCTION static double sum_of_row(const T* partials, int r) {
    T s = 0;
    for (int c = 0; c < 8; ++c) s += partials[r * 8 + c];
    return double(s);
  }
};

}  // namespace kdnn::ssm::impl
