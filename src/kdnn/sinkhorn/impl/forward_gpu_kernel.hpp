#pragma once
// Sinkhorn forward, GPU shape (kdnn::KernelShape::gpu), for a compile-time
// n = N in {2, 4, 8, 16, 32}: each matrix is owned by the N vector lanes of
// one team thread, several matrices per team (a team is a few warps). Lane k
// keeps row k of P and column k of P (Pᵀ's row k) in registers, so that both
// matrix-vector products of an iteration are lane-local dot products:
//
//   columns: lane j, c_j = Σ_i P_ij u_i (its column), v_j <- rescaled(v_j, c_j)
//   rows:    lane i, r_i = Σ_j P_ij v_j (its row),    u_i <- rescaled(u_i, r_i)
//
// The only exchange between lanes is the scaling vectors: each lane stores
// its u_i or v_j in team scratch (level 0) and every lane of the matrix reads
// the whole vector back (a broadcast read). That is N stores and N loads per
// matrix per half-iteration, against N·(log₂N + 1) shuffles for the same
// all-gather through Kokkos' vector reductions, and it keeps every sum in the
// order of the host shape. Cross-lane reductions remain only for the tol
// check and the report's marginal error (maxima, through lane_nan_max: warp
// shuffles on CUDA).
//
// Loads and stores: lane j reads column j of X and writes column j of R
// (columns first), so at each step the N lanes of a matrix touch one row, N
// consecutive elements, and the matrices of a team are consecutive in the
// batch. Every register array is indexed by compile-time indices only; the
// order (rows first) is a template parameter, so the offset of an element is
// a constant plus one multiply per row or column.
//
// Numerics are those of ForwardKernel, operation for operation: the first
// iteration in double through first_column / first_row (first_iteration.hpp),
// then R = diag(u) P diag(v) with P in T, the same sums in the same order, the
// same rescaled() and the same marginal_error(). On one backend the two shapes
// therefore give bitwise identical R and reports, as long as the compiler
// contracts (FMA) both the same way; the host build has no contraction (no
// FMA in the baseline ISA), a GPU compiler contracts by default, so there the
// two agree to rounding.
//
// Per-lane state: on a GPU backend a vector lane is a hardware thread with
// private registers, so a lane keeps only its own row and column
// (LaneRegisters with Private). On a host the lanes of a vector loop run one
// after another in one thread, so the state of all N lanes is kept side by
// side; the arithmetic is the same code.
#include <string>

#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/team_plan.hpp"
#include "kdnn/core/impl/unroll.hpp"
#include "kdnn/core/nan_max.hpp"
#include "kdnn/sinkhorn/impl/first_iteration.hpp"
#include "kdnn/sinkhorn/impl/marginal_error.hpp"
#include "kdnn/sinkhorn/impl/rescale.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::sinkhorn::impl {

/// M values of T per vector lane, for `Lanes` lanes: one lane's own values
/// if lanes have private registers (a GPU backend), else every lane's side by
/// side (a host backend, whose vector loop is a plain loop).
template <class T, int Lanes, int M, bool Private>
struct LaneRegisters {
  T a[Private ? 1 : Lanes][M];
  KOKKOS_FORCEINLINE_FUNCTION T* operator()(int lane) { return a[Private ? 0 : lane]; }
};

/// The sizes the GPU forward is compiled for.
KOKKOS_INLINE_FUNCTION constexpr bool gpu_forward_size(int n) {
  return n == 2 || n == 4 || n == 8 || n == 16 || n == 32;
}

/// Σ_k a_k y_k in order, as col_dot_one sums.
template <int N, class T>
KOKKOS_FORCEINLINE_FUNCTION T lane_dot(const T* a, const T* y) {
  T s = a[0] * y[0];
  KDNN_IMPL_UNROLL
  for (int k = 1; k < N; ++k) s += a[k] * y[k];
  return s;
}

template <class ExecSpace, class T, int N>
struct ForwardGpuKernel {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  /// Vector lanes with private registers (see the file comment).
  static constexpr bool kPrivate = kdnn::impl::BackendTraits<ExecSpace>::is_gpu;
  /// Row stride of the transpose tile: odd for N >= 2, so lanes walking its
  /// rows and lanes walking its columns both hit distinct banks.
  static constexpr int kLd = N + 1;

  Batch<const T, ExecSpace> X;
  Batch<T, ExecSpace> R;
  Kokkos::View<int*, typename ExecSpace::memory_space> iters_out;
  Kokkos::View<double*, typename ExecSpace::memory_space> error_out;
  int batch = 0, iters = 1;
  double tol = 0, eps = 0;
  bool transpose = false;

  /// One matrix's scratch: the scaling vectors, the first iteration's column
  /// statistics and a tile that turns rows of P into columns.
  struct Work {
    T *u, *v, *tile;
    double *shift, *inv_colsum;
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s) {
    Work w;
    w.u = s.take<T>(N);
    w.v = s.take<T>(N);
    w.tile = s.take<T>(N * kLd);
    w.shift = s.take<double>(N);
    w.inv_colsum = s.take<double>(N);
    return w;
  }
  static KOKKOS_INLINE_FUNCTION std::size_t matrix_bytes() {
    return kdnn::impl::layout_bytes([](kdnn::impl::ScratchCarver& s) { carve(s); });
  }

  /// Launch: vector length N on a GPU (a lane per row, which the private
  /// registers need), 1 on a host; a team of 128 / N matrices (four warps),
  /// fewer if their scratch does not fit on-chip. launch.team_size, if set,
  /// is the number of matrices per team; launch.tile and
  /// launch.vector_length do not apply to this shape.
  void run(const char* op, const ExecSpace& space, const Launch& request) {
    kdnn::impl::check_launch_request(op, request);
    const std::size_t bytes = matrix_bytes();
    const std::size_t max0 = kdnn::impl::scratch_capacity<ExecSpace>(0);
    int matrices = kPrivate && N < 128 ? 128 / N : 1;
    while (matrices > 1 && matrices * bytes > max0) matrices /= 2;
    kdnn::impl::TeamPlan<ExecSpace> plan;
    plan.vector_length = kPrivate ? N : 1;
    plan.level = 0;
    plan.scratch_bytes = matrices * bytes;
    plan.team_size = kdnn::impl::choose_team_size<ExecSpace, ForwardGpuKernel>(
        op, space, plan, request.team_size,
        [&](const auto&, int max) { return matrices < max ? matrices : max; });
    plan.scratch_bytes = plan.team_size * bytes;
    if (plan.scratch_bytes > max0) {
      kdnn::fail(op, ": launch.team_size=", plan.team_size, " needs ", plan.scratch_bytes,
                       " bytes of team scratch, above the ", max0, "-byte on-chip limit (level 0)");
    }
    plan.league = batch / plan.team_size + (batch % plan.team_size != 0 ? 1 : 0);
    Kokkos::parallel_for(std::string("kdnn::") + op + "[gpu n=" + std::to_string(N) + "]",
                         plan.policy(space), *this);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::size_t bytes = matrix_bytes();
    char* base = static_cast<char*>(
        kdnn::impl::team_scratch_base(team, 0, team.team_size() * bytes));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, team.team_size()), [&](int t) {
      // In 64 bits: the last team may reach past batch ≈ 2^31.
      const long long b64 = static_cast<long long>(team.league_rank()) * team.team_size() + t;
      if (b64 >= batch) return;
      kdnn::impl::ScratchCarver carver(base + t * bytes);
      const Work w = carve(carver);
      if (transpose) {
        one_matrix<true>(team, int(b64), w);
      } else {
        one_matrix<false>(team, int(b64), w);
      }
    });
  }

  /// Element (i, j) of a matrix at p with row stride ld, or (j, i) if Tr.
  template <bool Tr, class V>
  static KOKKOS_FORCEINLINE_FUNCTION V& at(V* p, int ld, int i, int j) {
    return Tr ? p[j * ld + i] : p[i * ld + j];
  }

  template <bool Tr>
  KOKKOS_INLINE_FUNCTION void one_matrix(const Member& team, int b, const Work& w) const {
    const T* x = X.data() + std::size_t(b) * X.stride(0);
    T* r = R.data() + std::size_t(b) * R.stride(0);
    const int ldx = int(X.stride(1)), ldr = int(R.stride(1));
    const T e = T(eps);
    const auto lanes = Kokkos::ThreadVectorRange(team, N);
    LaneRegisters<T, N, N, kPrivate> row;  // lane i: P_i·
    LaneRegisters<T, N, N, kPrivate> col;  // lane j: P_·j

    // Iteration 1, in double, with X read from global memory (cached) where
    // first_column / first_row need it rather than held in registers: fully
    // unrolled with N double temporaries per lane, these loops alone took
    // every register at N = 16 and spilled. Columns: lane j reads column j.
    const auto xd = [&](int i, int j) { return double(at<Tr>(x, ldx, i, j)); };
    Kokkos::parallel_for(lanes, [&](int j) {
      first_column(
          N, [&](int i) { return xd(i, j); }, [](int, double) {}, w.shift[j], w.inv_colsum[j]);
    });
    // Rows: lane i recomputes its exponentials (the same values the column
    // pass summed) and writes its row of P to the tile.
    Kokkos::parallel_for(lanes, [&](int i) {
      first_row(
          N, [&](int j) { return compat::exp(xd(i, j) - w.shift[j]); },
          [&](int j) { return xd(i, j); }, [&](int j) { return w.shift[j]; },
          [&](int j) { return w.inv_colsum[j]; }, eps,
          [&](int j, double pij) { w.tile[i * kLd + j] = T(pij); });
      w.u[i] = w.v[i] = T(1);
    });
    // The registers: lane k takes row k and column k of P from the tile.
    Kokkos::parallel_for(lanes, [&](int k) {
      T* pr = row(k);
      T* pc = col(k);
      KDNN_IMPL_UNROLL
      for (int l = 0; l < N; ++l) {
        pr[l] = w.tile[k * kLd + l];
        pc[l] = w.tile[l * kLd + k];
      }
    });

    // Iterations 2..iters. With tol, each first checks the column sums v∘c,
    // c = Pᵀu, of the current R (its rows were just normalised).
    int used = iters;
    LaneRegisters<T, N, 1, kPrivate> c;  // lane j: c_j
    for (int it = 1; it < iters; ++it) {
      if (tol > 0) {
        Kokkos::parallel_for(lanes, [&](int j) { c(j)[0] = lane_dot<N>(col(j), w.u); });
        const double error = lane_nan_max(
            team, N, [&](int j) { return compat::fabs(double(w.v[j] * c(j)[0]) - 1.0); });
        if (error <= tol) {
          used = it;
          break;
        }
        Kokkos::parallel_for(lanes, [&](int j) { w.v[j] = rescaled(w.v[j], c(j)[0], e); });
      } else {
        Kokkos::parallel_for(lanes,
                             [&](int j) { w.v[j] = rescaled(w.v[j], lane_dot<N>(col(j), w.u), e); });
      }
      Kokkos::parallel_for(lanes,
                           [&](int i) { w.u[i] = rescaled(w.u[i], lane_dot<N>(row(i), w.v), e); });
    }

    // R = diag(u) P diag(v): lane j writes column j.
    Kokkos::parallel_for(lanes, [&](int j) {
      const T* pc = col(j);
      const T vj = w.v[j];
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) at<Tr>(r, ldr, i, j) = w.u[i] * pc[i] * vj;
    });
    if (iters_out.extent(0) == 0 && error_out.extent(0) == 0) return;
    // Marginal error: row sums u∘(Pv) (lane i) and column sums v∘(Pᵀu)
    // (lane j), laid out in the tile as marginal_error() takes them.
    Kokkos::parallel_for(lanes, [&](int k) {
      const T rk = w.u[k] * lane_dot<N>(row(k), w.v);
      const T ck = w.v[k] * lane_dot<N>(col(k), w.u);
      w.tile[k] = rk;
      w.tile[N + k] = ck;
    });
    const double error = marginal_error(team, N, w.tile, w.tile + N);
    Kokkos::single(Kokkos::PerThread(team), [&]() {
      if (iters_out.extent(0) > 0) iters_out(b) = used;
      if (error_out.extent(0) > 0) error_out(b) = error;
    });
  }
};

}  // namespace kdnn::sinkhorn::impl
