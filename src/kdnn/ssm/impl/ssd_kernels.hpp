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
// Chunk states are stored transposed, [N, P] (n-major), so that they are
// the row-major right operand of C·Hᵀ.
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/exp_vectorisable.hpp"
#include "kdnn/core/impl/row_dot.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/team_work.hpp"
#include "kdnn/core/impl/team_gemm.hpp"
#include "kdnn/core/impl/vector_for.hpp"
#include "kdnn/core/tensor.hpp"

namespace kdnn::ssm::impl {

/// Per-chunk buffers between the kernels: [B, H, chunks (+1), N·P].
template <class T, class ExecSpace>
using ChunkStates = Kokkos::View<T****, Kokkos::LayoutRight, typename ExecSpace::memory_space>;

/// What every SSD chunk kernel shares: the inputs, the tiling and the loads.
template <class ExecSpace, class T>
struct SsdChunks {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Tile = kdnn::impl::GemmTile<ExecSpace, T>;
  using GemmA = kdnn::impl::GemmA<T>;

  Tensor4<const T, ExecSpace> x;   ///< [B, L, H, P]
  Tensor3<const T, ExecSpace> dt;  ///< [B, L, H]
  Vector<const T, ExecSpace> A;    ///< [H]
  Tensor4<const T, ExecSpace> Bm;  ///< [B, L, G, N]
  Tensor4<const T, ExecSpace> Cm;  ///< [B, L, G, N]
  int Q = 1, chunks = 0;           ///< steps per chunk, chunks per sequence
  int Qp = 0, Pp = 0, Np = 0;      ///< Q, P, N padded to Tile::align
  kdnn::impl::TeamWork work;  ///< set by the launch
  Launch launch;               ///< the caller's request (SsdOptions::launch)

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

  /// The chunk's decays, computed once per team.
  struct Decays {
    double* cum;  ///< [Qp] cum_i (pad steps repeat the last)
    T* dtv;       ///< [Qp] dt_i (0 for pad steps)
    T* e;         ///< [Qp] exp(cum_i)
    T* dend;      ///< [Qp] exp(cum_last − cum_i)
  };
  KOKKOS_INLINE_FUNCTION static Decays carve_decays(kdnn::impl::ScratchCarver& s, int Qp) {
    return {s.take<double>(Qp), s.take<T>(Qp), s.take<T>(Qp), s.take<T>(Qp)};
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

  /// Fills `d`: cum and dtv are ready on return, e and dend after the
  /// caller's next team barrier.
  KOKKOS_INLINE_FUNCTION void load_decays(const Member& team, const Chunk& k,
                                          const Decays& d) const {
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      const double a = double(A(k.h));
      double s = 0;
      for (int i = 0; i < Qp; ++i) {
        const T v = i < k.n ? dt(k.b, k.t0 + i, k.h) : T(0);
        d.dtv[i] = v;
        s += log_decay(v, a);
        d.cum[i] = s;
      }
    });
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamVectorRange(team, Qp), [&](int i) {
      d.e[i] = compat::exp(T(d.cum[i]));
      d.dend[i] = compat::exp(T(d.cum[Qp - 1] - d.cum[i]));
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

  /// m_ij = exp(cum_i − cum_j) for j ≤ i < n, else 0. The exponent is
  /// clamped to ≤ 0 before exp and the mask is a select, so that masked
  /// entries are 0 whatever was computed there (no inf, no inf·0) and the
  /// loop over j has no branch.
  KOKKOS_FORCEINLINE_FUNCTION static T decay_mask(const double* cum, int i, int j, int n) {
    const double d = cum[i] - cum[j];
    const T m = kdnn::impl::exp_vectorisable(T(d < 0 ? d : 0));
    return j <= i && i < n ? m : T(0);
  }
  /// `keep` (decay_mask's condition) ? v : 0, a select (v may be garbage).
  KOKKOS_FORCEINLINE_FUNCTION static T masked(int i, int j, int n, T v) {
    return j <= i && i < n ? v : T(0);
  }
};

/// S_c (the chunk's state from a zero state, stored [N, P]) into
/// states(b, h, c) and exp(cum_last) into decay(b, h, c).
template <class ExecSpace, class T>
struct SsdChunkStateKernel : SsdChunks<ExecSpace, T> {
  using Base = SsdChunks<ExecSpace, T>;
  using typename Base::Member;
  ChunkStates<T, ExecSpace> states;  ///< [B, H, ≥chunks, N·P]
  Kokkos::View<T***, Kokkos::LayoutRight, typename ExecSpace::memory_space>
      decay;  ///< [B, H, chunks]

  struct Work {
    typename Base::Decays d;
    T *bt, *xs, *s;
  };
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int Qp, int Pp, int Np) {
    Work w;
    w.d = Base::carve_decays(s, Qp);
    w.bt = s.take<T>(std::size_t(Np) * Qp);
    w.xs = s.take<T>(std::size_t(Qp) * Pp);
    w.s = s.take<T>(std::size_t(Np) * Pp);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    this->work.for_each(team, [&](int item, void* scratch) { one_chunk(team, item, scratch); });
  }

  /// Work item `item` (a chunk), in the team's scratch.
  KOKKOS_INLINE_FUNCTION void one_chunk(const Member& team, int item, void* scratch) const {
    const auto k = this->chunk(item);
    kdnn::impl::ScratchCarver carver(
        scratch);
    const Work w = carve(carver, this->Qp, this->Pp, this->Np);
    this->load_decays(team, k, w.d);
    team.team_barrier();
    this->load_b_t(team, k, w.bt);
    // Xs_j = dend_j·dt_j·x_j: S = Bᵀ·Xs (S_c above, n-major).
    this->fill(
        team, w.xs, this->Qp, this->Pp, k.n, this->P(), [&](int i) { return this->x_row(k, i); },
        [&](int i) { return w.d.dend[i] * w.d.dtv[i]; });
    team.team_barrier();
    Base::gemm(team, this->Np, this->Pp, this->Qp, Base::GemmA::rows(w.bt, this->Qp), w.xs,
               this->Pp, w.s, this->Pp, false);
    team.team_barrier();
    const int P = this->P();
    T* out = &states(k.b, k.h, k.c, 0);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, this->N()), [&](int j) {
      Base::vec(team, P, [&](int p) { out[j * P + p] = w.s[j * this->Pp + p]; });
    });
    Kokkos::single(Kokkos::PerTeam(team),
                   [&]() { decay(k.b, k.h, k.c) = compat::exp(T(w.d.cum[this->Qp - 1])); });
  }
};

/// y at the chunk's steps: with `diag`, y = Y_diag + D·x (overwritten);
/// with `off`, Y_off = e_i·C_i·H_cᵀ from states(b, h, c) (the state entering
/// the chunk) is added — to Y_diag, or to y as it is when `diag` is off.
template <class ExecSpace, class T>
struct SsdChunkOutputKernel : SsdChunks<ExecSpace, T> {
  using Base = SsdChunks<ExecSpace, T>;
  using typename Base::Member;
  Vector<const T, ExecSpace> D;            ///< [H] or empty
  ChunkStates<const T, ExecSpace> states;  ///< [B, H, ≥chunks, N·P] (off)
  Tensor4<T, ExecSpace> y;                 ///< [B, L, H, P]
  bool diag = true, off = true, has_d = false;

  struct Work {
    typename Base::Decays d;
    T *c, *y, *bt, *xt, *w, *ht;
  };
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int Qp, int Pp, int Np,
                                           bool diag, bool off) {
    Work w;
    w.d = Base::carve_decays(s, Qp);
    w.c = s.take<T>(std::size_t(Qp) * Np);
    w.y = s.take<T>(std::size_t(Qp) * Pp);
    w.bt = diag ? s.take<T>(std::size_t(Np) * Qp) : nullptr;
    w.xt = diag ? s.take<T>(std::size_t(Qp) * Pp) : nullptr;  // X̃ (row-major)
    w.w = diag ? s.take<T>(std::size_t(Qp) * Qp) : nullptr;
    w.ht = off ? s.take<T>(std::size_t(Np) * Pp) : nullptr;
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    this->work.for_each(team, [&](int item, void* scratch) { one_chunk(team, item, scratch); });
  }

  /// Work item `item` (a chunk), in the team's scratch.
  KOKKOS_INLINE_FUNCTION void one_chunk(const Member& team, int item, void* scratch) const {
    const int Qp = this->Qp, Pp = this->Pp, Np = this->Np;
    const auto k = this->chunk(item);
    kdnn::impl::ScratchCarver carver(
        scratch);
    const Work w = carve(carver, Qp, Pp, Np, diag, off);
    this->load_decays(team, k, w.d);
    this->load_bc(team, k, this->Cm, w.c);
    if (diag) {
      this->load_b_t(team, k, w.bt);
      this->load_x(team, k, w.d.dtv, w.xt);
    }
    if (off) this->load_state(team, k, states, k.c, false, w.ht);
    team.team_barrier();
    if (off) Base::gemm(team, Qp, Pp, Np, Base::GemmA::rows(w.c, Np), w.ht, Pp, w.y, Pp, false);
    if (diag) {
      Base::gemm(team, Qp, Qp, Np, Base::GemmA::rows(w.c, Np), w.bt, Qp, w.w, Qp, false,
                 kdnn::impl::GemmShape::lower_out);
    }
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, Qp), [&](int i) {
      if (off) {
        T* yr = w.y + i * Pp;
        const T ei = w.d.e[i];
        Base::vec(team, Pp, [&](int p) { yr[p] *= ei; });
      }
      if (diag) {
        T* wr = w.w + i * Qp;
        Base::vec(team, Qp, [&](int j) {
          wr[j] = Base::masked(i, j, k.n, wr[j] * Base::decay_mask(w.d.cum, i, j, k.n));
        });
      }
    });
    team.team_barrier();
    if (diag) {
      Base::gemm(team, Qp, Pp, Qp, Base::GemmA::rows(w.w, Qp), w.xt, Pp, w.y, Pp, off,
                 kdnn::impl::GemmShape::a_lower);
    }
    team.team_barrier();
    const int P = this->P();
    const T dh = has_d ? D(k.h) : T(0);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, k.n), [&](int i) {
      T* out = &y(k.b, k.t0 + i, k.h, 0);
      const T* yr = w.y + i * Pp;
      if (diag) {
        const T* xr = &this->x(k.b, k.t0 + i, k.h, 0);
        Base::vec(team, P, [&](int p) { out[p] = yr[p] + dh * xr[p]; });
      } else {
        Base::vec(team, P, [&](int p) { out[p] += yr[p]; });
      }
    });
  }
};

/// The gradient the chunk's Y_off sends to the state entering it:
/// dS_c = Σ_i e_i·dy_i ⊗ C_i, stored [N, P] into dstates(b, h, c).
template <class ExecSpace, class T>
struct SsdChunkDstateKernel : SsdChunks<ExecSpace, T> {
  using Base = SsdChunks<ExecSpace, T>;
  using typename Base::Member;
  Tensor4<const T, ExecSpace> dy;     ///< [B, L, H, P]
  ChunkStates<T, ExecSpace> dstates;  ///< [B, H, chunks, N·P]

  struct Work {
    typename Base::Decays d;
    T *c, *edy, *s;
  };
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int Qp, int Pp, int Np) {
    Work w;
    w.d = Base::carve_decays(s, Qp);
    w.c = s.take<T>(std::size_t(Qp) * Np);
    w.edy = s.take<T>(std::size_t(Qp) * Pp);
    w.s = s.take<T>(std::size_t(Np) * Pp);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    this->work.for_each(team, [&](int item, void* scratch) { one_chunk(team, item, scratch); });
  }

  /// Work item `item` (a chunk), in the team's scratch.
  KOKKOS_INLINE_FUNCTION void one_chunk(const Member& team, int item, void* scratch) const {
    const int Qp = this->Qp, Pp = this->Pp, Np = this->Np;
    const auto k = this->chunk(item);
    kdnn::impl::ScratchCarver carver(
        scratch);
    const Work w = carve(carver, Qp, Pp, Np);
    this->load_decays(team, k, w.d);
    this->load_bc(team, k, this->Cm, w.c);
    team.team_barrier();
    this->fill(
        team, w.edy, Qp, Pp, k.n, this->P(), [&](int i) { return &dy(k.b, k.t0 + i, k.h, 0); },
        [&](int i) { return w.d.e[i]; });
    team.team_barrier();
    // dSᵀ... stored n-major: dS[n, p] = Σ_i C[i, n]·edy[i, p] = (Cᵀ·edy)[n, p].
    Base::gemm(team, Np, Pp, Qp, Base::GemmA::k_major(w.c, Np), w.edy, Pp, w.s, Pp, false);
    team.team_barrier();
    const int P = this->P();
    T* out = &dstates(k.b, k.h, k.c, 0);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, this->N()), [&](int j) {
      Base::vec(team, P, [&](int p) { out[j * P + p] = w.s[j * Pp + p]; });
    });
  }
};

/// Where the backward kernels put the gradients: dx, per-head dB and dC
/// ([B, L, H, N]: dB and dC themselves when G = H) and da_diag [B, H, L], the
/// Y_diag part of the gradient of each step's log-decay a_t = dt_t·A.
template <class ExecSpace, class T>
struct SsdGradients {
  Tensor4<T, ExecSpace> dx;   ///< [B, L, H, P]
  Tensor4<T, ExecSpace> dBh;  ///< [B, L, H, N]
  Tensor4<T, ExecSpace> dCh;  ///< [B, L, H, N]
  Kokkos::View<double***, Kokkos::LayoutRight, typename ExecSpace::memory_space> da_diag;
};

/// The backward of Y_diag alone. With W = CB∘m and V = (dY·X̃ᵀ)∘m:
///   dX̃ = Wᵀ·dY,  dB = Vᵀ·C,  dC = V·B,
///   da_k = Σ_{j<k≤i} R_ij  with R = CB∘V (R_ij is the derivative of the
///   loss by the exponent cum_i − cum_j = Σ_{j<k≤i} a_k).
/// Writes dX̃ into dx (the state kernel finishes it), dB, dC and da_diag.
template <class ExecSpace, class T>
struct SsdDiagBackwardKernel : SsdChunks<ExecSpace, T> {
  using Base = SsdChunks<ExecSpace, T>;
  using typename Base::Member;
  Tensor4<const T, ExecSpace> dy;  ///< [B, L, H, P]
  SsdGradients<ExecSpace, T> g;

  struct Work {
    typename Base::Decays d;
    T *c, *b, *bt, *xr, *xt, *dy, *w, *v, *r, *dxr, *dbt, *dc;
    double* da;  ///< [Qp] da_diag of the chunk's steps
  };
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int Qp, int Pp, int Np) {
    Work w;
    w.d = Base::carve_decays(s, Qp);
    const std::size_t qn = std::size_t(Qp) * Np, qp = std::size_t(Qp) * Pp,
                      qq = std::size_t(Qp) * Qp;
    w.c = s.take<T>(qn);
    w.b = s.take<T>(qn);
    w.bt = s.take<T>(qn);
    w.xr = s.take<T>(qp);
    w.xt = s.take<T>(qp);
    w.dy = s.take<T>(qp);
    w.w = s.take<T>(qq);
    w.v = s.take<T>(qq);
    w.r = s.take<T>(qq);
    w.dxr = s.take<T>(qp);
    w.dbt = s.take<T>(qn);
    w.dc = s.take<T>(qn);
    w.da = s.take<double>(Qp);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    this->work.for_each(team, [&](int item, void* scratch) { one_chunk(team, item, scratch); });
  }

  /// Work item `item` (a chunk), in the team's scratch.
  KOKKOS_INLINE_FUNCTION void one_chunk(const Member& team, int item, void* scratch) const {
    const int Qp = this->Qp, Pp = this->Pp, Np = this->Np;
    const auto k = this->chunk(item);
    kdnn::impl::ScratchCarver carver(
        scratch);
    const Work w = carve(carver, Qp, Pp, Np);
    this->load_decays(team, k, w.d);
    this->load_bc(team, k, this->Cm, w.c);
    this->load_bc(team, k, this->Bm, w.b);
    this->load_b_t(team, k, w.bt);
    this->fill(
        team, w.dy, Qp, Pp, k.n, this->P(), [&](int i) { return &dy(k.b, k.t0 + i, k.h, 0); },
        typename Base::One{});
    this->load_x(team, k, w.d.dtv, w.xr);
    this->load_x_t(team, k, w.d.dtv, w.xt);
    team.team_barrier();
    using GA = typename Base::GemmA;
    using Shape = kdnn::impl::GemmShape;
    Base::gemm(team, Qp, Qp, Np, GA::rows(w.c, Np), w.bt, Qp, w.w, Qp, false,
               Shape::lower_out);  // CB
    Base::gemm(team, Qp, Qp, Pp, GA::rows(w.dy, Pp), w.xt, Qp, w.v, Qp, false,
               Shape::lower_out);  // dY·X̃ᵀ
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, Qp), [&](int i) {
      T *wr = w.w + i * Qp, *vr = w.v + i * Qp, *rr = w.r + i * Qp;
      Base::vec(team, Qp, [&](int j) {  // tiles above the diagonal hold garbage
        const T m = Base::decay_mask(w.d.cum, i, j, k.n);
        const T cb = Base::masked(i, j, k.n, wr[j]), v = Base::masked(i, j, k.n, vr[j] * m);
        vr[j] = v;
        wr[j] = cb * m;
        rr[j] = cb * v;
      });
    });
    team.team_barrier();
    Base::gemm(team, Qp, Pp, Qp, GA::k_major(w.w, Qp), w.dy, Pp, w.dxr, Pp, false,
               Shape::a_upper);  // Wᵀ·dY
    Base::gemm(team, Np, Qp, Qp, GA::k_major(w.c, Np), w.v, Qp, w.dbt, Qp, false,
               Shape::b_lower);  // (Vᵀ·C)ᵀ
    Base::gemm(team, Qp, Np, Qp, GA::rows(w.v, Qp), w.b, Np, w.dc, Np, false,
               Shape::a_lower);  // V·B
    // da_k = Σ_{j<k≤i} R_ij, the pairs whose decay crosses step k, summed
    // directly (the difference of the row and column sums of R would leave
    // these small terms to the cancellation of large ones). First, in place,
    // the suffix sums down each column, R_ij ← Σ_{i'≥i} R_i'j (one thread
    // over the rows on a host, vectorised over the columns; on a GPU each
    // lane a column), then da_k = Σ_{j<k} R_kj.
    if constexpr (Base::Tile::host) {
      Kokkos::single(Kokkos::PerTeam(team), [&]() {
        for (int i = Qp - 2; i >= 0; --i) {
          T* ri = w.r + i * Qp;
          const T* below = ri + Qp;
          Base::vec(team, Qp, [&](int j) { ri[j] += below[j]; });
        }
      });
    } else {
      Kokkos::parallel_for(Kokkos::TeamVectorRange(team, Qp), [&](int j) {
        for (int i = Qp - 2; i >= 0; --i) w.r[i * Qp + j] += w.r[(i + 1) * Qp + j];
      });
    }
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, Qp), [&](int i) {
      T crossing = 0;
      Kokkos::parallel_reduce(
          Kokkos::ThreadVectorRange(team, i), [&](int j, T& acc) { acc += w.r[i * Qp + j]; },
          crossing);
      Kokkos::single(Kokkos::PerThread(team), [&]() { w.da[i] = double(crossing); });
    });
    team.team_barrier();
    const int P = this->P(), N = this->N();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, k.n), [&](int i) {
      const int t = k.t0 + i;
      T* dxo = &g.dx(k.b, t, k.h, 0);
      T* dbo = &g.dBh(k.b, t, k.h, 0);
      T* dco = &g.dCh(k.b, t, k.h, 0);
      const T* dxr = w.dxr + i * Pp;
      const T* dcr = w.dc + i * Np;
      Base::vec(team, P, [&](int p) { dxo[p] = dxr[p]; });
      Base::vec(team, N, [&](int j) { dbo[j] = w.dbt[j * Qp + i]; });
      Base::vec(team, N, [&](int j) { dco[j] = dcr[j]; });
      Kokkos::single(Kokkos::PerThread(team), [&]() { g.da_diag(k.b, k.h, t) = w.da[i]; });
    });
  }
};

/// The rest of the backward, from the state entering the chunk H_c
/// (states(b, h, c)) and the gradient of the state leaving it dH_{c+1}
/// (dstates(b, h, c)):
///   dX̃_i += dend_i·(B_i·dH_{c+1}ᵀ),  dB_i += dend_i·(X̃_i·dH_{c+1}),
///   dC_i += e_i·(dY_i·H_c),
///   da_t = da_diag_t + Σ_{i≥t} e_i·C_i·(dY_i·H_c) + Σ_{j<t} dend_j·X̃_j·(B_j·dH_{c+1}ᵀ)
///          + exp(cum_last)·⟨dH_{c+1}, H_c⟩
/// (a_t enters cum_i for i ≥ t, and cum_last − cum_j for j < t: each sum
/// holds only terms in which a_t appears, none cancelling), then the outputs:
///   dx = dt·dX̃ + D·dy,  ddt = A·da + x·dX̃,  per chunk Σ dt·da (dA), Σ dy·x (dD).
template <class ExecSpace, class T>
struct SsdStateBackwardKernel : SsdChunks<ExecSpace, T> {
  using Base = SsdChunks<ExecSpace, T>;
  using typename Base::Member;
  Tensor4<const T, ExecSpace> dy;           ///< [B, L, H, P]
  Vector<const T, ExecSpace> D;             ///< [H] or empty
  ChunkStates<const T, ExecSpace> states;   ///< H_c, [B, H, ≥chunks, N·P]
  ChunkStates<const T, ExecSpace> dstates;  ///< dH_{c+1}, [B, H, chunks, N·P]
  SsdGradients<ExecSpace, T> g;
  Tensor3<T, ExecSpace> ddt;          ///< [B, L, H]
  Matrix<double, ExecSpace> partial;  ///< [B·chunks, 2H]: Σ dt·da, Σ dy·x
  bool has_d = false;

  struct Work {
    typename Base::Decays d;
    T *c, *bt, *xr, *dy, *hpn, *dhnp, *dhpn, *tx, *tb, *tc;
    double *dcum, *row_a, *row_d;
  };
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int Qp, int Pp, int Np) {
    Work w;
    w.d = Base::carve_decays(s, Qp);
    const std::size_t qn = std::size_t(Qp) * Np, qp = std::size_t(Qp) * Pp,
                      pn = std::size_t(Pp) * Np;
    w.c = s.take<T>(qn);
    w.bt = s.take<T>(qn);
    w.xr = s.take<T>(qp);
    w.dy = s.take<T>(qp);
    w.hpn = s.take<T>(pn);
    w.dhnp = s.take<T>(pn);
    w.dhpn = s.take<T>(pn);
    w.tx = s.take<T>(qp);
    w.tb = s.take<T>(qn);
    w.tc = s.take<T>(qn);
    w.dcum = s.take<double>(Qp);
    w.row_a = s.take<double>(Qp);
    w.row_d = s.take<double>(Qp);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    this->work.for_each(team, [&](int item, void* scratch) { one_chunk(team, item, scratch); });
  }

  /// Work item `item` (a chunk), in the team's scratch.
  KOKKOS_INLINE_FUNCTION void one_chunk(const Member& team, int item, void* scratch) const {
    const int Qp = this->Qp, Pp = this->Pp, Np = this->Np, P = this->P(), N = this->N();
    const auto k = this->chunk(item);
    kdnn::impl::ScratchCarver carver(
        scratch);
    const Work w = carve(carver, Qp, Pp, Np);
    this->load_decays(team, k, w.d);
    this->load_bc(team, k, this->Cm, w.c);
    this->load_b_t(team, k, w.bt);
    this->fill(
        team, w.dy, Qp, Pp, k.n, P, [&](int i) { return &dy(k.b, k.t0 + i, k.h, 0); },
        typename Base::One{});
    this->load_state(team, k, states, k.c, true, w.hpn);
    this->load_state(team, k, dstates, k.c, false, w.dhnp);
    this->load_state(team, k, dstates, k.c, true, w.dhpn);
    this->load_x(team, k, w.d.dtv, w.xr);
    team.team_barrier();
    using GA = typename Base::GemmA;
    Base::gemm(team, Qp, Pp, Np, GA::k_major(w.bt, Qp), w.dhnp, Pp, w.tx, Pp, false);  // B·dHᵀ
    Base::gemm(team, Qp, Np, Pp, GA::rows(w.xr, Pp), w.dhpn, Np, w.tb, Np, false);     // X̃·dH
    Base::gemm(team, Qp, Np, Pp, GA::rows(w.dy, Pp), w.hpn, Np, w.tc, Np, false);      // dY·H
    // ⟨dH_{c+1}, H_c⟩ over the state, by rows p.
    double hdot = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, Pp),
        [&](int p, double& acc) {
          acc += double(kdnn::impl::row_dot<ExecSpace>(team, Np, w.dhpn + p * Np, w.hpn + p * Np));
        },
        hdot);
    team.team_barrier();
    // The state terms of da: e_i·C_i·(dY_i·H_c) into dcum, dend_i·X̃_i·(B_i·dH)
    // into row_a.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, Qp), [&](int i) {
      const T off = kdnn::impl::row_dot<ExecSpace>(team, Np, w.c + i * Np, w.tc + i * Np);
      const T v = kdnn::impl::row_dot<ExecSpace>(team, Pp, w.xr + i * Pp, w.tx + i * Pp);
      Kokkos::single(Kokkos::PerThread(team), [&]() {
        w.dcum[i] = double(w.d.e[i]) * double(off);
        w.row_a[i] = double(w.d.dend[i]) * double(v);
      });
    });
    team.team_barrier();
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      double before = 0;  // Σ_{j<t} of the row_a terms
      for (int i = 0; i < k.n; ++i) {
        const double v = w.row_a[i];
        w.row_a[i] = before;
        before += v;
      }
      const double all = double(w.d.e[Qp - 1]) * hdot;  // cum_last holds every a_t
      const double a = double(this->A(k.h));
      double after = 0;  // Σ_{i≥t} of the dcum terms
      for (int i = k.n - 1; i >= 0; --i) {
        after += w.dcum[i];
        const double da = g.da_diag(k.b, k.h, k.t0 + i) + after + w.row_a[i] + all;
        w.dcum[i] = Base::saturated(w.d.dtv[i], a) ? 0.0 : da;  // da_t, kept in dcum
      }
    });
    team.team_barrier();
    const T a = this->A(k.h), dh = has_d ? D(k.h) : T(0);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, k.n), [&](int i) {
      const int t = k.t0 + i;
      const T di = w.d.dend[i], ei = w.d.e[i], dti = w.d.dtv[i];
      const T* xr = &this->x(k.b, t, k.h, 0);
      const T* dyr = &dy(k.b, t, k.h, 0);
      T* dxo = &g.dx(k.b, t, k.h, 0);
      const T* txr = w.tx + i * Pp;
      T sx = 0;  // Σ_p x·dX̃, each lane over its own p
      Kokkos::parallel_reduce(
          Kokkos::ThreadVectorRange(team, P),
          [&](int p, T& acc) {
            const T dxt = dxo[p] + di * txr[p];  // dX̃
            dxo[p] = dti * dxt + dh * dyr[p];
            acc += xr[p] * dxt;
          },
          sx);
      const T sd = kdnn::impl::row_dot<ExecSpace>(team, P, dyr, xr);
      T* dbo = &g.dBh(k.b, t, k.h, 0);
      T* dco = &g.dCh(k.b, t, k.h, 0);
      const T *tbr = w.tb + i * Np, *tcr = w.tc + i * Np;
      Base::vec(team, N, [&](int j) { dbo[j] += di * tbr[j]; });
      Base::vec(team, N, [&](int j) { dco[j] += ei * tcr[j]; });
      Kokkos::single(Kokkos::PerThread(team), [&]() {
        ddt(k.b, t, k.h) = T(double(a) * w.dcum[i] + double(sx));
        w.row_a[i] = double(dti) * w.dcum[i];
        w.row_d[i] = double(sd);
      });
    });
    team.team_barrier();
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      double sa = 0, sd = 0;
      for (int i = 0; i < k.n; ++i) {
        sa += w.row_a[i];
        sd += w.row_d[i];
      }
      const int H = int(this->x.extent(2)), row = k.b * this->chunks + k.c;
      partial(row, k.h) = sa;
      partial(row, H + k.h) = sd;
    });
  }
};

}  // namespace kdnn::ssm::impl
