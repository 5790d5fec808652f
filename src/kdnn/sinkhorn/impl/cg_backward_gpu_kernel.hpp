// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Sinkhorn implicit and block backwards, GPU form (kdnn::KernelForm::gpu),
// lane layout, for a compile-time n = N in LaneFormSizes, {8, 16, 32}
// (smaller n: the thread form, cg_backward_thread_kernel.hpp); the systems and the method
// are CGBackwardKernel's (cg_backward_kernel.hpp). Lane k of a matrix keeps
// row k and column k of R in registers, so that both products of a CG step,
// Rp (lane i: row i · p) and Rᵀq (lane j: column j · q), are lane-local dot
// products over a vector every lane reads from scratch. The CG itself is the
// host form's projected_cg on the same scratch vectors, its dot products
// summed by butterfly among the N lanes (ButterflyLoops, vector_loops.hpp),
// with no Kokkos vector reduction inside the loop.
//
// Loads and stores are by columns (lane j reads column j of R and G and
// writes column j of dX: the N lanes touch one row's N consecutive elements
// at a time); rows of R reach the lanes through a tile in scratch. W = G∘R is
// not kept: its row sums are taken from the tile, its column sums and dX
// recompute G_ij R_ij, which is the same value.
//
// Numerics are CGBackwardKernel's but for CG's dot products: the same sums
// of R and W (every one in index order, as col_dot sums), the same CG steps,
// the same report; CG's dot products are summed lane by lane and then across
// the lanes (the same bits on a host and a GPU) where the host form sums in
// index order. So the two forms agree to rounding, and CG, which amplifies
// rounding by the system's conditioning, to its tolerance.
#include "kdnn/core/impl/projected_cg.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/sinkhorn/impl/cg_backward_data.hpp"
#include "kdnn/sinkhorn/impl/gpu_matrix_kernel.hpp"
#include "kdnn/sinkhorn/impl/marginal_error.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace, class T, int N>
struct CGBackwardGpuKernel : GpuMatrixKernel<CGBackwardGpuKernel<ExecSpace, T, N>, ExecSpace, N>,
                             CGBackwardData<ExecSpace, T> {
  using Base = GpuMatrixKernel<CGBackwardGpuKernel, ExecSpace, N>;
  using Data = CGBackwardData<ExecSpace, T>;
  using Member = typename Base::Member;
  static constexpr bool kPrivate = Base::kPrivate;
  /// CG's loops: entry k on lane k mod N, sums by butterfly.
  using Loops = kdnn::impl::ButterflyLoops<N, kPrivate, Member>;
  static constexpr int kLd = Base::kLd;
  using Data::block;
  using Data::dX;
  using Data::G;
  using Data::max_iters;
  using Data::measured;
  using Data::R;
  using Data::rtol;

  /// One matrix's scratch: a tile (R, then W) and the vectors of
  /// CGBackwardData::carve_vectors.
  struct Work {
    T *tile, *sr, *sc, *a, *c, *q, *x, *r, *p, *Ap;
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s) {
    Work w;
    w.tile = s.take<T>(N * kLd);
    Data::carve_vectors(s, N, w);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void one_matrix(const Member& team, int b, const Work& w) const {
    const T* rg = R.data() + std::size_t(b) * R.stride(0);
    const T* gg = G.data() + std::size_t(b) * G.stride(0);
    T* dxg = dX.data() + std::size_t(b) * dX.stride(0);
    const int ldr = int(R.stride(1)), ldg = int(G.stride(1)), ldd = int(dX.stride(1));
    const auto lanes = Kokkos::ThreadVectorRange(team, N);
    LaneRegisters<T, N, N, kPrivate> row;  // lane i: R_i·
    LaneRegisters<T, N, N, kPrivate> col;  // lane j: R_·j

    // Lane j: column j of R, its sum c_j and s_c,j = Σ_i W_ij; R to the tile.
    Kokkos::parallel_for(lanes, [&](int j) {
      T* rc = col(j);
      T c_j = 0, sc_j = 0;
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) {
        rc[i] = rg[i * ldr + j];
        w.tile[i * kLd + j] = rc[i];
        c_j += rc[i];
        sc_j += gg[i * ldg + j] * rc[i];
      }
      w.c[j] = c_j;
      w.sc[j] = sc_j;
    });
    // Lane i: row i of R and its sum a_i; then W to the tile.
    Kokkos::parallel_for(lanes, [&](int i) {
      T* rr = row(i);
      T a_i = 0;
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) {
        rr[j] = w.tile[i * kLd + j];
        a_i += rr[j];
      }
      w.a[i] = a_i;
    });
    Kokkos::parallel_for(lanes, [&](int j) {
      const T* rc = col(j);
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) w.tile[i * kLd + j] = gg[i * ldg + j] * rc[i];
    });
    Kokkos::parallel_for(lanes, [&](int i) {
      T sr_i = 0;
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) sr_i += w.tile[i * kLd + j];
      w.sr[i] = sr_i;
    });
    const double r_marginal_error = marginal_error(team, N, w.a, w.c);
    const auto a_of = [&](int i) { return measured ? w.a[i] : T(1); };
    const auto c_of = [&](int j) { return measured ? w.c[j] : T(1); };

    kdnn::impl::CGResult cg;
    if (block) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, 2 * N),
                           [&](int k) { w.r[k] = k < N ? w.sr[k] : w.sc[k - N]; });
      auto apply = [&](const T* in, T* out) {  // [a∘in_u + R in_v; c∘in_v + Rᵀ in_u]
        Kokkos::parallel_for(lanes, [&](int k) {
          out[k] = a_of(k) * in[k] + lane_dot<N>(row(k), in + N);
          out[N + k] = c_of(k) * in[N + k] + lane_dot<N>(col(k), in);
        });
      };
      cg = kdnn::impl::projected_cg(Loops{team, 2 * N}, N, rtol, max_iters, w.x, w.r, w.p, w.Ap,
                                    apply);
      Kokkos::parallel_for(lanes, [&](int i) { w.sr[i] = w.x[i]; });  // u
    } else {
      // b = s_c − Rᵀ D_a⁻¹ s_r
      Kokkos::parallel_for(lanes, [&](int i) { w.q[i] = w.sr[i] / a_of(i); });
      Kokkos::parallel_for(lanes, [&](int j) { w.r[j] = w.sc[j] - lane_dot<N>(col(j), w.q); });
      auto apply = [&](const T* in, T* out) {  // c∘in − Rᵀ D_a⁻¹ R in
        Kokkos::parallel_for(lanes, [&](int i) { w.q[i] = lane_dot<N>(row(i), in) / a_of(i); });
        Kokkos::parallel_for(lanes,
                             [&](int j) { out[j] = c_of(j) * in[j] - lane_dot<N>(col(j), w.q); });
      };
      cg = kdnn::impl::projected_cg(Loops{team, N}, N, rtol, max_iters, w.x, w.r, w.p, w.Ap, apply);
      // u = D_a⁻¹ (s_r − R v), written over s_r.
      Kokkos::parallel_for(
          lanes, [&](int i) { w.sr[i] = (w.sr[i] - lane_dot<N>(row(i), w.x)) / a_of(i); });
    }
    const T* u = w.sr;
    const T* v = block ? w.x + N : w.x;
    // dX = W − (u1ᵀ + 1vᵀ)∘R, lane j writing column j.
    Kokkos::parallel_for(lanes, [&](int j) {
      const T* rc = col(j);
      const T v_j = v[j];
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) {
        dxg[i * ldd + j] = gg[i * ldg + j] * rc[i] - (u[i] + v_j) * rc[i];
      }
    });
    this->report(team, b, cg, r_marginal_error);
  }
};

}  // namespace kdnn::sinkhorn::impl
