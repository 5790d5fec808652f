// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The SSD backward of Y_diag (notation: ssd_chunks.hpp).
#include "kdnn/ssm/impl/ssd_chunks.hpp"
#include "kdnn/ssm/impl/ssd_gradients.hpp"

namespace kdnn::ssm::impl {

/// The backward of Y_diag alone. With W = CB∘m and V = (dY·X̃ᵀ)∘m:
///   dX̃ = Wᵀ·dY,  dB = Vᵀ·C,  dC = V·B,
///   da_k = Σ_{j<k≤i} R_ij  with R = CB∘V (R_ij is the derivative of the
///   loss by the exponent cum_i − cum_j = Σ_{j<k≤i} a_k).
/// Writes dX̃ into dx (the state kernel finishes it), dB, dC and da_diag.
template <class ExecSpace, class T>
struct SsdDiagBackwardKernel : SsdChunks<ExecSpace, T> {
  using Chunk = typename SsdChunks<ExecSpace, T>::Chunk;
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
    this->for_each_chunk(team, [&](const Chunk& k, kdnn::impl::ScratchCarver& scratch) {
      one_chunk(team, k, carve(scratch, this->Qp, this->Pp, this->Np));
    });
  }

  /// Chunk k, in the team's scratch w.
  KOKKOS_INLINE_FUNCTION void one_chunk(const Member& team, const Chunk& k, const Work& w) const {
    load(team, k, w);
    team.team_barrier();
    products(team, k, w);
    store(team, k, w);
  }

  /// The chunk's operands into scratch (a barrier follows).
  KOKKOS_INLINE_FUNCTION void load(const Member& team, const typename Base::Chunk& k,
                                   const Work& w) const {
    const int Qp = this->Qp, Pp = this->Pp;
    this->load_decays(team, k, w.d);
    this->load_bc(team, k, this->Cm, w.c);
    this->load_bc(team, k, this->Bm, w.b);
    this->load_b_t(team, k, w.bt);
    this->fill(
        team, w.dy, Qp, Pp, k.n, this->P(), [&](int i) { return &dy(k.b, k.t0 + i, k.h, 0); },
        typename Base::One{});
    this->load_x(team, k, w.d.dtv, w.xr);
    this->load_x_t(team, k, w.d.dtv, w.xt);
  }

  /// dX̃, dBᵀ, dC and da_diag of the chunk into w.dxr, w.dbt, w.dc and w.da
  /// (a barrier follows).
  KOKKOS_INLINE_FUNCTION void products(const Member& team, const typename Base::Chunk& k,
                                       const Work& w) const {
    const int Qp = this->Qp, Pp = this->Pp, Np = this->Np;
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
        const T m = Base::decay_mask(w.d.cum, w.d.seg, i, j, k.n);
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
  }

  /// The chunk's dX̃, dB, dC and da_diag from scratch into g.
  KOKKOS_INLINE_FUNCTION void store(const Member& team, const typename Base::Chunk& k,
                                    const Work& w) const {
    const int Qp = this->Qp, Pp = this->Pp, Np = this->Np, P = this->P(), N = this->N();
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

}  // namespace kdnn::ssm::impl
