// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The GPU forms of the SSD's chunk kernels (kdnn::KernelForm::gpu: the
// forward's two, ssd_chunk_state_gpu_kernel.hpp and
// ssd_chunk_output_gpu_kernel.hpp, and the backward's chunk dstates) for
// compile-time P and N in {64, 128}: what they share. Notation as in
// ssd_chunks.hpp.
//
// A team owns a block of BR rows of one chunk's result (BR steps of its
// output, or BR rows n of its state) and streams the operands it needs
// through level-0 scratch in tiles of BK items. Its NT = 128 threads form a
// grid of RG = 16 row groups × CG = 8 column groups; thread (g, c) keeps the
// RM rows g·RM … of the block and the PC = P / 8 columns c, c + 8, … in
// registers for the whole walk (interleaved columns: the 8 column groups
// read 8 consecutive words of a tile row, distinct banks, and write 8
// consecutive values of a result row). Tiles whose rows are read down a
// column have a row stride of BR + 1 or BK + 1 words, so that the threads
// that fill them along a source row (coalesced global reads) hit distinct
// banks. The chunk's cumulative log-decays (and sequence starts) are team
// scans into scratch.
// Every sum is in a fixed order, no atomics; the products sum over other
// blocks than team_gemm, so these forms agree with the host forms to
// rounding, not bitwise.
//
// Scratch per team, at most (float: BR = BK = 32; double: 16): cum and seg
// (12·Q bytes, Q ≤ kSsdGpuMaxChunk), the chunk-state kernel's step factors
// (Q values) and three tiles of at most N·(BK + 1) values: under 43 KiB in
// float and double at P = N = 128, Q = 256, within the 48 KiB a CUDA team
// gets on-chip (tested).
#include <Kokkos_Core.hpp>
#include <type_traits>

#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/compiled_sizes.hpp"
#include "kdnn/core/impl/register_team.hpp"
#include "kdnn/core/impl/register_tile.hpp"
#include "kdnn/core/impl/unroll.hpp"
#include "kdnn/ssm/impl/ssd_chunks.hpp"

namespace kdnn::ssm::impl {

/// The head sizes P and state sizes N the GPU forms are compiled for.
using SsdGpuSizes = kdnn::impl::CompiledSizes<64, 128>;

/// The longest chunk the GPU forms take (its cumulative decays in scratch).
constexpr int kSsdGpuMaxChunk = 256;

/// Result rows per team of the GPU forms (the same for every P and N).
template <class T>
constexpr int kSsdGpuRows = sizeof(T) > 4 ? 16 : 32;

/// n rounded up to whole blocks of kSsdGpuRows<T>.
template <class T>
KOKKOS_INLINE_FUNCTION constexpr int ssd_gpu_pad(int n) {
  return (n + kSsdGpuRows<T> - 1) / kSsdGpuRows<T> * kSsdGpuRows<T>;
}

/// The row stride of a chunk's stored products (ChunkScores) for chunks of
/// Q steps: Q rounded up to whole tiles of the GPU forms.
template <class T>
KOKKOS_INLINE_FUNCTION constexpr int scores_ld(int Q) {
  return ssd_gpu_pad<T>(Q);
}

/// Block sizes and the thread grid of the GPU forms (see above).
template <class T, int P, int N>
struct SsdGpuShape {
  static constexpr int BR = kSsdGpuRows<T>;  ///< result rows per team
  static constexpr int BK = BR;              ///< items per streamed tile
  static constexpr int RM = BR / 16;         ///< result rows per thread
  static constexpr int RG = BR / RM;         ///< row groups (16)
  static constexpr int CG = 8;               ///< column groups
  static constexpr int NT = RG * CG;         ///< threads per team
  static constexpr int RN = BK / CG;         ///< streamed items per thread
  static constexpr int PC = P / CG;          ///< result columns per thread
  static constexpr int LDR = BR + 1;         ///< row stride of [·, BR] tiles
  static constexpr int LDK = BK + 1;         ///< row stride of [·, BK] tiles
  static_assert(N % BR == 0 && P % CG == 0 && N % kdnn::impl::kGemmKBlock == 0, "SsdGpuShape");
  /// n rounded up to a multiple of BK.
  KOKKOS_INLINE_FUNCTION static constexpr int pad(int n) { return ssd_gpu_pad<T>(n); }
};

/// What every GPU chunk kernel shares: the shape, the work items (chunk and
/// row block) and the decays' scan (the team and its launch body:
/// RegisterTeam). Derived provides `one_block(team, item, scratch)` and
/// `carve(s, Q)`.
template <class Derived, class ExecSpace, class T, int P, int N>
struct SsdGpuChunks : SsdChunks<ExecSpace, T>,
                      kdnn::impl::RegisterTeam<Derived, ExecSpace, SsdGpuShape<T, P, N>::NT> {
  using Base = SsdChunks<ExecSpace, T>;
  using Shape = SsdGpuShape<T, P, N>;
  using Team = kdnn::impl::RegisterTeam<Derived, ExecSpace, Shape::NT>;
  using Chunk = typename Base::Chunk;
  using Team::kPrivate;
  using Team::threads;
  using typename Base::Member;
  static constexpr int BR = Shape::BR, BK = Shape::BK, RM = Shape::RM, CG = Shape::CG,
                       NT = Shape::NT, RN = Shape::RN, PC = Shape::PC, LDR = Shape::LDR,
                       LDK = Shape::LDK;
  int blocks = 1;  ///< row blocks per chunk

  long long teams() const { return (long long)Base::league() * blocks; }

  /// The chunk and the row block of work item `item`.
  KOKKOS_INLINE_FUNCTION Chunk chunk_of(int item, int& block) const {
    block = item % blocks;
    return this->chunk(item / blocks);
  }

  /// cum[i] = Σ_{k ≤ i} log_decay(dt_k) in double and seg[i] = the
  /// sequence starts among steps 0 … i (ssd_chunks.hpp) for i < count (steps
  /// past the chunk add 0, so they repeat its last values), ready after the
  /// caller's next barrier. A team scan; with packed sequences, whose cum
  /// restarts at each start, one thread's loop (SsdChunks::scan_steps, as
  /// the host forms scan).
  KOKKOS_INLINE_FUNCTION void scan_decays(const Member& team, const Chunk& k, int count,
                                          double* cum, int* seg) const {
    if (this->has_seq) {
      Kokkos::single(Kokkos::PerTeam(team),
                     [&]() { this->scan_steps(k, count, cum, seg, static_cast<T*>(nullptr)); });
      return;
    }
    const double a = double(this->A(k.h));
    Kokkos::parallel_scan(Kokkos::TeamThreadRange(team, count),
                          [&](int i, double& partial, const bool final) {
                            if (i < k.n)
                              partial += Base::log_decay(this->dt(k.b, k.t0 + i, k.h), a);
                            if (final) cum[i] = partial;
                          });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count), [&](int i) { seg[i] = 0; });
  }

  /// tile[m·LD + r] = u(b, t0 + r0 + r, g, m) for r < count, 0 for
  /// count ≤ r < R: R steps of chunk k's B or C ([B, L, G, N]) transposed
  /// into scratch [N, LD] (LDR for a block's rows, LDK for a tile's steps),
  /// each step's row read coalesced.
  template <int R, int LD, class View>
  static KOKKOS_INLINE_FUNCTION void load_steps_transposed(const Member& team, const View& u,
                                                           const Chunk& k, int r0, int count,
                                                           T* tile) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, R * N), [&](int e) {
      const int r = e / N, m = e % N;
      tile[m * LD + r] = r < count ? u(k.b, k.t0 + r0 + r, k.g, m) : T(0);
    });
  }

  /// tile[r·LD + c] = factor(r)·source[r·stride + c] for r < count, 0 for
  /// count ≤ r < R, c < W: R rows of W values (a tile of steps' rows of x or
  /// dy, or of a state's rows) into scratch as they lie, each row read
  /// coalesced.
  template <int R, int W, int LD, class Factor>
  static KOKKOS_INLINE_FUNCTION void load_rows(const Member& team, const T* source,
                                               std::size_t stride, int count, const Factor& factor,
                                               T* tile) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, R * W), [&](int e) {
      const int r = e / W, c = e % W;
      tile[r * LD + c] = r < count ? factor(r) * source[r * stride + c] : T(0);
    });
  }

  /// acc[i·C + j] += Σ_{s<BK} a[s·a_k + i]·rows[s·LD + c + CG·j]: the
  /// thread's RM × C block (rows at `a`, column group c) of a product whose
  /// right operand is a [BK, ·] tile of row stride LD (by default [BK, P]).
  template <int C = PC, int LD = P>
  static KOKKOS_FORCEINLINE_FUNCTION void add_product(const T* a, int a_k, const T* rows, int c,
                                                      T* acc) {
    T part[RM * C];
    kdnn::impl::register_tile_product<RM, C, BK>(a, a_k, 1, rows + c, LD, CG, part);
    KDNN_IMPL_UNROLL
    for (int e = 0; e < RM * C; ++e) acc[e] += part[e];
  }

  /// Thread t's RM × RN micro-tile of the decay-weighted products of a
  /// block's rows and a tile's steps, transposed into wt [BK, LDR]:
  /// wt[s·LDR + r] = (U_r·V_s)·m, U and V given k-major (Uᵀ [K, LDR] at
  /// `rows`, Vᵀ [K, LDK] at `cols`), r counted from r_first and s from
  /// s_first in the chunk of n steps; m = m_rs (r the later step), or m_sr
  /// with `Upper`, and 0 outside the causal triangle and the chunk.
  template <int K, bool Upper>
  static KOKKOS_FORCEINLINE_FUNCTION void decay_weights(int t, const T* rows, const T* cols,
                                                        const double* cum, const int* seg,
                                                        int r_first, int s_first, int n, T* wt) {
    T uv[RM * RN];
    micro_product<K>(t, rows, cols, uv);
    weigh<Upper>(t, uv, cum, seg, r_first, s_first, n, wt);
  }

  /// Thread t's RM × RN micro-tile uv of U·Vᵀ (operands as decay_weights
  /// takes them): rows r0 … r0 + RM of the block, steps c0 … c0 + RN of the
  /// tile, (r0, c0) = (micro_row(t), micro_col(t)).
  template <int K>
  static KOKKOS_FORCEINLINE_FUNCTION void micro_product(int t, const T* rows, const T* cols,
                                                        T* uv) {
    const int r0 = micro_row(t), c0 = micro_col(t);
    kdnn::impl::register_tile_product<RM, RN, K>(rows + r0, LDR, 1, cols + c0, LDK, 1, uv);
  }
  static KOKKOS_FORCEINLINE_FUNCTION int micro_row(int t) { return (t / CG) * RM; }
  static KOKKOS_FORCEINLINE_FUNCTION int micro_col(int t) { return (t % CG) * RN; }

  /// decay_weights with U_r·V_s read from a chunk's stored scores C·Bᵀ
  /// (SsdChunkScoresGpuKernel, row stride ld) instead of computed: cb[r][s],
  /// or cb[s][r] if Transposed (r and s counted in the chunk).
  template <bool Upper, bool Transposed>
  static KOKKOS_FORCEINLINE_FUNCTION void stored_weights(int t, const T* cb, int ld,
                                                         const double* cum, const int* seg,
                                                         int r_first, int s_first, int n, T* wt) {
    const int r0 = micro_row(t), c0 = micro_col(t);
    T uv[RM * RN];
    KDNN_IMPL_UNROLL
    for (int i = 0; i < RM; ++i) {
      KDNN_IMPL_UNROLL
      for (int j = 0; j < RN; ++j) {
        const int r = r_first + r0 + i, s = s_first + c0 + j;
        uv[i * RN + j] = Transposed ? cb[s * ld + r] : cb[r * ld + s];
      }
    }
    weigh<Upper>(t, uv, cum, seg, r_first, s_first, n, wt);
  }

  /// decay_weights' second half: thread t's micro-tile uv of products,
  /// weighted by the decays and masked, into wt.
  template <bool Upper>
  static KOKKOS_FORCEINLINE_FUNCTION void weigh(int t, const T* uv, const double* cum,
                                                const int* seg, int r_first, int s_first, int n,
                                                T* wt) {
    const int r0 = micro_row(t), c0 = micro_col(t);
    KDNN_IMPL_UNROLL
    for (int i = 0; i < RM; ++i) {
      KDNN_IMPL_UNROLL
      for (int j = 0; j < RN; ++j) {
        const int r = r_first + r0 + i, s = s_first + c0 + j;
        const int later = Upper ? s : r, earlier = Upper ? r : s;
        wt[(c0 + j) * LDR + r0 + i] = Base::masked(
            later, earlier, n, uv[i * RN + j] * Base::decay_mask(cum, seg, later, earlier, n));
      }
    }
  }
};

}  // namespace kdnn::ssm::impl
