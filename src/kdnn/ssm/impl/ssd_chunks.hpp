// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The team kernels of the chunked SSD (ssd.hpp). A team owns one chunk: batch
// entry b, head h, steps [t0, t0 + n), n ≤ Q. Its scratch holds the chunk's
// operands as tiles padded to GemmTile multiples (pad rows and columns 0,
// pad steps with dt = 0, so that they add nothing), the products come from
// kdnn::impl::team_gemm, and every loop over a tile row is a vector loop.
//
// Notation (per chunk): X̃ = dt·x [Q×P], a_i = dt_i·A, cum_i = Σ_{k≤i} a_k (in
// double), e_i = exp(cum_i), dend_i = exp(cum_last − cum_i),
// m_ij = exp(cum_i − cum_j) for j ≤ i (else 0), CB = C·Bᵀ [Q×Q].
//
// Packed sequences (seq_idx): a step whose id differs from the previous
// step's starts a sequence, and no decay crosses a start. seg_i counts the
// starts in the chunk up to step i (0 without seq_idx), and each decay is
// 0 where it would cross one: m_ij unless seg_i = seg_j, e_i (from the
// state entering the chunk) unless seg_i = 0, dend_j unless seg_j =
// seg_last, the chunk's whole decay unless seg_last = 0. cum restarts at
// each start, so that a sequence's decays are sums of its own steps only
// (never rounded beside another's). Every gradient term is built from these
// factors, so the log-decay of a start (which only decays a state the start
// discards) gets a gradient of exactly 0.
// Chunk states are stored transposed, [N, P] (n-major), so that they are
// the row-major right operand of C·Hᵀ.
//
// This file: the per-chunk buffers between the kernels and SsdChunks, the
// base every chunk kernel derives from (inputs, tiling, the chunk's loads).
// Each kernel is in a file of its own (ssd_*_kernel.hpp).
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/exp_vectorisable.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/team_gemm.hpp"
#include "kdnn/core/impl/team_work.hpp"
#include "kdnn/core/impl/vector_for.hpp"
#include "kdnn/core/tensor.hpp"

namespace kdnn::ssm::impl {

/// Per-chunk buffers between the kernels: [B, H, chunks (+1), N·P].
template <class T, class ExecSpace>
using ChunkStates = Kokkos::View<T****, Kokkos::LayoutRight, typename ExecSpace::memory_space>;

/// Per-chunk products of the steps with each other: C·Bᵀ of each group
/// [B·chunks·G, pad(Q)²] (ssd_chunk_scores_gpu_kernel.hpp), or dY·X̃ᵀ of
/// each head [B·chunks·H, pad(Q)²] (ssd_chunk_scores_mma_kernel.hpp).
template <class T, class ExecSpace>
using ChunkScores = Kokkos::View<T**, Kokkos::LayoutRight, typename ExecSpace::memory_space>;

/// What every SSD chunk kernel shares: the inputs, the tiling and the loads.
template <class ExecSpace, class T>
struct SsdChunks {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Tile = kdnn::impl::GemmTile<ExecSpace, T>;
  using GemmA = kdnn::impl::GemmA<T>;

  Tensor4<const T, ExecSpace> x;     ///< [B, L, H, P]
  Tensor3<const T, ExecSpace> dt;    ///< [B, L, H]
  Vector<const T, ExecSpace> A;      ///< [H]
  Tensor4<const T, ExecSpace> Bm;    ///< [B, L, G, N]
  Tensor4<const T, ExecSpace> Cm;    ///< [B, L, G, N]
  Matrix<const int, ExecSpace> seq;  ///< [B, L] seq_idx (packed sequences) or empty
  bool has_seq = false;              ///< seq given
  int Q = 1, chunks = 0;             ///< steps per chunk, chunks per sequence
  int Qp = 0, Pp = 0, Np = 0;        ///< Q, P, N padded to Tile::align
  kdnn::impl::TeamWork work;         ///< set by the launch
  Launch launch;                     ///< the caller's request (SsdOptions::launch)

  KOKKOS_INLINE_FUNCTION int P() const { return int(x.extent(3)); }
  KOKKOS_INLINE_FUNCTION int N() const { return int(Bm.extent(3)); }

  /// Sets chunks and the padded sizes from the inputs and Q.
  /// Q = min(chunk, L) (at least 1): a chunk longer than the sequence is one
  /// chunk of L steps, and nothing is sized by a larger Q.
  void set_sizes(int chunk) {
    const int L = int(x.extent(1));
    Q = chunk < L ? chunk : L > 0 ? L : 1;
    chunks = L == 0 ? 0 : (L - 1) / Q + 1;
    Qp = Tile::pad(Q);
    Pp = Tile::pad(int(x.extent(3)));
    Np = Tile::pad(int(Bm.extent(3)));
  }
  int league() const { return int(x.extent(0)) * int(x.extent(2)) * chunks; }

  struct Chunk {
    int b, h, g, c, t0, n;
  };
  KOKKOS_INLINE_FUNCTION Chunk chunk(int item) const {
    const int H = int(x.extent(2)), G = int(Bm.extent(2)), L = int(x.extent(1));
    const int c = item % chunks, bh = item / chunks;
    const int b = bh / H, h = bh % H, t0 = c * Q;
    return {b, h, h / (H / G), c, t0, L - t0 < Q ? L - t0 : Q};
  }

  /// The chunk of a kernel with one work item per (b, g, chunk) (c
  /// fastest), as chunk() gives it for the group's first head.
  KOKKOS_INLINE_FUNCTION Chunk group_chunk(int item) const {
    const int H = int(x.extent(2)), G = int(Bm.extent(2));
    const int c = item % chunks, bg = item / chunks;
    return chunk((bg / G * H + bg % G * (H / G)) * chunks + c);
  }

  /// The row of a chunk's stored scores C·Bᵀ (ChunkScores, one per (b,
  /// chunk, g)) of batch entry b, chunk c, group g.
  KOKKOS_INLINE_FUNCTION int scores_row(int b, int c, int g) const {
    return (b * chunks + c) * int(Bm.extent(2)) + g;
  }

  /// X̃ = dt·x of chunk k at its step s, element p.
  KOKKOS_INLINE_FUNCTION T xt(const Chunk& k, int s, int p) const {
    const int t = k.t0 + s;
    return dt(k.b, t, k.h) * x(k.b, t, k.h, p);
  }

  /// The row of a chunk's stored per-head products (ChunkScores, one per
  /// (b, chunk, h)) of batch entry b, chunk c, head h.
  KOKKOS_INLINE_FUNCTION int head_scores_row(int b, int c, int h) const {
    return (b * chunks + c) * int(x.extent(2)) + h;
  }

  /// Runs body(k, scratch) for each chunk k of the team's work items, with
  /// the carver of the team's scratch for that item.
  template <class Member, class Body>
  KOKKOS_INLINE_FUNCTION void for_each_chunk(const Member& team, const Body& body) const {
    work.for_each(team, [&](int item, void* scratch) {
      kdnn::impl::ScratchCarver carver(scratch);
      body(chunk(item), carver);
    });
  }

  /// The chunk's decays, computed once per team.
  struct Decays {
    double* cum;  ///< [Qp] cum_i (pad steps repeat the last)
    T* dtv;       ///< [Qp] dt_i (0 for pad steps)
    T* e;         ///< [Qp] exp(cum_i), 0 past a sequence start
    T* dend;      ///< [Qp] exp(cum_last − cum_i), 0 before the last sequence start
    int* seg;     ///< [Qp] seg_i (pad steps repeat the last)
  };
  KOKKOS_INLINE_FUNCTION static Decays carve_decays(kdnn::impl::ScratchCarver& s, int Qp) {
    Decays d;
    d.cum = s.take<double>(Qp);
    d.dtv = s.take<T>(Qp);
    d.e = s.take<T>(Qp);
    d.dend = s.take<T>(Qp);
    d.seg = s.take<int>(Qp);
    return d;
  }

  /// Whether step i of chunk k (i < k.n) starts a sequence: its seq_idx
  /// differs from the previous step's (never without seq_idx, nor at step
  /// 0, which continues the initial state's sequence).
  KOKKOS_INLINE_FUNCTION bool starts(const Chunk& k, int i) const {
    const int t = k.t0 + i;
    return has_seq && t > 0 && seq(k.b, t) != seq(k.b, t - 1);
  }

  /// e_i = exp(cum_i), the decay from the state entering the chunk to step
  /// i: 0 past a start. With i the chunk's last (or a pad) step, the whole
  /// chunk's decay.
  KOKKOS_FORCEINLINE_FUNCTION static T entering(const double* cum, const int* seg, int i) {
    return seg[i] == 0 ? compat::exp(T(cum[i])) : T(0);
  }
  /// dend_j = exp(cum_last − cum_j), the decay from step j to the chunk's
  /// end (`last`: its last step, or a pad step): 0 before the last start.
  KOKKOS_FORCEINLINE_FUNCTION static T leaving(const double* cum, const int* seg, int j, int last) {
    return seg[j] == seg[last] ? compat::exp(T(cum[last] - cum[j])) : T(0);
  }
  /// A step's log-decay dt·A, floored at −kLogDecayFloor. Below the floor
  /// every decay across the step is exp(≤ −1000) = 0 in float and double, as
  /// it is unfloored, so the results are the same; the floor keeps the
  /// cumulative sums finite (dt·A may overflow to −inf) and their
  /// differences exact to double rounding of moderate numbers.
  static constexpr double kLogDecayFloor = 1000;
  KOKKOS_FORCEINLINE_FUNCTION static double log_decay(T dt_value, double a) {
    const double v = double(dt_value) * a;
    return v > -kLogDecayFloor ? v : -kLogDecayFloor;
  }
  /// Whether the step's decay is exactly 0 (log_decay floored): the
  /// gradient of its log-decay is then exactly 0 as well.
  KOKKOS_FORCEINLINE_FUNCTION static bool saturated(T dt_value, double a) {
    return log_decay(dt_value, a) == -kLogDecayFloor;
  }

  /// cum and seg of chunk k's first `count` steps (pad steps add 0, so they
  /// repeat the last values) and, where dtv is given, dt (0 for pad steps):
  /// one thread's loop in step order, cum restarting at each start.
  KOKKOS_INLINE_FUNCTION void scan_steps(const Chunk& k, int count, double* cum, int* seg,
                                         T* dtv) const {
    const double a = double(A(k.h));
    double partial = 0;
    int segment = 0;
    for (int i = 0; i < count; ++i) {
      const T v = i < k.n ? dt(k.b, k.t0 + i, k.h) : T(0);
      if (i < k.n && starts(k, i)) {
        partial = 0;
        ++segment;
      }
      partial += log_decay(v, a);
      if (dtv) dtv[i] = v;
      cum[i] = partial;
      seg[i] = segment;
    }
  }

  /// Fills `d`: cum, seg and dtv are ready on return, e and dend after the
  /// caller's next team barrier. cum is one thread's loop in step order:
  /// these kernels launch with vector lanes, and Kokkos' team scan on CUDA
  /// (TeamThreadRange parallel_scan, through cuda_intra_block_reduce_scan)
  /// is written for blocks whose x extent is 1, a team without lanes. The
  /// GPU forms, which launch without lanes, scan (SsdGpuChunks::scan_decays).
  KOKKOS_INLINE_FUNCTION void load_decays(const Member& team, const Chunk& k,
                                          const Decays& d) const {
    Kokkos::single(Kokkos::PerTeam(team), [&]() { scan_steps(k, Qp, d.cum, d.seg, d.dtv); });
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, Qp), [&](int i) {
      d.e[i] = entering(d.cum, d.seg, i);
      d.dend[i] = leaving(d.cum, d.seg, i, Qp - 1);
    });
  }

  template <class F>
  KOKKOS_FORCEINLINE_FUNCTION static void vec(const Member& team, int n, const F& f) {
    kdnn::impl::vector_for<ExecSpace>(team, n, f);
  }

  /// dst[r·cols + c] = scale(r)·src(r)[c] for r < live_rows, c < live_cols,
  /// 0 in the rest of the rows × cols tile; src(r) points at a contiguous
  /// source row (a pointer, so that the copy is a plain vector loop, not a
  /// gather through a View's index arithmetic).
  template <class Src, class Scale>
  KOKKOS_INLINE_FUNCTION static void fill(const Member& team, T* dst, int rows, int cols,
                                          int live_rows, int live_cols, const Src& src,
                                          const Scale& scale) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int r) {
      T* row = dst + std::size_t(r) * cols;
      const int live = r < live_rows ? live_cols : 0;
      if (live > 0) {
        const T* from = src(r);
        const T f = scale(r);
        vec(team, live, [&](int c) { row[c] = f * from[c]; });
      }
      vec(team, cols - live, [&](int c) { row[live + c] = T(0); });
    });
  }

  /// The same tile filled by its columns from source rows that are
  /// contiguous in r: dst[r·cols + c] = scale(c)·src(c)[r] (a transposed
  /// load: reads run along the source's rows, the strided writes go to
  /// scratch).
  template <class Src, class Scale>
  KOKKOS_INLINE_FUNCTION static void fill_transposed(const Member& team, T* dst, int rows, int cols,
                                                     int live_rows, int live_cols, const Src& src,
                                                     const Scale& scale) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols), [&](int c) {
      const int live = c < live_cols ? live_rows : 0;
      if (live > 0) {
        const T* from = src(c);
        const T f = scale(c);
        vec(team, live, [&](int r) { dst[std::size_t(r) * cols + c] = f * from[r]; });
      }
      vec(team, rows - live, [&](int r) { dst[std::size_t(live + r) * cols + c] = T(0); });
    });
  }
  /// The scale of an unscaled fill.
  struct One {
    KOKKOS_FORCEINLINE_FUNCTION T operator()(int) const { return T(1); }
  };

  // Source rows of the chunk's step t0 + i.
  KOKKOS_INLINE_FUNCTION const T* x_row(const Chunk& k, int i) const {
    return &x(k.b, k.t0 + i, k.h, 0);
  }
  template <class V>
  KOKKOS_INLINE_FUNCTION const T* group_row(const V& v, const Chunk& k, int i) const {
    return &v(k.b, k.t0 + i, k.g, 0);
  }

  // Tiles of the chunk's operands (rows = steps unless transposed).
  KOKKOS_INLINE_FUNCTION void load_x(const Member& team, const Chunk& k, const T* dtv,
                                     T* dst) const {  // X̃ [Qp×Pp]
    fill(
        team, dst, Qp, Pp, k.n, P(), [&](int i) { return x_row(k, i); },
        [&](int i) { return dtv[i]; });
  }
  KOKKOS_INLINE_FUNCTION void load_x_t(const Member& team, const Chunk& k, const T* dtv,
                                       T* dst) const {  // X̃ᵀ [Pp×Qp]
    fill_transposed(
        team, dst, Pp, Qp, P(), k.n, [&](int i) { return x_row(k, i); },
        [&](int i) { return dtv[i]; });
  }
  template <class V>
  KOKKOS_INLINE_FUNCTION void load_bc(const Member& team, const Chunk& k, const V& v,
                                      T* dst) const {  // B or C [Qp×Np]
    fill(
        team, dst, Qp, Np, k.n, N(), [&](int i) { return group_row(v, k, i); }, One{});
  }
  KOKKOS_INLINE_FUNCTION void load_b_t(const Member& team, const Chunk& k,
                                       T* dst) const {  // Bᵀ [Np×Qp]
    fill_transposed(
        team, dst, Np, Qp, N(), k.n, [&](int i) { return group_row(Bm, k, i); }, One{});
  }
  /// A chunk state of `s` ([N, P] stored), as [Np×Pp] (n-major) or, with
  /// `p_major`, [Pp×Np].
  KOKKOS_INLINE_FUNCTION void load_state(const Member& team, const Chunk& k,
                                         const ChunkStates<const T, ExecSpace>& s, int index,
                                         bool p_major, T* dst) const {
    const T* src = &s(k.b, k.h, index, 0);
    const int Pn = P();
    if (p_major) {
      fill_transposed(
          team, dst, Pp, Np, Pn, N(), [&](int j) { return src + j * Pn; }, One{});
    } else {
      fill(
          team, dst, Np, Pp, N(), Pn, [&](int j) { return src + j * Pn; }, One{});
    }
  }

  /// C = A·B (+ C) on the team (operands padded; the caller synchronises);
  /// `shape` skips what the causal mask zeroes (GemmShape).
  KOKKOS_INLINE_FUNCTION static void gemm(
      const Member& team, int M, int Ncols, int K, GemmA a, const T* b, int ldb, T* c, int ldc,
      bool accumulate, kdnn::impl::GemmShape shape = kdnn::impl::GemmShape::full) {
    kdnn::impl::team_gemm<ExecSpace>(team, M, Ncols, K, a, b, ldb, c, ldc, accumulate, shape);
  }

  /// m_ij = exp(cum_i − cum_j) for j ≤ i < n in one sequence (seg_i =
  /// seg_j), else 0. The exponent is clamped to ≤ 0 before exp and the mask
  /// is a select, so that masked entries are 0 whatever was computed there
  /// (no inf, no inf·0) and the loop over j has no branch.
  KOKKOS_FORCEINLINE_FUNCTION static T decay_mask(const double* cum, const int* seg, int i, int j,
                                                  int n) {
    const double d = cum[i] - cum[j];
    const T m = kdnn::impl::exp_vectorisable(T(d < 0 ? d : 0));
    return j <= i && i < n && seg[i] == seg[j] ? m : T(0);
  }
  /// `keep` (decay_mask's condition) ? v : 0, a select (v may be garbage).
  KOKKOS_FORCEINLINE_FUNCTION static T masked(int i, int j, int n, T v) {
    return j <= i && i < n ? v : T(0);
  }
};

}  // namespace kdnn::ssm::impl
