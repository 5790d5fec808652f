// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Sinkhorn unrolled backward, thread form (matrix_forms.hpp), for a
// compile-time n = N in ThreadMatrixSizes (1 … 4): one thread per matrix, P,
// the adjoints and dP's running sum in registers. The recurrences are
// UnrolledBackwardKernel's (unrolled_backward_kernel.hpp) and the arithmetic
// is the lane form's (unrolled_backward_gpu_kernel.hpp), operation for
// operation, with every lane's work done by the one thread: the first
// iteration in double (first_column, first_row), the replay through
// lane_dot and rescaled, dP's rank-1 terms summed in double from
// k = K−1 down, and the first iteration's reverse. So the two forms agree
// to rounding where a compiler contracts or keeps excess precision
// differently in the two, and bitwise where it does neither (tested to
// 2 units in the last place).
//
// The only state that does not fit in registers is the history of the
// scaling vectors, u_k and v_k for k < K (2·K·N values, K = iters, known at
// run time). It lives in team scratch, interleaved across the team's
// threads: value c of thread t at c·tile + t, so a warp's loads and stores
// of one value are consecutive words (coalesced, no bank conflicts). The
// launch (kdnn::impl::plan_system_tiles) puts a warp's matrices in a team
// and the history on-chip (level 0) when it fits, else in the bounded team
// workspace of a GPU launch.
//
// Registers bound this form, so nothing is held through the sweep that can
// be had again: the first iteration's P (in double), w and column
// statistics wait for its reverse in team scratch beside the history
// (interleaved the same way), and G is read again at the end.
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <string>

#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/team_plan.hpp"
#include "kdnn/core/impl/team_work.hpp"
#include "kdnn/core/impl/unroll.hpp"
#include "kdnn/sinkhorn/impl/first_iteration.hpp"
#include "kdnn/sinkhorn/impl/gpu_matrix_kernel.hpp"
#include "kdnn/sinkhorn/impl/rescale.hpp"
#include "kdnn/sinkhorn/impl/unrolled_backward_data.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T, int N>
struct UnrolledBackwardThreadKernel : UnrolledBackwardData<ExecSpace, T> {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Data = UnrolledBackwardData<ExecSpace, T>;
  int batch = 0;
  bool transpose = false;  ///< rows first: the columns-first sweep on Xᵀ and Gᵀ
  int tile = 1;            ///< matrices per team, set by run()
  kdnn::impl::TeamWork work;

  /// History values of one matrix: u_0 .. u_{K−1}, then v_0 .. v_{K−1}.
  static KOKKOS_INLINE_FUNCTION std::size_t history(int iters) {
    return 2 * std::size_t(iters) * N;
  }
  /// What one matrix keeps of the first iteration for its reverse, in
  /// double: P (N² values by rows), then w, the column shifts m_j and
  /// 1 / s_j (N each).
  static constexpr int kFirst = N * N + 3 * N;

  /// A team's scratch for `matrices` matrices, each value interleaved
  /// across them (value c of matrix t at c · matrices + t).
  struct Work {
    T* hist;
    double* first;
  };
  /// A matrix's first iteration in Work::first (value c at c · tile): P by
  /// rows, w, the column shifts m_j and 1 / s_j.
  struct Kept {
    double* first;
    int tile;
    KOKKOS_INLINE_FUNCTION double& p1(int i, int j) const { return first[(i * N + j) * tile]; }
    KOKKOS_INLINE_FUNCTION double& w(int i) const { return first[(N * N + i) * tile]; }
    KOKKOS_INLINE_FUNCTION double& shift(int j) const { return first[(N * N + N + j) * tile]; }
    KOKKOS_INLINE_FUNCTION double& inv_colsum(int j) const {
      return first[(N * N + 2 * N + j) * tile];
    }
  };

  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s, int iters, int matrices) {
    Work w;
    w.hist = s.take<T>(history(iters) * std::size_t(matrices));
    w.first = s.take<double>(std::size_t(kFirst) * matrices);
    return w;
  }

  /// Plans and runs the launch; `launch`'s tile (matrices per team) and team
  /// size apply, its vector length (checked by run_matrix_form) does not.
  void run(const char* op, const ExecSpace& space, const Launch& launch, Step step = Step::launch) {
    Launch request = launch;
    request.vector_length = 0;  // one thread per matrix: no vector lanes
    const int iters = this->iters;
    const auto plan = kdnn::impl::plan_system_tiles<ExecSpace, UnrolledBackwardThreadKernel>(
        op, space, batch, 1, request,
        [&](int matrices) {
          return kdnn::impl::layout_bytes(
              [&](kdnn::impl::ScratchCarver& s) { carve(s, iters, matrices); });
        },
        "iters=" + std::to_string(this->iters) + " at n=" + std::to_string(N), "matrix");
    tile = plan.tile;
    if (step == Step::plan_only) return;
    plan.launch(std::string("kdnn::") + op + "[thread n=" + std::to_string(N) + "]", space, *this);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    work.for_each(team, [&](int item, void* scratch) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tile), [&](int t) {
        // In 64 bits: the last tile may reach past batch ≈ 2^31.
        const long long b = static_cast<long long>(item) * tile + t;
        if (b >= batch) return;
        kdnn::impl::ScratchCarver carver(scratch);
        Work w = carve(carver, this->iters, tile);
        w.hist += t;
        w.first += t;
        if (transpose) {
          matrix<true>(int(b), w);
        } else {
          matrix<false>(int(b), w);
        }
      });
    });
  }

  /// Element (i, j) of a matrix with row stride ld, or of its transpose.
  template <bool Tr, class V>
  static KOKKOS_FORCEINLINE_FUNCTION V& at(V* p, int ld, int i, int j) {
    return Tr ? p[j * ld + i] : p[i * ld + j];
  }

  /// Matrix b; its history at w.hist[c · tile], c < 2·K·N, and its first
  /// iteration at w.first[c · tile], c < kFirst.
  template <bool Tr>
  KOKKOS_INLINE_FUNCTION void matrix(int b, const Work& w) const {
    const T* x = this->X.data() + std::size_t(b) * this->X.stride(0);
    const T* g = this->G.data() + std::size_t(b) * this->G.stride(0);
    T* dx = this->dX.data() + std::size_t(b) * this->dX.stride(0);
    const int ldx = int(this->X.stride(1)), ldg = int(this->G.stride(1));
    const int ldd = int(this->dX.stride(1));
    const int K = this->iters;
    const T e = T(this->eps);
    const auto u_at = [&](int k, int i) -> T& { return w.hist[std::size_t(k * N + i) * tile]; };
    const auto v_at = [&](int k, int j) -> T& {
      return w.hist[std::size_t((K + k) * N + j) * tile];
    };
    const Kept kept{w.first, tile};

    // Iteration 1 in double (kept in scratch for its reverse); P = T(P1) by
    // rows and by columns; u_0 = v_0 = 1.
    T p[N][N], pt[N][N], u[N], v[N];
    {
      double shift[N], inv_colsum[N];
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) {
        first_column(
            N, [&](int i) { return double(at<Tr>(x, ldx, i, j)); }, [](int, double) {}, shift[j],
            inv_colsum[j]);
        kept.shift(j) = shift[j];
        kept.inv_colsum(j) = inv_colsum[j];
      }
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) {
        kept.w(i) = first_row(
            N, [&](int j) { return compat::exp(double(at<Tr>(x, ldx, i, j)) - shift[j]); },
            [&](int j) { return double(at<Tr>(x, ldx, i, j)); }, [&](int j) { return shift[j]; },
            [&](int j) { return inv_colsum[j]; }, this->eps,
            [&](int j, double pij) {
              kept.p1(i, j) = pij;
              pt[j][i] = p[i][j] = T(pij);
            });
        u[i] = v[i] = T(1);
        u_at(0, i) = v_at(0, i) = T(1);
      }
    }

    // Replay: v_k from the column sums, u_k from the row sums.
    KDNN_IMPL_NO_UNROLL
    for (int k = 1; k < K; ++k) {
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) v_at(k, j) = v[j] = rescaled(v[j], lane_dot<N>(pt[j], u), e);
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) u_at(k, i) = u[i] = rescaled(u[i], lane_dot<N>(p[i], v), e);
    }

    // The adjoints at the output, W = G∘P: dv = Wᵀu_{K−1}, du = W v_{K−1}
    // (G is read again at the end rather than held through the sweep).
    const auto gm = [&](int i, int j) { return at<Tr>(g, ldg, i, j); };
    T du[N], dv[N];
    KDNN_IMPL_UNROLL
    for (int j = 0; j < N; ++j) {
      T s = 0;
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) s += gm(i, j) * pt[j][i] * u[i];
      dv[j] = s;
    }
    double dp[N][N];
    KDNN_IMPL_UNROLL
    for (int i = 0; i < N; ++i) {
      T s = 0;
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) {
        s += gm(i, j) * p[i][j] * v[j];
        dp[i][j] = 0;
      }
      du[i] = s;
    }

    // Reverse sweep, k = K−1 .. 1, with u = u_k and v = v_k on entry; each
    // step's rank-1 terms dr_k v_kᵀ + u_{k−1} dc_kᵀ added to dP.
    KDNN_IMPL_NO_UNROLL
    for (int k = K - 1; k >= 1; --k) {
      T u_prev[N], v_prev[N];
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) {
        u_prev[i] = u_at(k - 1, i);
        v_prev[i] = v_at(k - 1, i);
      }
      reverse_step(p, pt, u_prev, v_prev, e, u, v, du, dv, dp);
    }

    // dP and the first iteration's reverse, from u_{K−1} and v_{K−1}.
    T u_last[N], v_last[N];
    KDNN_IMPL_UNROLL
    for (int i = 0; i < N; ++i) {
      u_last[i] = u_at(K - 1, i);
      v_last[i] = v_at(K - 1, i);
    }
    first_iteration_reverse<Tr>(x, ldx, dx, ldd, gm, kept, u_last, v_last, dp);
  }

  /// One step of the reverse sweep, with u = u_k and v = v_k on entry
  /// (u_{k−1}, v_{k−1} on return): du and dv stepped back, and the step's
  /// rank-1 terms dr_k v_kᵀ + u_{k−1} dc_kᵀ added to dP.
  static KOKKOS_FORCEINLINE_FUNCTION void reverse_step(const T (&p)[N][N], const T (&pt)[N][N],
                                                       const T (&u_prev)[N], const T (&v_prev)[N],
                                                       T e, T (&u)[N], T (&v)[N], T (&du)[N],
                                                       T (&dv)[N], double (&dp)[N][N]) {
    T dr[N], dc[N];
    KDNN_IMPL_UNROLL
    for (int i = 0; i < N; ++i) {
      dr[i] = -du[i] * u[i] * u[i];
      if (e == 0) {
        du[i] = T(0);
      } else {
        const T ratio = u[i] / u_prev[i];
        du[i] *= e * ratio * ratio;
      }
    }
    KDNN_IMPL_UNROLL
    for (int j = 0; j < N; ++j) {
      dv[j] += lane_dot<N>(pt[j], dr);
      dc[j] = -dv[j] * v[j] * v[j];
      if (e == 0) {
        dv[j] = T(0);
      } else {
        const T ratio = v[j] / v_prev[j];
        dv[j] *= e * ratio * ratio;
      }
    }
    KDNN_IMPL_UNROLL
    for (int i = 0; i < N; ++i) {
      du[i] += lane_dot<N>(p[i], dc);
      const double dri = dr[i], ui = u_prev[i];
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) dp[i][j] += dri * double(v[j]) + ui * double(dc[j]);
    }
    KDNN_IMPL_UNROLL
    for (int i = 0; i < N; ++i) {
      u[i] = u_prev[i];
      v[i] = v_prev[i];
    }
  }

  /// dP = G∘(u_{K−1} v_{K−1}ᵀ) + the sweep's sum `dp`, rounded to T once (as
  /// the lane form does), then the first iteration's reverse with
  /// first_iteration_reverse's sums in its order:
  ///   a_i = Σ_l dP_il P_il,  b_j = Σ_l (dP_lj − a_l)(P_lj − w_l),
  ///   dX_ij = (P_ij − w_i)(dP_ij − a_i) − S_ij b_j,
  /// a and b in one pass over the rows (b's sums in row order), dX in a
  /// second; S_ij = exp(X_ij − m_j) / s_j, as the lane form computes it.
  template <bool Tr, class Gm>
  static KOKKOS_FORCEINLINE_FUNCTION void first_iteration_reverse(
      const T* x, int ldx, T* dx, int ldd, const Gm& gm, const Kept& kept, const T (&u_last)[N],
      const T (&v_last)[N], const double (&dp)[N][N]) {
    T dpt[N][N];
    double a[N], bsum[N] = {};
    KDNN_IMPL_UNROLL
    for (int i = 0; i < N; ++i) {
      double s = 0;
      KDNN_IMPL_UNROLL
      for (int l = 0; l < N; ++l) {
        dpt[i][l] = T(double(gm(i, l) * u_last[i] * v_last[l]) + dp[i][l]);
        s += double(dpt[i][l]) * kept.p1(i, l);
      }
      a[i] = s;
      const double wi = kept.w(i);
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) bsum[j] += (double(dpt[i][j]) - a[i]) * (kept.p1(i, j) - wi);
    }
    KDNN_IMPL_UNROLL
    for (int i = 0; i < N; ++i) {
      const double wi = kept.w(i);
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) {
        const double S =
            compat::exp(double(at<Tr>(x, ldx, i, j)) - kept.shift(j)) * kept.inv_colsum(j);
        at<Tr>(dx, ldd, i, j) = T((kept.p1(i, j) - wi) * (double(dpt[i][j]) - a[i]) - S * bsum[j]);
      }
    }
  }
};

}  // namespace kdnn::sinkhorn::impl
