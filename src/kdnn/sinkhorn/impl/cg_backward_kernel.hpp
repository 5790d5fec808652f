// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Sinkhorn backward by implicit differentiation, with CG on either the n×n
// Schur system (implicit) or the 2n×2n block system (block). One team thread
// per matrix; R, W = G∘R and the CG vectors live in team scratch.
//
// With a = R1 and c = Rᵀ1 (Marginals::measured) or a = c = 1
// (Marginals::unit), the adjoint of the balancing conditions is
// [[D_a, R], [Rᵀ, D_c]] [u; v] = [s_r; s_c] with s_r = W1, s_c = Wᵀ1, and
// dX = W − (u1ᵀ + 1vᵀ)∘R.
//   implicit: (D_c − Rᵀ D_a⁻¹ R) v = s_c − Rᵀ D_a⁻¹ s_r, u = D_a⁻¹(s_r − Rv),
//             applied matrix-free as Sp = c∘p − Rᵀ(D_a⁻¹(Rp)); null space 1.
//   block:    the 2n×2n system itself; null space [1; −1].
// With measured marginals both systems are consistent for any R: the matrix
// is positive semidefinite (pᵀAp = Σ_ij R_ij (p_i + q_j)² for p = [p; q]),
// its null space is exactly the one above, and the right-hand side is
// orthogonal to it (1ᵀs_r = 1ᵀs_c = Σ W). With unit marginals they are
// consistent only for a doubly stochastic R.
// The report gets R's marginal error max(|a − 1|, |c − 1|) (measured sums)
// and CG's final relative residual.
#include "kdnn/core/impl/col_dot.hpp"
#include "kdnn/core/impl/projected_cg.hpp"
#include "kdnn/sinkhorn/impl/cg_backward_data.hpp"
#include "kdnn/sinkhorn/impl/launch.hpp"
#include "kdnn/sinkhorn/impl/marginal_error.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T>
struct CGBackwardKernel : PerMatrixKernel<CGBackwardKernel<ExecSpace, T>, ExecSpace>,
                          CGBackwardData<ExecSpace, T> {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Data = CGBackwardData<ExecSpace, T>;
  using Data::block;
  using Data::dX;
  using Data::G;
  using Data::max_iters;
  using Data::measured;
  using Data::R;
  using Data::rtol;

  /// One matrix's working set: R, Rᵀ and W = G∘R (n×ld) and the vectors of
  /// CGBackwardData::carve_vectors.
  struct Work {
    T *R, *RT, *W, *sr, *sc, *a, *c, *q, *x, *r, *p, *Ap;
  };
  KOKKOS_INLINE_FUNCTION Work carve(ScratchCarver& s) const {
    const int n = this->n;
    const int ld = scratch_ld(n);
    Work w;
    w.R = s.take<T>(n * ld);
    w.RT = s.take<T>(n * ld);
    w.W = s.take<T>(n * ld);
    Data::carve_vectors(s, n, w);
    return w;
  }
  KOKKOS_INLINE_FUNCTION void one_matrix(const Member& team, int b, const Work& w) const {
    const int n = this->n;
    const int ld = scratch_ld(n);
    T* Rm = w.R;
    T* RT = w.RT;
    T* W = w.W;
    T* sr = w.sr;  // s_r, then u
    T* sc = w.sc;
    T* a = w.a;
    T* c = w.c;
    T* q = w.q;
    T* x = w.x;
    T* r = w.r;
    T* p = w.p;
    T* Ap = w.Ap;
    const auto lanes = Kokkos::ThreadVectorRange(team, n);

    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) {
        Rm[i * ld + j] = R(b, i, j);
        RT[j * ld + i] = Rm[i * ld + j];
        W[i * ld + j] = G(b, i, j) * Rm[i * ld + j];
      });
    }
    Kokkos::parallel_for(lanes, [&](int k) {
      T w_row = 0, w_col = 0, r_row = 0, r_col = 0;
      for (int l = 0; l < n; ++l) {
        w_row += W[k * ld + l];
        w_col += W[l * ld + k];
        r_row += Rm[k * ld + l];
        r_col += Rm[l * ld + k];
      }
      sr[k] = w_row;
      sc[k] = w_col;
      a[k] = r_row;
      c[k] = r_col;
    });
    const double r_marginal_error = marginal_error(team, n, a, c);
    // The marginals the system balances to.
    const auto a_of = [&](int i) { return measured ? a[i] : T(1); };
    const auto c_of = [&](int j) { return measured ? c[j] : T(1); };

    // Products with R and Rᵀ are col_dot calls on Rᵀ and R respectively.
    kdnn::impl::CGResult cg;
    if (block) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, 2 * n),
                           [&](int k) { r[k] = k < n ? sr[k] : sc[k - n]; });
      auto apply = [&](const T* in, T* out) {  // [a∘in_u + R in_v; c∘in_v + Rᵀ in_u]
        kdnn::impl::col_dot<ExecSpace>(team, n, RT, ld, in + n,
                                       [&](int i, T s) { out[i] = a_of(i) * in[i] + s; });
        kdnn::impl::col_dot<ExecSpace>(team, n, Rm, ld, in,
                                       [&](int j, T s) { out[n + j] = c_of(j) * in[n + j] + s; });
      };
      cg = kdnn::impl::projected_cg(kdnn::impl::LaneLoops<Member>{team, 2 * n}, n, rtol, max_iters,
                                    x, r, p, Ap, apply);
      Kokkos::parallel_for(lanes, [&](int i) { sr[i] = x[i]; });  // u
    } else {
      // b = s_c − Rᵀ D_a⁻¹ s_r
      Kokkos::parallel_for(lanes, [&](int i) { q[i] = sr[i] / a_of(i); });
      kdnn::impl::col_dot<ExecSpace>(team, n, Rm, ld, q, [&](int j, T s) { r[j] = sc[j] - s; });
      auto apply = [&](const T* in, T* out) {  // c∘in − Rᵀ D_a⁻¹ R in
        kdnn::impl::col_dot<ExecSpace>(team, n, RT, ld, in,
                                       [&](int i, T s) { q[i] = s / a_of(i); });
        kdnn::impl::col_dot<ExecSpace>(team, n, Rm, ld, q,
                                       [&](int j, T s) { out[j] = c_of(j) * in[j] - s; });
      };
      cg = kdnn::impl::projected_cg(kdnn::impl::LaneLoops<Member>{team, n}, n, rtol, max_iters, x,
                                    r, p, Ap, apply);
      // u = D_a⁻¹ (s_r − R v), written over s_r.
      kdnn::impl::col_dot<ExecSpace>(team, n, RT, ld, x,
                                     [&](int i, T s) { sr[i] = (sr[i] - s) / a_of(i); });
    }
    const T* u = sr;
    const T* v = block ? x + n : x;
    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(
          lanes, [&](int j) { dX(b, i, j) = W[i * ld + j] - (u[i] + v[j]) * Rm[i * ld + j]; });
    }
    this->report(team, b, cg, r_marginal_error);
  }
};

}  // namespace kdnn::sinkhorn::impl
