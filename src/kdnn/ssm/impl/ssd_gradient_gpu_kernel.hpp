// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The SSD backward's per-step gradients dX̃, dB and dC, GPU form
// (ssd_gpu_chunks.hpp; the host form is SsdBackwardKernel's). With
// W = CB∘m and V = (dY·X̃ᵀ)∘m (ssd_diag_backward_kernel.hpp) and the state
// terms of ssd_state_backward_kernel.hpp, each is a product over the chunk
// of the same shape as the forward's output (ssd_chunk_output_gpu_kernel.hpp):
//
//   dX̃_j = dend_j·(B_j·dHᵀ) + Σ_{i≥j} (B_j·C_i)·m_ij·dY_i     (rows j)
//   dB_j = dend_j·(X̃_j·dH)  + Σ_{i≥j} (X̃_j·dY_i)·m_ij·C_i    (rows j)
//   dC_i = e_i·(dY_i·H)      + Σ_{j≤i} (dY_i·X̃_j)·m_ij·B_j    (rows i)
//
// that is, a result row r has a row operand U_r (B, X̃ or dY) of KI values,
// a state term U_r·S (S = dH or H as [KI, KO]) scaled by dend_r or e_r, and
// a sum over the partner steps s (after r, or before) of (U_r·U'_s)·m·Z_s,
// with U' = C, dY or X̃ and Z = dY, C or B of KO values.
//
// A team owns BR rows of one chunk and keeps Uᵀ [KI, BR] in scratch, its
// RM × KO/8 block of the result in registers: first the state term from S
// streamed in tiles of BK rows, then per tile of BK partner steps U'ᵀ
// [KI, BK] → each thread's RM × RN micro-tile of U·U'ᵀ times the decays to
// Wᵀ [BK, BR] (dX̃ where heads share a group: B·Cᵀ read from the group's
// scores, SsdChunkScoresGpuKernel, the same values transposed), and Z
// [BK, KO] → the result += W·Z. What the rest of the
// backward needs per step goes to SsdStepSums: with dX̃, X̃·(B·dHᵀ) scaled
// (row_a), Σ_p x·dX̃ (sx) and Σ_p dy·x (sd); with dC, C·(dY·H) scaled (dcum).
// Their sums over a row's columns are taken in a fixed order (the column
// groups' partial sums in scratch, added by one thread), no atomics.
#include <type_traits>

#include "kdnn/ssm/impl/ssd_chunk_scores_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_gpu_chunks.hpp"
#include "kdnn/ssm/impl/ssd_gradients.hpp"
#include "kdnn/ssm/impl/ssd_skip.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T, int P, int N, SsdGradient Which>
struct SsdGradientGpuKernel
    : SsdGpuChunks<SsdGradientGpuKernel<ExecSpace, T, P, N, Which>, ExecSpace, T, P, N> {
  using Base = SsdGpuChunks<SsdGradientGpuKernel, ExecSpace, T, P, N>;
  using Chunk = typename Base::Chunk;
  using Base::BK;
  using Base::BR;
  using Base::CG;
  using Base::LDK;
  using Base::LDR;
  using Base::NT;
  using Base::RM;
  using typename Base::Member;
  static constexpr bool kDx = Which == SsdGradient::dx;
  static constexpr bool kUpper = Which != SsdGradient::dC;  ///< partner steps s ≥ r
  template <int IfDx, int Else>
  using Pick =
      std::conditional_t<kDx, std::integral_constant<int, IfDx>, std::integral_constant<int, Else>>;
  static constexpr int KI = Pick<N, P>::value;  ///< the row operand's size
  static constexpr int KO = Pick<P, N>::value;  ///< result columns
  static constexpr int OC = KO / CG;            ///< result columns per thread
  static constexpr int LDO = KO + 1;            ///< row stride of [BK, KO] tiles

  Tensor4<const T, ExecSpace> dy;           ///< [B, L, H, P]
  SsdSkip<ExecSpace, T> skip;               ///< D (dx)
  ChunkStates<const T, ExecSpace> states;   ///< H_c (dC)
  ChunkStates<const T, ExecSpace> dstates;  ///< dH_{c+1} (dx, dB)
  SsdGradients<ExecSpace, T> g;             ///< dx, dBh or dCh
  SsdStepSums<ExecSpace> sums;              ///< row_a, sx, sd (dx); dcum (dC)
  /// (dx) C·Bᵀ per chunk and group (SsdChunkScoresGpuKernel), or empty:
  /// B_j·C_i computed here.
  ChunkScores<const T, ExecSpace> scores;

  struct Work {
    double* cum;  ///< [pad(Q)]
    int* seg;     ///< [pad(Q)]
    T* ut;        ///< Uᵀ [KI, LDR]
    T* tile;      ///< an S or Z tile [BK, LDO], or U'ᵀ [KI, LDK]
    T* wt;        ///< Wᵀ [BK, LDR]; the row sums' partials [2, BR, CG]
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s, int Q) {
    static_assert(BK * LDR >= 2 * BR * CG, "the row sums' partials fit in Wᵀ");
    Work w;
    w.cum = s.take<double>(Base::Shape::pad(Q));
    w.seg = s.take<int>(Base::Shape::pad(Q));
    w.ut = s.take<T>(KI * LDR);
    w.tile = s.take<T>(KI * LDK > BK * LDO ? KI * LDK : BK * LDO);
    w.wt = s.take<T>(BK * LDR);
    return w;
  }

  // The operands at chunk step s (chunk-relative), element q or o.
  KOKKOS_INLINE_FUNCTION T row_operand(const Chunk& k, int s, int q) const {  // U
    if constexpr (Which == SsdGradient::dx) {
      return this->Bm(k.b, k.t0 + s, k.g, q);
    } else if constexpr (Which == SsdGradient::dB) {
      return this->xt(k, s, q);
    } else {
      return dy(k.b, k.t0 + s, k.h, q);
    }
  }
  KOKKOS_INLINE_FUNCTION T partner(const Chunk& k, int s, int q) const {  // U'
    if constexpr (Which == SsdGradient::dx) {
      return this->Cm(k.b, k.t0 + s, k.g, q);
    } else if constexpr (Which == SsdGradient::dB) {
      return dy(k.b, k.t0 + s, k.h, q);
    } else {
      return this->xt(k, s, q);
    }
  }
  KOKKOS_INLINE_FUNCTION T right(const Chunk& k, int s, int o) const {  // Z
    if constexpr (Which == SsdGradient::dx) {
      return dy(k.b, k.t0 + s, k.h, o);
    } else if constexpr (Which == SsdGradient::dB) {
      return this->Cm(k.b, k.t0 + s, k.g, o);
    } else {
      return this->Bm(k.b, k.t0 + s, k.g, o);
    }
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    int block = 0;
    const Chunk k = this->chunk_of(item, block);
    const int r_begin = block * BR;
    const int rows = k.n - r_begin < BR ? k.n - r_begin : BR;
    if (rows <= 0) return;  // past a short last chunk: the whole team
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver, this->Q);
    // dend needs cum_last; the lower sum only the steps up to the block's.
    const int span = Base::Shape::pad(kUpper ? k.n : r_begin + rows);
    this->scan_decays(team, k, span, w.cum, w.seg);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BR * KI), [&](int e) {
      const int r = e / KI, q = e % KI;
      w.ut[q * LDR + r] = r < rows ? row_operand(k, r_begin + r, q) : T(0);
    });
    kdnn::impl::ThreadRegisters<T, NT, RM * OC, Base::kPrivate> acc;
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int e = 0; e < RM * OC; ++e) acc(t)[e] = T(0);
    });

    state_term(team, k, w, acc);
    if constexpr (Which != SsdGradient::dB) {
      // X̃·(B·dHᵀ) or C·(dY·H) of each row, before the scale.
      row_sums(team, w, acc, rows, [&](int r, int o) -> T {
        if constexpr (kDx) {
          return this->xt(k, r_begin + r, o);
        } else {
          return this->Cm(k.b, k.t0 + r_begin + r, k.g, o);
        }
      });
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
        const double v = double(scale(k, w, r_begin + r)) * sum_of_row(w.wt, r);
        (kDx ? sums.row_a : sums.dcum)(k.b, k.h, k.t0 + r_begin + r) = v;
      });
    }
    Base::threads(team, [&](int t) {
      const int r0 = (t / CG) * RM;
      KDNN_IMPL_UNROLL
      for (int i = 0; i < RM; ++i) {
        const T f = scale(k, w, r_begin + r0 + i);
        KDNN_IMPL_UNROLL
        for (int j = 0; j < OC; ++j) acc(t)[i * OC + j] *= f;
      }
    });
    diagonal_term(team, k, w, r_begin, rows, acc);
    store(team, k, w, r_begin, rows, acc);
  }

  /// dend_r (rows j) or e_r (rows i).
  KOKKOS_INLINE_FUNCTION static T scale(const Chunk& k, const Work& w, int r) {
    if constexpr (kUpper) {
      return Base::leaving(w.cum, w.seg, r, k.n - 1);
    } else {
      return Base::entering(w.cum, w.seg, r);
    }
  }

  /// acc = U·S over KI in tiles of BK rows of S: dH [N, P] as stored (dx),
  /// or dH, H as [P, N] (read down the stored rows, so that a warp reads
  /// consecutive p).
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void state_term(const Member& team, const Chunk& k, const Work& w,
                                         Acc& acc) const {
    const T* s = Which == SsdGradient::dC ? &states(k.b, k.h, k.c, 0) : &dstates(k.b, k.h, k.c, 0);
    for (int q0 = 0; q0 < KI; q0 += BK) {
      team.team_barrier();  // Uᵀ is complete, the previous tile done with
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * KO), [&](int e) {
        if constexpr (kDx) {
          const int q = e / KO, o = e % KO;
          w.tile[q * LDO + o] = s[(q0 + q) * P + o];
        } else {
          const int q = e % BK, o = e / BK;
          w.tile[q * LDO + o] = s[o * P + q0 + q];
        }
      });
      team.team_barrier();
      Base::threads(team, [&](int t) {
        Base::template add_product<OC, LDO>(w.ut + q0 * LDR + (t / CG) * RM, LDR, w.tile, t % CG,
                                            acc(t));
      });
    }
  }

  /// acc += Σ_s (U_r·U'_s)·m·Z_s over the partner steps s, in tiles of BK.
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void diagonal_term(const Member& team, const Chunk& k, const Work& w,
                                            int r_begin, int rows, Acc& acc) const {
    const int first = kUpper ? r_begin : 0, end = kUpper ? k.n : r_begin + rows;
    for (int s0 = first; s0 < end; s0 += BK) {
      const int cols = k.n - s0 < BK ? k.n - s0 : BK;
      team.team_barrier();                // Uᵀ, cum and the row sums are done with
      if (kDx && scores.extent(0) > 0) {  // B_j·C_i = CB[i][j], the group's
        const T* cb = &scores(this->scores_row(k.b, k.c, k.g), 0);
        Base::threads(team, [&](int t) {
          Base::template stored_weights<kUpper, true>(t, cb, scores_ld<T>(this->Q), w.cum, w.seg,
                                                      r_begin, s0, k.n, w.wt);
        });
      } else {
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * KI), [&](int e) {
          const int s = e / KI, q = e % KI;
          w.tile[q * LDK + s] = s < cols ? partner(k, s0 + s, q) : T(0);
        });
        team.team_barrier();
        Base::threads(team, [&](int t) {
          Base::template decay_weights<KI, kUpper>(t, w.ut, w.tile, w.cum, w.seg, r_begin, s0, k.n,
                                                   w.wt);
        });
      }
      team.team_barrier();  // every thread is done reading U'ᵀ
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK * KO), [&](int e) {
        const int s = e / KO, o = e % KO;
        w.tile[s * LDO + o] = s < cols ? right(k, s0 + s, o) : T(0);
      });
      team.team_barrier();
      Base::threads(team, [&](int t) {
        Base::template add_product<OC, LDO>(w.wt + (t / CG) * RM, LDR, w.tile, t % CG, acc(t));
      });
    }
    team.team_barrier();  // Wᵀ is free for the row sums
  }

  /// The result rows: dx = dt·dX̃ + D·dy with sx and sd, or dB, dC.
  template <class Acc>
  KOKKOS_INLINE_FUNCTION void store(const Member& team, const Chunk& k, const Work& w, int r_begin,
                                    int rows, Acc& acc) const {
    if constexpr (kDx) {
      const SkipRow<T> skip_h = skip.row(k.h, P);
      T* sx = w.wt;
      T* sd = w.wt + BR * CG;
      Base::threads(team, [&](int t) {
        const int r0 = (t / CG) * RM, c = t % CG;
        KDNN_IMPL_UNROLL
        for (int i = 0; i < RM; ++i) {
          const int r = r0 + i;
          T px = 0, pd = 0;
          if (r < rows) {
            const int step = k.t0 + r_begin + r;
            const T dti = this->dt(k.b, step, k.h);
            const T* xr = &this->x(k.b, step, k.h, 0);
            const T* dyr = &dy(k.b, step, k.h, 0);
            T* out = &g.dx(k.b, step, k.h, 0);
            KDNN_IMPL_UNROLL
            for (int j = 0; j < OC; ++j) {
              const int p = c + CG * j;
              const T dxt = acc(t)[i * OC + j];  // dX̃
              out[p] = dti * dxt + skip_h.at(p) * dyr[p];
              px += xr[p] * dxt;
              pd += dyr[p] * xr[p];
            }
          }
          sx[r * CG + c] = px;
          sd[r * CG + c] = pd;
        }
      });
      team.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
        const int step = k.t0 + r_begin + r;
        sums.sx(k.b, k.h, step) = sum_of_row(sx, r);
        sums.sd(k.b, k.h, step) = sum_of_row(sd, r);
      });
    } else {
      const auto& out = Which == SsdGradient::dB ? g.dBh : g.dCh;
      Base::threads(team, [&](int t) {
        const int r0 = (t / CG) * RM, c = t % CG;
        KDNN_IMPL_UNROLL
        for (int i = 0; i < RM; ++i) {
          if (r0 + i >= rows) continue;
          T* o = &out(k.b, k.t0 + r_begin + r0 + i, k.h, 0);
          KDNN_IMPL_UNROLL
          for (int j = 0; j < OC; ++j) o[c + CG * j] = acc(t)[i * OC + j];
        }
      });
    }
  }

  /// Each thread's partial Σ_o acc·y(r, o) over its columns into
  /// w.wt[r·CG + c] for the block's rows r < rows (y is read only there; a
  /// barrier must follow).
  template <class Acc, class Y>
  KOKKOS_INLINE_FUNCTION void row_sums(const Member& team, const Work& w, Acc& acc, int rows,
                                       const Y& y) const {
    Base::threads(team, [&](int t) {
      const int r0 = (t / CG) * RM, c = t % CG;
      KDNN_IMPL_UNROLL
      for (int i = 0; i < RM; ++i) {
        T part = 0;
        if (r0 + i < rows) {
          KDNN_IMPL_UNROLL
          for (int j = 0; j < OC; ++j) part += acc(t)[i * OC + j] * y(r0 + i, c + CG * j);
        }
        w.wt[(r0 + i) * CG + c] = part;
      }
    });
  }
  /// The column groups' partials of row r, added in order.
  KOKKOS_INLINE_FUNCTION static double sum_of_row(const T* partials, int r) {
    T s = 0;
    for (int c = 0; c < CG; ++c) s += partials[r * CG + c];
    return double(s);
  }
};

}  // namespace kdnn::ssm::impl
