// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The SSD backward's state half and its outputs (notation: ssd_chunks.hpp).
#include "kdnn/core/impl/row_dot.hpp"
#include "kdnn/ssm/impl/ssd_chunks.hpp"
#include "kdnn/ssm/impl/ssd_gradients.hpp"
#include "kdnn/ssm/impl/ssd_skip.hpp"

namespace kdnn::ssm::impl {

/// The rest of the backward, from the state entering the chunk H_c
/// (states(b, h, c)) and the gradient of the state leaving it dH_{c+1}
/// (dstates(b, h, c)):
///   dX̃_i += dend_i·(B_i·dH_{c+1}ᵀ),  dB_i += dend_i·(X̃_i·dH_{c+1}),
///   dC_i += e_i·(dY_i·H_c),
///   da_t = da_diag_t + Σ_{i≥t} e_i·C_i·(dY_i·H_c) + Σ_{j<t} dend_j·X̃_j·(B_j·dH_{c+1}ᵀ)
///          + exp(cum_last)·⟨dH_{c+1}, H_c⟩
/// (a_t enters cum_i for i ≥ t, and cum_last − cum_j for j < t: each sum
/// holds only terms in which a_t appears, none cancelling), then the outputs:
///   dx = dt·dX̃ + D·dy,  ddt = A·da + x·dX̃,  per chunk Σ dt·da (dA), Σ dy·x (dD).
template <class ExecSpace, class T>
struct SsdStateBackwardKernel : SsdChunks<ExecSpace, T> {
  using Chunk = typename SsdChunks<ExecSpace, T>::Chunk;
  using Base = SsdChunks<ExecSpace, T>;
  using typename Base::Member;
  Tensor4<const T, ExecSpace> dy;           ///< [B, L, H, P]
  SsdSkip<ExecSpace, T> skip;               ///< D
  ChunkStates<const T, ExecSpace> states;   ///< H_c, [B, H, ≥chunks, N·P]
  ChunkStates<const T, ExecSpace> dstates;  ///< dH_{c+1}, [B, H, chunks, N·P]
  SsdGradients<ExecSpace, T> g;
  Tensor3<T, ExecSpace> ddt;          ///< [B, L, H]
  Matrix<double, ExecSpace> partial;  ///< [B·chunks, 2H]: Σ dt·da, Σ dy·x

  struct Work {
    typename Base::Decays d;
    T *c, *bt, *xr, *dy, *hpn, *dhnp, *dhpn, *tx, *tb, *tc;
    double *dcum, *row_a, *row_d;
  };
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int Qp, int Pp, int Np) {
    Work w;
    w.d = Base::carve_decays(s, Qp);
    const std::size_t qn = std::size_t(Qp) * Np, qp = std::size_t(Qp) * Pp;
    w.c = s.take<T>(qn);
    w.bt = s.take<T>(qn);
    w.xr = s.take<T>(qp);
    w.dy = s.take<T>(qp);
    carve_own(s, w, Qp, Pp, Np);
    return w;
  }
  /// The buffers SsdDiagBackwardKernel has none of (load_shared's are given).
  KOKKOS_INLINE_FUNCTION static void carve_own(kdnn::impl::ScratchCarver& s, Work& w, int Qp,
                                               int Pp, int Np) {
    const std::size_t qn = std::size_t(Qp) * Np, qp = std::size_t(Qp) * Pp,
                      pn = std::size_t(Pp) * Np;
    w.hpn = s.take<T>(pn);
    w.dhnp = s.take<T>(pn);
    w.dhpn = s.take<T>(pn);
    w.tx = s.take<T>(qp);
    w.tb = s.take<T>(qn);
    w.tc = s.take<T>(qn);
    w.dcum = s.take<double>(Qp);
    w.row_a = s.take<double>(Qp);
    w.row_d = s.take<double>(Qp);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    this->for_each_chunk(team, [&](const Chunk& k, kdnn::impl::ScratchCarver& scratch) {
      one_chunk(team, k, carve(scratch, this->Qp, this->Pp, this->Np));
    });
  }

  /// Chunk k, in the team's scratch w, after
  /// SsdDiagBackwardKernel wrote the Y_diag half into g.
  KOKKOS_INLINE_FUNCTION void one_chunk(const Member& team, const Chunk& k, const Work& w) const {
    load_shared(team, k, w);
    load_states(team, k, w);
    team.team_barrier();
    finish(team, k, w, DiagInGradients<ExecSpace, T>{g, k.b, k.h, k.t0});
  }

  /// The operands SsdDiagBackwardKernel loads too.
  KOKKOS_INLINE_FUNCTION void load_shared(const Member& team, const typename Base::Chunk& k,
                                          const Work& w) const {
    this->load_decays(team, k, w.d);
    this->load_bc(team, k, this->Cm, w.c);
    this->load_b_t(team, k, w.bt);
    this->fill(
        team, w.dy, this->Qp, this->Pp, k.n, this->P(),
        [&](int i) { return &dy(k.b, k.t0 + i, k.h, 0); }, typename Base::One{});
    this->load_x(team, k, w.d.dtv, w.xr);
  }

  /// H_c and dH_{c+1} (both layouts).
  KOKKOS_INLINE_FUNCTION void load_states(const Member& team, const typename Base::Chunk& k,
                                          const Work& w) const {
    this->load_state(team, k, states, k.c, true, w.hpn);
    this->load_state(team, k, dstates, k.c, false, w.dhnp);
    this->load_state(team, k, dstates, k.c, true, w.dhpn);
  }

  /// The state half, added to the Y_diag half `diag` (DiagInGradients or
  /// DiagInScratch), and the outputs.
  template <class Diag>
  KOKKOS_INLINE_FUNCTION void finish(const Member& team, const typename Base::Chunk& k,
                                     const Work& w, const Diag& diag) const {
    const int Qp = this->Qp, Pp = this->Pp, Np = this->Np, P = this->P(), N = this->N();
    using GA = typename Base::GemmA;
    Base::gemm(team, Qp, Pp, Np, GA::k_major(w.bt, Qp), w.dhnp, Pp, w.tx, Pp, false);  // B·dHᵀ
    Base::gemm(team, Qp, Np, Pp, GA::rows(w.xr, Pp), w.dhpn, Np, w.tb, Np, false);     // X̃·dH
    Base::gemm(team, Qp, Np, Pp, GA::rows(w.dy, Pp), w.hpn, Np, w.tc, Np, false);      // dY·H
    // ⟨dH_{c+1}, H_c⟩ over the state, by rows p.
    double hdot = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, Pp),
        [&](int p, double& acc) {
          acc += double(kdnn::impl::row_dot<ExecSpace>(team, Np, w.dhpn + p * Np, w.hpn + p * Np));
        },
        hdot);
    team.team_barrier();
    // The state terms of da: e_i·C_i·(dY_i·H_c) into dcum, dend_i·X̃_i·(B_i·dH)
    // into row_a.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, Qp), [&](int i) {
      const T off = kdnn::impl::row_dot<ExecSpace>(team, Np, w.c + i * Np, w.tc + i * Np);
      const T v = kdnn::impl::row_dot<ExecSpace>(team, Pp, w.xr + i * Pp, w.tx + i * Pp);
      Kokkos::single(Kokkos::PerThread(team), [&]() {
        w.dcum[i] = double(w.d.e[i]) * double(off);
        w.row_a[i] = double(w.d.dend[i]) * double(v);
      });
    });
    team.team_barrier();
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      double before = 0;  // Σ_{j<t} of the row_a terms
      for (int i = 0; i < k.n; ++i) {
        const double v = w.row_a[i];
        w.row_a[i] = before;
        before += v;
      }
      const double all = double(w.d.e[Qp - 1]) * hdot;  // cum_last holds every a_t
      const double a = double(this->A(k.h));
      double after = 0;  // Σ_{i≥t} of the dcum terms
      for (int i = k.n - 1; i >= 0; --i) {
        after += w.dcum[i];
        const double da = diag.da(i) + after + w.row_a[i] + all;
        w.dcum[i] = Base::saturated(w.d.dtv[i], a) ? 0.0 : da;  // da_t, kept in dcum
      }
    });
    team.team_barrier();
    const T a = this->A(k.h);
    const SkipRow<T> skip_h = skip.row(k.h, P);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, k.n), [&](int i) {
      const int t = k.t0 + i;
      const T di = w.d.dend[i], ei = w.d.e[i], dti = w.d.dtv[i];
      const T* xr = &this->x(k.b, t, k.h, 0);
      const T* dyr = &dy(k.b, t, k.h, 0);
      T* dxo = &g.dx(k.b, t, k.h, 0);
      const T* txr = w.tx + i * Pp;
      T sx = 0;  // Σ_p x·dX̃, each lane over its own p
      Kokkos::parallel_reduce(
          Kokkos::ThreadVectorRange(team, P),
          [&](int p, T& acc) {
            const T dxt = diag.dx(i, p) + di * txr[p];  // dX̃
            dxo[p] = dti * dxt;
            acc += xr[p] * dxt;
          },
          sx);
      // + D·dy in a loop of its own (each lane its own p, as above): inside
      // the reduction, D's per-channel branch could give the compiler two
      // versions of it that sum in different orders.
      if (skip_h.d) Base::vec(team, P, [&](int p) { dxo[p] += skip_h.at(p) * dyr[p]; });
      const T sd = kdnn::impl::row_dot<ExecSpace>(team, P, dyr, xr);
      T* dbo = &g.dBh(k.b, t, k.h, 0);
      T* dco = &g.dCh(k.b, t, k.h, 0);
      const T *tbr = w.tb + i * Np, *tcr = w.tc + i * Np;
      Base::vec(team, N, [&](int j) { dbo[j] = diag.db(i, j) + di * tbr[j]; });
      Base::vec(team, N, [&](int j) { dco[j] = diag.dc(i, j) + ei * tcr[j]; });
      Kokkos::single(Kokkos::PerThread(team), [&]() {
        ddt(k.b, t, k.h) = T(double(a) * w.dcum[i] + double(sx));
        w.row_a[i] = double(dti) * w.dcum[i];
        w.row_d[i] = double(sd);
      });
    });
    team.team_barrier();
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      double sa = 0, sd = 0;
      for (int i = 0; i < k.n; ++i) {
        sa += w.row_a[i];
        sd += w.row_d[i];
      }
      const int H = int(this->x.extent(2)), row = k.b * this->chunks + k.c;
      partial(row, k.h) = sa;
      partial(row, H + k.h) = sd;
    });
  }
};

}  // namespace kdnn::ssm::impl
