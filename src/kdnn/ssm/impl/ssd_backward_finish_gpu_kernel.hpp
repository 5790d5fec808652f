// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The end of the SSD backward's GPU form (ssd_gpu_chunks.hpp), per chunk,
// from what the other kernels left per step (SsdStepSums, da_diag): the
// gradient of each step's log-decay (ssd_state_backward_kernel.hpp),
//   da_t = da_diag_t + Σ_{i≥t} dcum_i + Σ_{j<t} row_a_j + exp(cum_last)·⟨dH_{c+1}, H_c⟩,
// then ddt = A·da + sx and the chunk's sums Σ dt·da (dA) and Σ sd (dD). A
// team of NT threads per chunk: the prefix and suffix sums are team scans,
// the chunk's sums team reductions (fixed orders for a launch).
#include "kdnn/ssm/impl/ssd_gpu_chunks.hpp"
#include "kdnn/ssm/impl/ssd_gradients.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T, int P, int N>
struct SsdBackwardFinishGpuKernel
    : SsdGpuChunks<SsdBackwardFinishGpuKernel<ExecSpace, T, P, N>, ExecSpace, T, P, N> {
  using Base = SsdGpuChunks<SsdBackwardFinishGpuKernel, ExecSpace, T, P, N>;
  using Chunk = typename Base::Chunk;
  using typename Base::Member;
  ChunkStates<const T, ExecSpace> states;   ///< H_c
  ChunkStates<const T, ExecSpace> dstates;  ///< dH_{c+1}
  Kokkos::View<double***, Kokkos::LayoutRight, typename ExecSpace::memory_space>
      da_diag;                        ///< [B, H, L]
  SsdStepSums<ExecSpace> sums;        ///< [B, H, L] each
  Tensor3<T, ExecSpace> ddt;          ///< [B, L, H]
  Matrix<double, ExecSpace> partial;  ///< [B·chunks, 2H]: Σ dt·da, Σ dy·x

  struct Work {
    double *cum, *before, *after;  ///< [pad(Q)]
    int* seg;                      ///< [pad(Q)]
  };
  static KOKKOS_INLINE_FUNCTION Work carve(kdnn::impl::ScratchCarver& s, int Q) {
    const int n = Base::Shape::pad(Q);
    Work w;
    w.cum = s.take<double>(n);
    w.before = s.take<double>(n);
    w.after = s.take<double>(n);
    w.seg = s.take<int>(n);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void one_block(const Member& team, int item, void* scratch) const {
    int unused = 0;
    const Chunk k = this->chunk_of(item, unused);
    kdnn::impl::ScratchCarver carver(scratch);
    const Work w = carve(carver, this->Q);
    this->scan_decays(team, k, Base::Shape::pad(k.n), w.cum, w.seg);
    const T* h = &states(k.b, k.h, k.c, 0);
    const T* dh = &dstates(k.b, k.h, k.c, 0);
    double hdot = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, P * N),
        [&](int e, double& acc) { acc += double(dh[e]) * double(h[e]); }, hdot);
    const auto at = [&](int i) { return k.t0 + i; };
    Kokkos::parallel_scan(Kokkos::TeamThreadRange(team, k.n),
                          [&](int i, double& partial_sum, const bool final) {
                            if (final) w.before[i] = partial_sum;  // Σ_{j<i}
                            partial_sum += sums.row_a(k.b, k.h, at(i));
                          });
    Kokkos::parallel_scan(Kokkos::TeamThreadRange(team, k.n),
                          [&](int i, double& partial_sum, const bool final) {
                            const int t = k.n - 1 - i;  // Σ_{i'≥t}
                            partial_sum += sums.dcum(k.b, k.h, at(t));
                            if (final) w.after[t] = partial_sum;
                          });
    team.team_barrier();
    // cum_last holds every a_t (the whole decay is 0 across a sequence start)
    const double all = double(Base::entering(w.cum, w.seg, k.n - 1)) * hdot;
    const double a = double(this->A(k.h));
    double sa = 0, sd = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, k.n),
        [&](int i, double& acc) {
          const int t = at(i);
          const T dti = this->dt(k.b, t, k.h);
          const double da =
              Base::saturated(dti, a) ? 0.0 : da_diag(k.b, k.h, t) + w.after[i] + w.before[i] + all;
          ddt(k.b, t, k.h) = T(a * da + sums.sx(k.b, k.h, t));
          acc += double(dti) * da;
        },
        sa);
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, k.n),
        [&](int i, double& acc) { acc += sums.sd(k.b, k.h, at(i)); }, sd);
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      const int H = int(this->x.extent(2)), row = k.b * this->chunks + k.c;
      partial(row, k.h) = sa;
      partial(row, H + k.h) = sd;
    });
  }
};

}  // namespace kdnn::ssm::impl
