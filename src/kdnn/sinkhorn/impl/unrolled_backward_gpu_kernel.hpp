// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Sinkhorn unrolled backward, lane form (kdnn::KernelForm::gpu), for a
// compile-time n = N in LaneFormSizes (n <= 4 takes the thread form,
// unrolled_backward_thread_kernel.hpp); the recurrences are
// UnrolledBackwardKernel's (unrolled_backward_kernel.hpp). Lane k of a matrix
// keeps row k and column k of P in registers, as the GPU forward does, so
// every product of the replay and of the reverse sweep is a lane-local dot
// product over a vector every lane reads from scratch:
//
//   replay, k = 1 .. K−1:  lane j: v_k,j from column j · u_{k−1}
//                          lane i: u_k,i from row i · v_k
//   reverse, k = K−1 .. 1: lane i: dr_k,i and du_i (its own entries)
//                          lane j: dv_j += column j · dr_k, then dc_k,j, dv_j
//                          lane i: du_i += row i · dc_k
//
// du and dv never leave their lanes; dr_k and dc_k are exchanged through two
// scratch vectors. The scaling vectors u_k, v_k (k < K) are kept in scratch,
// K·N values each, which is what bounds this form: when one matrix's history
// does not fit on-chip (level 0), backward_unrolled runs the host form.
//
// dP = dL/dP = G∘(u_{K−1} v_{K−1}ᵀ) + Σ_k (dr_k v_kᵀ + u_{k−1} dc_kᵀ) is
// accumulated during the sweep, lane i holding the sum for row i in double
// registers (from k = K−1 down), and rounded to T once, when the first term
// is added at the end. The host form stores the 2(K−1) vectors and sums the
// terms in T from k = 1 up, dr terms first; near convergence consecutive
// terms nearly cancel, and that sum loses digits as K grows (float, n = 2,
// K = 100: up to 2e-4 relative in dP, against one rounding here). That is the
// only difference in the arithmetic, and it is why the two forms agree to
// the host form's accuracy rather than bitwise (bitwise for K <= 2, where
// the sum has at most one step); everything before it (the first iteration
// in double, the replay, du, dv, dr, dc) and the first iteration's reverse
// after it are the host form's operations in its order.
//
// Loads and stores are by columns (lane j reads column j of X and G and
// writes column j of dX); rows reach the lanes through a tile in scratch: P
// and G on the way in, dP on the way out. The first iteration's P is kept in
// double (its reverse needs it) in a second tile.
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/unroll.hpp"
#include "kdnn/sinkhorn/impl/first_iteration.hpp"
#include "kdnn/sinkhorn/impl/gpu_matrix_kernel.hpp"
#include "kdnn/sinkhorn/impl/rescale.hpp"
#include "kdnn/sinkhorn/impl/unrolled_backward_data.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T, int N>
struct UnrolledBackwardGpuKernel
    : GpuMatrixKernel<UnrolledBackwardGpuKernel<ExecSpace, T, N>, ExecSpace, N>,
      UnrolledBackwardData<ExecSpace, T> {
  using Base = GpuMatrixKernel<UnrolledBackwardGpuKernel, ExecSpace, N>;
  using Data = UnrolledBackwardData<ExecSpace, T>;
  using Member = typename Base::Member;
  static constexpr bool kPrivate = Base::kPrivate;
  static constexpr int kLd = Base::kLd;
  using Data::dX;
  using Data::eps;
  using Data::G;
  using Data::iters;
  using Data::X;

  bool transpose = false;

  /// One matrix's scratch: the scaling vectors U = [u_0 .. u_{K−1}] and
  /// V = [v_0 .. v_{K−1}] (K×N each), a tile (P, then G, then dP), the
  /// exchanged dr and dc; in double, the first iteration's P (a tile), its
  /// statistics and the reverse's row sums a.
  struct Work {
    T *U, *V, *tile, *dr, *dc;
    double *P1, *shift, *inv_colsum, *row_eps, *a;
  };
  KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s) const {
    const std::size_t history = std::size_t(iters) * N;
    Work w;
    w.U = s.take<T>(history);
    w.V = s.take<T>(history);
    w.tile = s.take<T>(N * kLd);
    w.dr = s.take<T>(N);
    w.dc = s.take<T>(N);
    w.P1 = s.take<double>(N * kLd);
    w.shift = s.take<double>(N);
    w.inv_colsum = s.take<double>(N);
    w.row_eps = s.take<double>(N);
    w.a = s.take<double>(N);
    return w;
  }
  KOKKOS_INLINE_FUNCTION void one_matrix(const Member& team, int b, const Work& w) const {
    if (transpose) {
      oriented<true>(team, b, w);
    } else {
      oriented<false>(team, b, w);
    }
  }

  /// Matrix b, columns first on X and G (or on Xᵀ and Gᵀ if Tr: rows first).
  template <bool Tr>
  KOKKOS_INLINE_FUNCTION void oriented(const Member& team, int b, const Work& w) const {
    const T* x = X.data() + std::size_t(b) * X.stride(0);
    const T* g = G.data() + std::size_t(b) * G.stride(0);
    T* dx = dX.data() + std::size_t(b) * dX.stride(0);
    const int ldx = int(X.stride(1)), ldg = int(G.stride(1)), ldd = int(dX.stride(1));
    const int K = iters;
    const T e = T(eps);
    const auto lanes = Kokkos::ThreadVectorRange(team, N);
    const auto xd = [&](int i, int j) { return double(Base::template at<Tr>(x, ldx, i, j)); };
    T* const U = w.U;
    T* const V = w.V;
    LaneRegisters<T, N, N, kPrivate> row;      // lane i: P_i·
    LaneRegisters<T, N, N, kPrivate> col;      // lane j: P_·j
    LaneRegisters<double, N, N, kPrivate> dP;  // lane i: the sweep's sum for dP_i·
    LaneRegisters<T, N, 1, kPrivate> du;       // lane i: du_i
    LaneRegisters<T, N, 1, kPrivate> dv;       // lane j: dv_j

    // Iteration 1 in double, as the GPU forward runs it; P1 kept in double,
    // P = T(P1) in the registers; u_0 = v_0 = 1.
    Base::first_iteration_lanes(
        team, xd, eps, w.shift, w.inv_colsum, w.tile,
        [&](int i, int j, double pij) { w.P1[i * kLd + j] = pij; },
        [&](int i, double w_i) {
          w.row_eps[i] = w_i;
          U[i] = V[i] = T(1);
        },
        row, col);

    // Replay: v_k from the column sums, u_k from the row sums (rescale.hpp).
    for (int k = 1; k < K; ++k) {
      const T* u_prev = U + (k - 1) * N;
      T* v_k = V + k * N;
      Kokkos::parallel_for(lanes, [&](int j) {
        v_k[j] = rescaled(V[(k - 1) * N + j], lane_dot_shared<N>(col(j), u_prev), e);
      });
      Kokkos::parallel_for(lanes, [&](int i) {
        U[k * N + i] = rescaled(u_prev[i], lane_dot_shared<N>(row(i), v_k), e);
      });
    }

    // The adjoints at the output, W = G∘P: dv = Wᵀu_{K−1} (lane j reads
    // column j of G and puts it in the tile, where it stays for dP's last
    // term) and du = W v_{K−1} (lane i, row i of G from the tile).
    const T* u_last = U + (K - 1) * N;
    const T* v_last = V + (K - 1) * N;
    Kokkos::parallel_for(lanes, [&](int j) {
      const T* pc = col(j);
      T s = 0;
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) {
        const T gij = Base::template at<Tr>(g, ldg, i, j);
        w.tile[i * kLd + j] = gij;
        s += gij * pc[i] * u_last[i];
      }
      dv(j)[0] = s;
    });
    Kokkos::parallel_for(lanes, [&](int i) {
      const T* pr = row(i);
      double* dp = dP(i);
      T s = 0;
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) {
        s += w.tile[i * kLd + j] * pr[j] * v_last[j];
        dp[j] = 0;
      }
      du(i)[0] = s;
    });

    // Reverse sweep, k = K−1 .. 1.
    for (int k = K - 1; k >= 1; --k) reverse_step(team, w, k, e, row, col, dP, du, dv);

    // dP and the first iteration's reverse, from u_{K−1} and v_{K−1}.
    first_iteration_reverse<Tr>(team, w, x, ldx, dx, ldd, u_last, v_last, dP);
  }

  /// Step k of the reverse sweep (UnrolledBackwardKernel's reverse_rescale
  /// and col_dot steps, lane by lane): du and dv stepped back, the step's
  /// rank-1 terms added to dP.
  template <class Rows, class Cols, class DP, class Adjoint>
  static KOKKOS_FORCEINLINE_FUNCTION void reverse_step(const Member& team, const Work& w, int k,
                                                       T e, Rows& row, Cols& col, DP& dP,
                                                       Adjoint& du, Adjoint& dv) {
    const auto lanes = Kokkos::ThreadVectorRange(team, N);
    const T* u_k = w.U + k * N;
    const T* u_prev = w.U + (k - 1) * N;
    const T* v_k = w.V + k * N;
    const T* v_prev = w.V + (k - 1) * N;
    Kokkos::parallel_for(lanes, [&](int i) {
      T& d = du(i)[0];
      w.dr[i] = -d * u_k[i] * u_k[i];
      if (e == 0) {
        d = T(0);
      } else {
        const T ratio = u_k[i] / u_prev[i];
        d *= e * ratio * ratio;
      }
    });
    Kokkos::parallel_for(lanes, [&](int j) {
      T& d = dv(j)[0];
      d += lane_dot_shared<N>(col(j), w.dr);
      w.dc[j] = -d * v_k[j] * v_k[j];
      if (e == 0) {
        d = T(0);
      } else {
        const T ratio = v_k[j] / v_prev[j];
        d *= e * ratio * ratio;
      }
    });
    Kokkos::parallel_for(lanes, [&](int i) {
      du(i)[0] += lane_dot_shared<N>(row(i), w.dc);
      double* dp = dP(i);
      const double dri = w.dr[i], ui = u_prev[i];
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) dp[j] += dri * double(v_k[j]) + ui * double(w.dc[j]);
    });
  }

  /// dP = G∘(u_{K−1} v_{K−1}ᵀ) + the sweep's sum, as the host form adds
  /// them (the small terms summed before the large one is added), into the
  /// tile over G. Then the first iteration's reverse
  /// (first_iteration_reverse, its sums in its order): lane i,
  /// a_i = Σ_l dP_il P_il; lane j, b_j = Σ_l (dP_lj − a_l)(P_lj − w_l), then
  /// column j of dX.
  template <bool Tr, class DP>
  static KOKKOS_FORCEINLINE_FUNCTION void first_iteration_reverse(const Member& team, const Work& w,
                                                                  const T* x, int ldx, T* dx,
                                                                  int ldd, const T* u_last,
                                                                  const T* v_last, DP& dP) {
    const auto lanes = Kokkos::ThreadVectorRange(team, N);
    const auto xd = [&](int i, int j) { return double(Base::template at<Tr>(x, ldx, i, j)); };
    Kokkos::parallel_for(lanes, [&](int i) {
      const double* dp = dP(i);
      T* tile_i = w.tile + i * kLd;
      const T ui = u_last[i];
      double s = 0;
      KDNN_IMPL_UNROLL
      for (int l = 0; l < N; ++l) {
        tile_i[l] = T(double(tile_i[l] * ui * v_last[l]) + dp[l]);
        s += double(tile_i[l]) * w.P1[i * kLd + l];
      }
      w.a[i] = s;
    });
    Kokkos::parallel_for(lanes, [&](int j) {
      double bj = 0;
      for (int l = 0; l < N; ++l) {
        bj += (double(w.tile[l * kLd + j]) - w.a[l]) * (w.P1[l * kLd + j] - w.row_eps[l]);
      }
      for (int i = 0; i < N; ++i) {
        const double S = compat::exp(xd(i, j) - w.shift[j]) * w.inv_colsum[j];
        Base::template at<Tr>(dx, ldd, i, j) =
            T((w.P1[i * kLd + j] - w.row_eps[i]) * (double(w.tile[i * kLd + j]) - w.a[i]) - S * bj);
      }
    });
  }
};

}  // namespace kdnn::sinkhorn::impl
