// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Sinkhorn implicit and block backwards, GPU form (kdnn::KernelForm::gpu),
// lane layout, for a compile-time n = N in LaneFormSizes, {8, 16, 32}
// (smaller n: the thread form, cg_backward_thread_kernel.hpp); the systems
// and the method are CGBackwardKernel's (cg_backward_kernel.hpp). Lane k of a
// matrix keeps row k and column k of R in registers, so that both products
// of a CG step, Rp (lane i: row i · p) and Rᵀq (lane j: column j · q), are
// lane-local dot products over a vector every lane reads from scratch in
// 16-byte pieces, with independent FMA chains at N >= 16
// (lane_dot_shared). The CG itself is the host form's projected_cg on the
// same scratch vectors, its sums by butterfly among the N lanes
// (ButterflyLoops, vector_loops.hpp): two butterfly rounds per step, no
// Kokkos vector reduction. D_a⁻¹ is applied as a product with 1/a_i, taken
// once per matrix.
//
// Memory: R and G are read once and dX written once, by columns (lane j
// reads column j and writes column j: the N lanes touch one row's N
// consecutive elements at a time); rows of R reach the lanes through a tile
// in scratch, which then holds W = G∘R for its row sums and for dX.
//
// Numerics: R's and W's sums are the host form's (each in index order, as
// col_dot sums), so the marginal errors are its bits on a host. CG's dot
// products are summed lane by lane and then across the lanes (the same bits
// on a host and a GPU), its products by chains, and D_a⁻¹ by a reciprocal,
// where the host form sums in index order and divides: the two forms agree
// to rounding, and CG, which amplifies rounding by the system's
// conditioning, to its tolerance.
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
  /// Independent FMA chains per product (lane_dot_shared).
  static constexpr int kDotChains = N >= 16 ? 4 : 1;
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
    LaneRegisters<T, N, N, kPrivate> row;    // lane i: R_i·
    LaneRegisters<T, N, N, kPrivate> col;    // lane j: R_·j
    LaneRegisters<T, N, 1, kPrivate> inv_a;  // lane i: 1 / a_i (1 for unit marginals)

    // Lane j: column j of R and its sum c_j; R to the tile.
    Kokkos::parallel_for(lanes, [&](int j) {
      T* rc = col(j);
      T c_j = 0;
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) {
        rc[i] = rg[i * ldr + j];
        w.tile[i * kLd + j] = rc[i];
        c_j += rc[i];
      }
      w.c[j] = c_j;
    });
    // Lane i: row i of R, its sum a_i and 1 / a_i (the system's only
    // divisor, taken once).
    Kokkos::parallel_for(lanes, [&](int i) {
      T* rr = row(i);
      T a_i = 0;
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) {
        rr[j] = w.tile[i * kLd + j];
        a_i += rr[j];
      }
      w.a[i] = a_i;
      inv_a(i)[0] = T(1) / (measured ? a_i : T(1));
    });
    // Lane j: column j of G, the only read of G: W = G∘R over R in the tile,
    // where dX takes it back at the end, and s_c,j = Σ_i W_ij.
    Kokkos::parallel_for(lanes, [&](int j) {
      const T* rc = col(j);
      T sc_j = 0;
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) {
        const T w_ij = gg[i * ldg + j] * rc[i];
        w.tile[i * kLd + j] = w_ij;
        sc_j += w_ij;
      }
      w.sc[j] = sc_j;
    });
    Kokkos::parallel_for(lanes, [&](int i) {
      T sr_i = 0;
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) sr_i += w.tile[i * kLd + j];
      w.sr[i] = sr_i;
    });
    const double r_marginal_error = marginal_error(team, N, w.a, w.c);
    const auto a_of = [&](int i) { return measured ? w.a[i] : T(1); };
    const auto dot = [](const T* a, const T* y) { return lane_dot_shared<N, kDotChains>(a, y); };
    const auto c_of = [&](int j) { return measured ? w.c[j] : T(1); };

    kdnn::impl::CGResult cg;
    if (block) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, 2 * N),
                           [&](int k) { w.r[k] = k < N ? w.sr[k] : w.sc[k - N]; });
      auto apply = [&](const T* in, T* out) {  // [a∘in_u + R in_v; c∘in_v + Rᵀ in_u]
        Kokkos::parallel_for(lanes, [&](int k) {
          out[k] = a_of(k) * in[k] + dot(row(k), in + N);
          out[N + k] = c_of(k) * in[N + k] + dot(col(k), in);
        });
      };
      cg = kdnn::impl::projected_cg(Loops{team, 2 * N}, N, rtol, max_iters, w.x, w.r, w.p, w.Ap,
                                    apply);
      Kokkos::parallel_for(lanes, [&](int i) { w.sr[i] = w.x[i]; });  // u
    } else {
      // b = s_c − Rᵀ D_a⁻¹ s_r
      Kokkos::parallel_for(lanes, [&](int i) { w.q[i] = w.sr[i] * inv_a(i)[0]; });
      Kokkos::parallel_for(lanes, [&](int j) { w.r[j] = w.sc[j] - dot(col(j), w.q); });
      auto apply = [&](const T* in, T* out) {  // c∘in − Rᵀ D_a⁻¹ R in
        Kokkos::parallel_for(lanes, [&](int i) { w.q[i] = dot(row(i), in) * inv_a(i)[0]; });
        Kokkos::parallel_for(lanes, [&](int j) { out[j] = c_of(j) * in[j] - dot(col(j), w.q); });
      };
      cg = kdnn::impl::projected_cg(Loops{team, N}, N, rtol, max_iters, w.x, w.r, w.p, w.Ap, apply);
      // u = D_a⁻¹ (s_r − R v), written over s_r.
      Kokkos::parallel_for(lanes,
                           [&](int i) { w.sr[i] = (w.sr[i] - dot(row(i), w.x)) * inv_a(i)[0]; });
    }
    const T* u = w.sr;
    const T* v = block ? w.x + N : w.x;
    // dX = W − (u1ᵀ + 1vᵀ)∘R, lane j writing column j (W from the tile).
    Kokkos::parallel_for(lanes, [&](int j) {
      const T* rc = col(j);
      const T v_j = v[j];
      KDNN_IMPL_UNROLL
      for (int i = 0; i < N; ++i) dxg[i * ldd + j] = w.tile[i * kLd + j] - (u[i] + v_j) * rc[i];
    });
    this->report(team, b, cg, r_marginal_error);
  }
};

}  // namespace kdnn::sinkhorn::impl
