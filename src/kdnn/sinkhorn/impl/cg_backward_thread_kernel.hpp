// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Sinkhorn implicit and block backwards, thread form (matrix_forms.hpp), for
// a compile-time n = N in ThreadMatrixSizes (1 … 4): one thread per matrix.
// R, W = G∘R, the system's right-hand side and CG's vectors live in local
// arrays that every loop indexes with compile-time constants (N known, loops
// unrolled, projected_cg over ThreadLoops), so on a GPU they stay in
// registers: nothing goes to scratch and no lane waits for another. R, G
// and dX move whole (matrix_copy.hpp: 16-byte accesses where a matrix is
// contiguous and aligned).
//
// The systems and the method are CGBackwardKernel's (cg_backward_kernel.hpp),
// operation for operation: the sums of R and W from 0 in index order, every
// product with R or Rᵀ a dot product in index order (lane_dot, as col_dot
// sums), the same projected CG and the same report. Where the vector loops
// are plain loops and a·b + c is not contracted (a host backend), the two
// forms give bitwise the same dX and report; elsewhere they agree to
// rounding, and CG, which amplifies rounding by the system's conditioning,
// to its tolerance.
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/matrix_copy.hpp"
#include "kdnn/core/impl/projected_cg.hpp"
#include "kdnn/core/impl/unroll.hpp"
#include "kdnn/core/impl/vector_loops.hpp"
#include "kdnn/core/nan_max.hpp"
#include "kdnn/sinkhorn/impl/cg_backward_data.hpp"
#include "kdnn/sinkhorn/impl/gpu_matrix_kernel.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T, int N>
struct CGBackwardThreadKernel : CGBackwardData<ExecSpace, T> {
  using Data = CGBackwardData<ExecSpace, T>;
  int batch = 0;

  void run(const ExecSpace& space) const {
    Kokkos::parallel_for("kdnn::sinkhorn::backward[thread]",
                         Kokkos::RangePolicy<ExecSpace>(space, 0, batch), *this);
  }

  KOKKOS_INLINE_FUNCTION void operator()(int b) const {
    if (this->block) {
      matrix<true>(b);
    } else {
      matrix<false>(b);
    }
  }

  /// Matrix b, by the block system or the implicit one (a compile-time
  /// choice, so that no array is indexed by a run-time offset).
  template <bool Block>
  KOKKOS_INLINE_FUNCTION void matrix(int b) const {
    const T* rg = this->R.data() + std::size_t(b) * this->R.stride(0);
    const T* gg = this->G.data() + std::size_t(b) * this->G.stride(0);
    T* dxg = this->dX.data() + std::size_t(b) * this->dX.stride(0);
    const int ldr = int(this->R.stride(1)), ldg = int(this->G.stride(1));
    const int ldd = int(this->dX.stride(1));

    // R by rows and by columns (the same registers), W = G∘R (G loaded in
    // its place).
    T r[N][N], rt[N][N], w[N][N];
    kdnn::impl::load_matrix<N>(rg, ldr, r);
    kdnn::impl::load_matrix<N>(gg, ldg, w);
    KDNN_IMPL_UNROLL
    for (int i = 0; i < N; ++i) {
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) {
        rt[j][i] = r[i][j];
        w[i][j] = w[i][j] * r[i][j];
      }
    }
    // s_r = W1, s_c = Wᵀ1, a = R1, c = Rᵀ1.
    T sr[N], sc[N], a[N], c[N];
    KDNN_IMPL_UNROLL
    for (int k = 0; k < N; ++k) {
      T w_row = 0, w_col = 0, r_row = 0, r_col = 0;
      KDNN_IMPL_UNROLL
      for (int l = 0; l < N; ++l) {
        w_row += w[k][l];
        w_col += w[l][k];
        r_row += r[k][l];
        r_col += r[l][k];
      }
      sr[k] = w_row;
      sc[k] = w_col;
      a[k] = r_row;
      c[k] = r_col;
    }
    const double r_marginal_error = thread_nan_max(
        2 * N, [&](int k) { return compat::fabs(double(k < N ? a[k] : c[k - N]) - 1.0); });
    const bool measured = this->measured;
    const auto a_of = [&](int i) { return measured ? a[i] : T(1); };
    const auto c_of = [&](int j) { return measured ? c[j] : T(1); };

    // CG's vectors: 2N entries for the block system, N for the implicit one.
    constexpr int M = Block ? 2 * N : N;
    T x[M], res[M], p[M], Ap[M], u[N], v[N];
    kdnn::impl::CGResult cg;
    if constexpr (Block) {
      KDNN_IMPL_UNROLL
      for (int k = 0; k < 2 * N; ++k) res[k] = k < N ? sr[k] : sc[k - N];
      auto apply = [&](const T* in, T* out) {  // [a∘in_u + R in_v; c∘in_v + Rᵀ in_u]
        KDNN_IMPL_UNROLL
        for (int k = 0; k < N; ++k) {
          out[k] = a_of(k) * in[k] + lane_dot<N>(r[k], in + N);
          out[N + k] = c_of(k) * in[N + k] + lane_dot<N>(rt[k], in);
        }
      };
      cg = kdnn::impl::projected_cg(kdnn::impl::ThreadLoops<M>{}, N, this->rtol, this->max_iters, x,
                                    res, p, Ap, apply);
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) {
        u[i] = x[i];
        v[i] = x[N + i];
      }
    } else {
      // b = s_c − Rᵀ D_a⁻¹ s_r
      T q[N];
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) q[i] = sr[i] / a_of(i);
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) res[j] = sc[j] - lane_dot<N>(rt[j], q);
      auto apply = [&](const T* in, T* out) {  // c∘in − Rᵀ D_a⁻¹ R in
        T qa[N];
        KDNN_IMPL_UNROLL
        for (int i = 0; i < N; ++i) qa[i] = lane_dot<N>(r[i], in) / a_of(i);
        KDNN_IMPL_UNROLL
        for (int j = 0; j < N; ++j) out[j] = c_of(j) * in[j] - lane_dot<N>(rt[j], qa);
      };
      cg = kdnn::impl::projected_cg(kdnn::impl::ThreadLoops<M>{}, N, this->rtol, this->max_iters, x,
                                    res, p, Ap, apply);
      // u = D_a⁻¹ (s_r − R v)
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) {
        u[i] = (sr[i] - lane_dot<N>(r[i], x)) / a_of(i);
        v[i] = x[i];
      }
    }
    // dX = W − (u1ᵀ + 1vᵀ)∘R, in W's place.
    KDNN_IMPL_UNROLL
    for (int i = 0; i < N; ++i) {
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) w[i][j] = w[i][j] - (u[i] + v[j]) * r[i][j];
    }
    kdnn::impl::store_matrix<N>(w, dxg, ldd);
    this->report(b, cg, r_marginal_error);
  }
};

}  // namespace kdnn::sinkhorn::impl
