// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Sinkhorn forward, GPU form (kdnn::KernelForm::gpu), lane layout, for a
// compile-time n = N in LaneFormSizes, {8, 16, 32} (smaller n: the thread
// form, forward_thread_kernel.hpp): each matrix is owned by the N vector lanes of
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
// order of the host form. Cross-lane reductions remain only for the tol
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
// same rescaled() and the same marginal_error(). On one backend the two forms
// therefore give bitwise identical R and reports, as long as the compiler
// contracts (FMA) both the same way; the host build has no contraction (no
// FMA in the baseline ISA), a GPU compiler contracts by default, so there the
// two agree to rounding.
//
// The launch, the lanes' registers and the matrices per team are
// GpuMatrixKernel's (gpu_matrix_kernel.hpp).
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/unroll.hpp"
#include "kdnn/core/nan_max.hpp"
#include "kdnn/sinkhorn/impl/first_iteration.hpp"
#include "kdnn/sinkhorn/impl/forward_data.hpp"
#include "kdnn/sinkhorn/impl/gpu_matrix_kernel.hpp"
#include "kdnn/sinkhorn/impl/marginal_error.hpp"
#include "kdnn/sinkhorn/impl/rescale.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T, int N>
struct ForwardGpuKernel : GpuMatrixKernel<ForwardGpuKernel<ExecSpace, T, N>, ExecSpace, N>,
                          ForwardData<ExecSpace, T> {
  using Base = GpuMatrixKernel<ForwardGpuKernel, ExecSpace, N>;
  using Data = ForwardData<ExecSpace, T>;
  using Member = typename Base::Member;
  static constexpr bool kPrivate = Base::kPrivate;
  static constexpr int kLd = Base::kLd;
  using Data::eps;
  using Data::error_out;
  using Data::iters;
  using Data::iters_out;
  using Data::R;
  using Data::tol;
  using Data::X;

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
  KOKKOS_INLINE_FUNCTION void one_matrix(const Member& team, int b, const Work& w) const {
    if (transpose) {
      oriented<true>(team, b, w);
    } else {
      oriented<false>(team, b, w);
    }
  }

  /// Matrix b, columns first on X (or on Xᵀ if Tr: rows first).
  template <bool Tr>
  KOKKOS_INLINE_FUNCTION void oriented(const Member& team, int b, const Work& w) const {
    const T* x = X.data() + std::size_t(b) * X.stride(0);
    T* r = R.data() + std::size_t(b) * R.stride(0);
    const int ldx = int(X.stride(1)), ldr = int(R.stride(1));
    const T e = T(eps);
    const auto lanes = Kokkos::ThreadVectorRange(team, N);
    LaneRegisters<T, N, N, kPrivate> row;  // lane i: P_i·
    LaneRegisters<T, N, N, kPrivate> col;  // lane j: P_·j

    // Iteration 1, in double (lanes read X where they need it), P in the
    // registers; u = v = 1.
    const auto xd = [&](int i, int j) { return double(Base::template at<Tr>(x, ldx, i, j)); };
    Base::first_iteration_lanes(
        team, xd, eps, w.shift, w.inv_colsum, w.tile, [](int, int, double) {},
        [&](int i, double) { w.u[i] = w.v[i] = T(1); }, row, col);

    // Iterations 2..iters. With tol, each first checks the column sums v∘c,
    // c = Pᵀu, of the current R (its rows were just normalised).
    int used = iters;
    LaneRegisters<T, N, 1, kPrivate> c;  // lane j: c_j
    for (int it = 1; it < iters; ++it) {
      if (tol > 0) {
        Kokkos::parallel_for(lanes, [&](int j) { c(j)[0] = lane_dot_shared<N>(col(j), w.u); });
        const double error = lane_nan_max(
            team, N, [&](int j) { return compat::fabs(double(w.v[j] * c(j)[0]) - 1.0); });
        if (error <= tol) {
          used = it;
          break;
        }
        Kokkos::parallel_for(lanes, [&](int j) { w.v[j] = rescaled(w.v[j], c(j)[0], e); });
      } else {
        Kokkos::parallel_for(
            lanes, [&](int j) { w.v[j] = rescaled(w.v[j], lane_dot_shared<N>(col(j), w.u), e); });
      }
      Kokkos::parallel_for(
          lanes, [&](int i) { w.u[i] = rescaled(w.u[i], lane_dot_shared<N>(row(i), w.v), e); });
    }

    // R = diag(u) P diag(v): lane j writes column j.
    Kokkos::parallel_for(lanes, [&](int j) {
      const T* pc = col(j);
      const T vj = w.v[j];
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) Base::template at<Tr>(r, ldr, i, j) = w.u[i] * pc[i] * vj;
    });
    if (iters_out.extent(0) == 0 && error_out.extent(0) == 0) return;
    // Marginal error: row sums u∘(Pv) (lane i) and column sums v∘(Pᵀu)
    // (lane j), laid out in the tile as marginal_error() takes them.
    Kokkos::parallel_for(lanes, [&](int k) {
      const T rk = w.u[k] * lane_dot_shared<N>(row(k), w.v);
      const T ck = w.v[k] * lane_dot_shared<N>(col(k), w.u);
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
