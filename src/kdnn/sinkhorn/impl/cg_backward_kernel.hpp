#pragma once
// Sinkhorn backward by implicit differentiation, with CG on either the n×n
// Schur system (implicit) or the 2n×2n block system (block). One team thread
// per matrix; R, W = G∘R and the CG vectors live in team scratch.
//
// With a = R1 and c = Rᵀ1 (both 1 unless measured_marginals), the adjoint of
// the balancing conditions is [[D_a, R], [Rᵀ, D_c]] [u; v] = [s_r; s_c] with
// s_r = W1, s_c = Wᵀ1, and dX = W − (u1ᵀ + 1vᵀ)∘R.
//   implicit: (D_c − Rᵀ D_a⁻¹ R) v = s_c − Rᵀ D_a⁻¹ s_r, u = D_a⁻¹(s_r − Rv),
//             applied matrix-free as Sp = c∘p − Rᵀ(D_a⁻¹(Rp)); null space 1.
//   block:    the 2n×2n system itself (a = c = 1); null space [1; −1].
#include "kdnn/sinkhorn/impl/col_dot.hpp"
#include "kdnn/sinkhorn/impl/launch.hpp"
#include "kdnn/sinkhorn/impl/team_vector_cg.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T>
struct CGBackwardKernel {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;

  Batch<const T, ExecSpace> R, G;
  Batch<T, ExecSpace> dX;
  Kokkos::View<int*, typename ExecSpace::memory_space> iters_out;
  Kokkos::View<double*, typename ExecSpace::memory_space> error_out;
  int batch = 0, n = 0, tile = 1, level = 0, max_iters = 0;
  double rtol = 0;
  bool block = false, measured = false;

  /// Per matrix: R, Rᵀ and W (n×ld each) and 13 vectors of n.
  KOKKOS_INLINE_FUNCTION static std::size_t matrix_elems(int n) { return std::size_t(n) * (3 * scratch_ld(n) + 13); }
  static std::size_t scratch_bytes(int n, int tile) {
    return scratch_vec_bytes<T, ExecSpace>(tile * matrix_elems(n));
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    ScratchVec<T, ExecSpace> work(team.team_scratch(level), tile * matrix_elems(n));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tile), [&](int t) {
      const int b = team.league_rank() * tile + t;
      if (b < batch) one_matrix(team, b, &work(t * matrix_elems(n)));
    });
  }

  KOKKOS_INLINE_FUNCTION void one_matrix(const Member& team, int b, T* work) const {
    const int ld = scratch_ld(n);
    T* Rm = work;
    T* RT = Rm + n * ld;
    T* W = RT + n * ld;
    T* sr = W + n * ld;  // s_r, then u
    T* sc = sr + n;
    T* inv_a = sc + n;
    T* c = inv_a + n;
    T* q = c + n;
    T* x = q + n;  // 2n each from here on
    T* r = x + 2 * n;
    T* p = r + 2 * n;
    T* Ap = p + 2 * n;
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
      inv_a[k] = measured ? T(1) / r_row : T(1);
      c[k] = measured ? r_col : T(1);
    });

    // Products with R and Rᵀ are col_dot calls on Rᵀ and R respectively.
    CGResult cg;
    if (block) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, 2 * n),
                           [&](int k) { r[k] = k < n ? sr[k] : sc[k - n]; });
      auto apply = [&](const T* in, T* out) {  // [in_u + R in_v; in_v + Rᵀ in_u]
        col_dot<ExecSpace>(team, n, RT, ld, in + n, [&](int i, T s) { out[i] = in[i] + s; });
        col_dot<ExecSpace>(team, n, Rm, ld, in,
                           [&](int j, T s) { out[n + j] = in[n + j] + s; });
      };
      cg = team_vector_cg(team, 2 * n, n, rtol, max_iters, x, r, p, Ap, apply);
      Kokkos::parallel_for(lanes, [&](int i) { sr[i] = x[i]; });  // u
    } else {
      // b = s_c − Rᵀ D_a⁻¹ s_r
      Kokkos::parallel_for(lanes, [&](int i) { q[i] = inv_a[i] * sr[i]; });
      col_dot<ExecSpace>(team, n, Rm, ld, q, [&](int j, T s) { r[j] = sc[j] - s; });
      auto apply = [&](const T* in, T* out) {  // c∘in − Rᵀ D_a⁻¹ R in
        col_dot<ExecSpace>(team, n, RT, ld, in, [&](int i, T s) { q[i] = inv_a[i] * s; });
        col_dot<ExecSpace>(team, n, Rm, ld, q, [&](int j, T s) { out[j] = c[j] * in[j] - s; });
      };
      cg = team_vector_cg(team, n, n, rtol, max_iters, x, r, p, Ap, apply);
      // u = D_a⁻¹ (s_r − R v), written over s_r.
      col_dot<ExecSpace>(team, n, RT, ld, x, [&](int i, T s) { sr[i] = inv_a[i] * (sr[i] - s); });
    }
    const T* u = sr;
    const T* v = block ? x + n : x;
    for (int i = 0; i < n; ++i) {
      Kokkos::parallel_for(lanes, [&](int j) {
        dX(b, i, j) = W[i * ld + j] - (u[i] + v[j]) * Rm[i * ld + j];
      });
    }
    Kokkos::single(Kokkos::PerThread(team), [&]() {
      if (iters_out.extent(0) > 0) iters_out(b) = cg.iterations;
      if (error_out.extent(0) > 0) error_out(b) = cg.relative_residual;
    });
  }
};

}  // namespace kdnn::sinkhorn::impl
