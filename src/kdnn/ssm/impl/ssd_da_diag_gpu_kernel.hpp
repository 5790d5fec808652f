// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The Y_diag part of the gradient of each step's log-decay, GPU form
// (ssd_gpu_chunks.hpp; the host form is SsdDiagBackwardKernel's):
//
//   da_diag_k = Σ_{i≥k} Σ_{j<k} R_ij,   R_ij = (C_i·B_j)·(dY_i·X̃_j)·m_ij  (j ≤ i),
//
// the pairs whose decay crosses step k, summed directly (as the host form:
// no difference of large row and column sums). It needs no chunk state, so
// the context-parallel backward runs it while the ranks exchange theirs.
//
// A team owns a chunk and walks its row blocks I (BR steps i from i0) from
// the last to the first, and in each the tiles of BK steps j ≤ i0 + BR − 1:
// each thread keeps its RM × RN micro-tiles of C·Bᵀ and dY·X̃ᵀ in registers,
// their sums over N and P taken in slices of BK (two slice tiles in
// scratch), and writes R to scratch. For k in block I,
//
//   da_diag_k = Σ_{i∈I, i≥k} (roff_i + Σ_{i0≤j<k} R_ij) + Σ_{j<k} CS_j,
//
// roff_i = Σ_{j<i0} R_ij (the row sums of the block's tiles left of its
// diagonal one) and CS_j the column sums of R over the blocks after I (all
// of whose steps are ≥ k), added block by block. Every sum is in double and
// in a fixed order, no atomics.
#include "kdnn/ssm/impl/ssd_gpu_chunks.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T, int P, int N>
struct SsdDaDiagGpuKernel
    : SsdGpuChunks<SsdDaDiagGpuKernel<ExecSpace, T, P, N>, ExecSpace, T, P, N> {
  using Base = SsdGpuChunks<SsdDaDiagGpuKernel, ExecSpace, T, P, N>;
  using Chunk = typename Base::Chunk;
  using Base::BK;
  using Base::BR;
  using Base::CG;
  using Base::LDK;
  using Base::LDR;
  using Base::NT;
  using Base::RM;
  using Base::RN;
  using typename Base::Member;
  Tensor4<const T, ExecSpace> dy;  ///< [B, L, H, P]
  Kokkos::View<double***, Kokkos::LayoutRight, typename ExecSpace::memory_space>
      da_diag;  ///< [B, H, L]
  /// The tensor-core form's C·Bᵀ per group and dY·X̃ᵀ per head
  /// (ssd_chunk_scores_mma_kernel.hpp), or empty: computed here.
  ChunkScores<const T, ExecSpace> cb, dy_xt;

  struct Work {
    double *cum, *cs;    ///< [pad(Q)]: decays, CS
    int* seg;            ///< [pad(Q)]: sequence starts
    double *pre, *roff;  ///< [BR]: Σ_{j<k} CS_j of the block's k, roff
    T* rows;             ///< a slice of the block's C or dY, transposed [BK, LDR]
    T* cols;             ///< a slice of the tile's B or X̃, transposed [BK, LDK]
    T* r;                ///< R of the tile [BR, LDK]
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s, int Q) {
    static_assert(BR == BK, "row blocks and column tiles align (the diagonal tile)");
    Work w;
    w.cum = s.take<double>(Base::Shape::pad(Q));
    w.seg = s.take<int>(Base::Shape::pad(Q));
    w.cs = s.take<double>(Base::Shape::pad(Q));
    w.pre = s.take<double>(BR);
    w.roff = s.take<double>(BR);
    w.rows = s.take<T>(BK * LDR);
    w.cols = s.take<T>(BK * LDK);
    w.r = s.take<T>(BR * LDK);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    int unused = 0;
    const Chunk k = this->chunk_of(item, unused);
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver, this->Q);
    const int span = Base::Shape::pad(k.n);
    this->scan_decays(team, k, span, w.cum, w.seg);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, span), [&](int j) { w.cs[j] = 0; });
    for (int i0 = (k.n - 1) / BR * BR; i0 >= 0; i0 -= BR) {
      const int rows = k.n - i0 < BR ? k.n - i0 : BR;
      team.team_barrier();  // CS holds the later blocks' sums
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BR), [&](int r) {
        double before = 0;
        for (int j = 0; j < i0 + r; ++j) before += w.cs[j];
        w.pre[r] = before;
        w.roff[r] = 0;
      });
      for (int j0 = 0; j0 <= i0; j0 += BK) {
        tile(team, k, w, i0, j0);
        if (j0 < i0) {  // left of the diagonal: every j < k for the block's k
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
            double v = 0;
            for (int s = 0; s < BK; ++s) v += double(w.r[r * LDK + s]);
            w.roff[r] += v;
          });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BK), [&](int s) {
            double v = 0;
            for (int r = 0; r < rows; ++r) v += double(w.r[r * LDK + s]);
            w.cs[j0 + s] += v;
          });
        } else {  // the diagonal tile: the crossing sums of the block's k
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int kk) {
            double v = w.pre[kk];
            for (int r = kk; r < rows; ++r) {
              v += w.roff[r];
              for (int s = 0; s < kk; ++s) v += double(w.r[r * LDK + s]);
            }
            da_diag(k.b, k.h, k.t0 + i0 + kk) = v;
          });
        }
      }
    }
  }

  /// R of rows i0 … and columns j0 … into w.r (a barrier follows).
  KOKKOS_INLINE_FUNCTION void tile(const Member& team, const Chunk& k, const Work& w, int i0,
                                   int j0) const {
    if (cb.extent(0) > 0) {
      stored_tile(team, k, w, i0, j0);
      return;
    }
    constexpr int M = RM * RN;
    kdnn::impl::ThreadRegisters<T, NT, 2 * M, Base::kPrivate> acc;  // C·Bᵀ, then dY·X̃ᵀ
    Base::threads(team, [&](int t) {
      KDNN_IMPL_UNROLL
      for (int e = 0; e < 2 * M; ++e) acc(t)[e] = T(0);
    });
    const auto products = [&](int size, int offset, const auto& row_value, const auto& col_value) {
      for (int q0 = 0; q0 < size; q0 += BK) {
        team.team_barrier();  // the previous slices and R are done with
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BR * BK), [&](int e) {
          const int r = e / BK, q = e % BK;
          w.rows[q * LDR + r] = i0 + r < k.n ? row_value(i0 + r, q0 + q) : T(0);
          w.cols[q * LDK + r] = j0 + r < k.n ? col_value(j0 + r, q0 + q) : T(0);
        });
        team.team_barrier();
        Base::threads(team, [&](int t) {
          T part[M];
          kdnn::impl::register_tile_product<RM, RN, BK>(w.rows + (t / CG) * RM, LDR, 1,
                                                        w.cols + (t % CG) * RN, LDK, 1, part);
          KDNN_IMPL_UNROLL
          for (int e = 0; e < M; ++e) acc(t)[offset + e] += part[e];
        });
      }
    };
    const auto at = [&](int s) { return k.t0 + s; };
    products(
        N, 0, [&](int i, int n) { return this->Cm(k.b, at(i), k.g, n); },
        [&](int j, int n) { return this->Bm(k.b, at(j), k.g, n); });
    products(
        P, M, [&](int i, int p) { return dy(k.b, at(i), k.h, p); },
        [&](int j, int p) { return this->dt(k.b, at(j), k.h) * this->x(k.b, at(j), k.h, p); });
    Base::threads(team, [&](int t) {
      const int r0 = (t / CG) * RM, c0 = (t % CG) * RN;
      KDNN_IMPL_UNROLL
      for (int a = 0; a < RM; ++a) {
        KDNN_IMPL_UNROLL
        for (int b = 0; b < RN; ++b) {
          const int i = i0 + r0 + a, j = j0 + c0 + b, e = a * RN + b;
          const T v = acc(t)[M + e] * Base::decay_mask(w.cum, w.seg, i, j, k.n);
          w.r[(r0 + a) * LDK + c0 + b] = Base::masked(i, j, k.n, acc(t)[e] * v);
        }
      }
    });
    team.team_barrier();
  }

  /// tile() from the stored products: the same values, rounded as there
  /// (R = CB·(V·m)), along the rows of both for coalesced reads.
  KOKKOS_INLINE_FUNCTION void stored_tile(const Member& team, const Chunk& k, const Work& w, int i0,
                                          int j0) const {
    const T* c = &cb(this->scores_row(k.b, k.c, k.g), 0);
    const T* v = &dy_xt(this->head_scores_row(k.b, k.c, k.h), 0);
    const int ld = scores_ld<T>(this->Q);
    team.team_barrier();  // the previous R is done with
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, BR * BK), [&](int e) {
      const int i = i0 + e / BK, j = j0 + e % BK;
      w.r[(e / BK) * LDK + e % BK] =
          j <= i && i < k.n
              ? c[i * ld + j] * (v[i * ld + j] * Base::decay_mask(w.cum, w.seg, i, j, k.n))
              : T(0);
    });
    team.team_barrier();
  }
};

}  // namespace kdnn::ssm::impl
