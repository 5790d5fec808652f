// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// A Mamba-2 block's sequence mixing with the sequence sharded across MPI
// ranks (kdnn::cp), forward and backward, checked against the same operators
// run on the whole sequence on one rank:
//
//   xBC [B, L, H·P + 2·G·N] → causal conv1d + SiLU → x [B,L,H,P], B, C [B,L,G,N]
//   dt_raw [B, L, H]        → softplus(dt_raw + dt_bias) → dt
//   y = SSD(x, dt, A, B, C, D)  (chunked scan, states passed between ranks)
//
// and the backward of Σ y·dy through all three.
//
//   mpiexec -n 4 mamba2_cp_block [L] [B] [H] [P] [N] [Q]   (default 4099 2 4 16 16 64)
//
// The split is uneven on purpose (the last rank holds the remainder). Prints
// the largest difference from the single-rank run over y and every
// gradient, the bytes each rank sent (conv halo, SSD states), and how long
// compute ran while they were in flight versus how long a rank then waited.
// Exits 1 if the difference exceeds float64 round-off.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kdnn/core/compat.hpp"
#include "kdnn/cp/cp.hpp"
#include "kdnn/ssm/ssm.hpp"
#include "mamba2_example.hpp"

namespace {

using namespace mamba2_example;

struct Sizes {
  int B, H, P, G, N, K, Q;
  int C() const { return H * P + 2 * G * N; }
};

/// The block's parameters (the same on every rank).
struct Params {
  View<T**> w;                   ///< conv weight [C, K]
  View<T*> bias, dt_bias, A, D;  ///< [C], [H], [H] (negative), [H]
};

/// Outputs and gradients of one run.
struct Run {
  View<T***> y, dxbc, ddt_raw;  // per step
  View<T**> dw;
  View<T*> dbias, ddt_bias, dA, dD;
  kdnn::cp::HaloStats halo[2];
  kdnn::cp::StateStats state[2];
};

/// The block forward and backward on xbc [B, m, C], dt_raw and dy [B, m, H·P]:
/// on the whole sequence with the single-rank operators when `comm` is
/// MPI_COMM_NULL, else on this rank's share with kdnn::cp.
Run block(const Sizes& s, const Params& p, const View<T***>& xbc, const View<T***>& dt_raw,
          const View<T***>& dy, MPI_Comm comm) {
  const Space space;
  const bool split = comm != MPI_COMM_NULL;
  const int B = s.B, m = int(xbc.extent(1)), C = s.C(), HP = s.H * s.P, GN = s.G * s.N;
  Run r;
  View<T***> conv("conv", B, m, C), dt("dt", B, m, s.H), halo("halo", B, s.K - 1, C);
  kdnn::cp::ConvDtForward<T, Space> cf;
  cf.conv.x = xbc, cf.conv.w = p.w, cf.conv.bias = p.bias, cf.conv.y = conv, cf.halo = halo;
  cf.dt = dt_raw, cf.dt_bias = p.dt_bias, cf.dt_out = dt;
  if (split) {
    r.halo[0] = kdnn::cp::conv_dt_forward(space, comm, cf);
  } else {
    kdnn::ssm::causal_conv1d_forward(space, cf.conv);
    kdnn::ssm::dt_softplus_forward(space, dt_raw, p.dt_bias, dt);
  }
  const auto x3 = channels(conv, 0, HP), b3 = channels(conv, HP, GN),
             c3 = channels(conv, HP + GN, GN);
  const auto x = split_last(x3, s.H, s.P), Bm = split_last(b3, s.G, s.N),
             Cm = split_last(c3, s.G, s.N);
  r.y = View<T***>("y", B, m, HP);
  kdnn::ssm::SsdForward<T, Space> f;
  f.x = x, f.dt = dt, f.A = p.A, f.B = Bm, f.C = Cm, f.D = p.D, f.y = split_last(r.y, s.H, s.P);
  const kdnn::ssm::SsdOptions opts{s.Q, true};
  if (split) {
    r.state[0] = kdnn::cp::ssd_forward(space, comm, f, opts);
  } else {
    kdnn::ssm::ssd_forward(space, f, opts);
  }

  // Backward: the SSD's, then the conv's (its dy is dx, dB, dC side by side)
  // and the dt softplus'.
  View<T***> dx3("dx", B, m, HP), db3("dB", B, m, GN), dc3("dC", B, m, GN);
  View<T***> ddt("ddt", B, m, s.H);
  r.dA = View<T*>("dA", s.H), r.dD = View<T*>("dD", s.H);
  kdnn::ssm::SsdBackward<T, Space> g;
  g.x = x, g.dt = dt, g.A = p.A, g.B = Bm, g.C = Cm, g.D = p.D;
  g.dy = split_last(dy, s.H, s.P);
  g.dx = split_last(dx3, s.H, s.P), g.ddt = ddt, g.dA = r.dA, g.dB = split_last(db3, s.G, s.N);
  g.dC = split_last(dc3, s.G, s.N), g.dD = r.dD;
  View<T***> dconv("dconv", B, m, C);
  r.dxbc = View<T***>("dxbc", B, m, C), r.ddt_raw = View<T***>("ddt_raw", B, m, s.H);
  r.dw = View<T**>("dw", C, s.K), r.dbias = View<T*>("dbias", C);
  r.ddt_bias = View<T*>("ddt_bias", s.H);
  kdnn::cp::ConvDtBackward<T, Space> cb;
  cb.conv.x = xbc, cb.conv.w = p.w, cb.conv.bias = p.bias, cb.conv.initial_state = halo;
  cb.conv.dy = dconv, cb.conv.dx = r.dxbc, cb.conv.dw = r.dw, cb.conv.dbias = r.dbias;
  cb.dt = dt_raw, cb.dt_bias = p.dt_bias, cb.ddt_out = ddt, cb.ddt = r.ddt_raw;
  cb.ddt_bias = r.ddt_bias;
  const auto place = [&](const View<T***>& part, int c0) {
    const int E = int(part.extent(2));
    Kokkos::deep_copy(Kokkos::subview(dconv, Kokkos::ALL, Kokkos::ALL, std::make_pair(c0, c0 + E)),
                      part);
  };
  if (split) {
    r.state[1] = kdnn::cp::ssd_backward(space, comm, g, opts);
    place(dx3, 0), place(db3, HP), place(dc3, HP + GN);
    r.halo[1] = kdnn::cp::conv_dt_backward(space, comm, cb);
    for (const auto& v : {r.dA, r.dD, r.dbias, r.ddt_bias}) kdnn::cp::allreduce_sum(comm, v);
    kdnn::cp::allreduce_sum(comm, r.dw);
  } else {
    kdnn::ssm::ssd_backward(space, g, opts);
    place(dx3, 0), place(db3, HP), place(dc3, HP + GN);
    cb.conv.initial_state = {};
    kdnn::ssm::causal_conv1d_backward(space, cb.conv);
    kdnn::ssm::dt_softplus_backward(space, dt_raw, p.dt_bias, ddt, r.ddt_raw, r.ddt_bias);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, R = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  const auto arg = [&](int i, int fallback) { return argc > i ? std::atoi(argv[i]) : fallback; };
  const int L = arg(1, 4099);
  const Sizes s{arg(2, 2), arg(3, 4), arg(4, 16), 1, arg(5, 16), 4, arg(6, 64)};
  kdnn::compat::initialize_without_warnings(argv[0], {});
  int status = 0;
  {
    const int B = s.B, C = s.C(), HP = s.H * s.P;
    const auto xbc = random3("xbc", B, L, C, 1), dt_raw = random3("dt_raw", B, L, s.H, 2, -4, 1);
    const auto dy = random3("dy", B, L, HP, 3);
    const auto w = random3("w", 1, C, s.K, 4, -0.6, 0.6), bias = random3("bias", 1, 1, C, 5);
    const auto dt_bias = random3("dt_bias", 1, 1, s.H, 6), A = random3("A", 1, 1, s.H, 7, -2, -0.5);
    const auto D = random3("D", 1, 1, s.H, 8);
    const Params p{View<T**>(w.data(), C, s.K), View<T*>(bias.data(), C),
                   View<T*>(dt_bias.data(), s.H), View<T*>(A.data(), s.H), View<T*>(D.data(), s.H)};

    // This rank's steps: L / R each, the remainder on the last rank.
    const int share = L / R, first = rank * share, n = rank == R - 1 ? L - first : share;
    // Timed after one untimed run, so that neither pays the first touches.
    block(s, p, xbc, dt_raw, dy, MPI_COMM_NULL);
    double seconds[2];
    const auto timed = [&](double& t, auto&& run) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto start = std::chrono::steady_clock::now();
      Run r = run();
      Kokkos::fence();
      t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return r;
    };
    const Run whole =
        timed(seconds[0], [&] { return block(s, p, xbc, dt_raw, dy, MPI_COMM_NULL); });
    const Run part = timed(seconds[1], [&] {
      return block(s, p, steps(xbc, first, n), steps(dt_raw, first, n), steps(dy, first, n),
                   MPI_COMM_WORLD);
    });
    double slowest[2];
    MPI_Reduce(seconds, slowest, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    const double diff = std::max({max_diff(part.y, steps(whole.y, first, n)),
                                  max_diff(part.dxbc, steps(whole.dxbc, first, n)),
                                  max_diff(part.ddt_raw, steps(whole.ddt_raw, first, n)),
                                  max_diff(part.dw, whole.dw), max_diff(part.dbias, whole.dbias),
                                  max_diff(part.ddt_bias, whole.ddt_bias),
                                  max_diff(part.dA, whole.dA), max_diff(part.dD, whole.dD)});
    double worst = 0;
    MPI_Reduce(&diff, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf(
          "Mamba-2 block (conv1d + SiLU, dt softplus, SSD): B=%d L=%d H=%d P=%d G=%d N=%d K=%d "
          "Q=%d float64 on %d rank(s)\n",
          B, L, s.H, s.P, s.G, s.N, s.K, s.Q, R);
      std::printf(
          "max |split - single rank| over y, dxBC, ddt, dw, dbias, ddt_bias, dA, dD: %.3g\n",
          worst);
      std::printf("forward + backward: %.1f ms on one rank, %.1f ms split over %d rank(s)\n",
                  1e3 * slowest[0], 1e3 * slowest[1], R);
    }
    for (int r = 0; r < R; ++r) {
      if (r == rank) {
        const auto& h = part.halo;
        const auto& st = part.state;
        std::printf(
            "rank %d: steps [%d, %d); sent conv halo %lld + %lld B, SSD states %lld + %lld B "
            "(fwd + bwd); SSD compute while in flight %.3f / %.3f ms, then waited %.3f / %.3f "
            "ms\n",
            rank, first, first + n, (long long)h[0].bytes_sent, (long long)h[1].bytes_sent,
            (long long)st[0].bytes_sent, (long long)st[1].bytes_sent,
            1e3 * st[0].overlapped_seconds, 1e3 * st[1].overlapped_seconds,
            1e3 * st[0].waited_seconds, 1e3 * st[1].waited_seconds);
        std::fflush(stdout);
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
    status = worst <= 1e-11 ? 0 : 1;
    MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  }
  Kokkos::finalize();
  MPI_Finalize();
  return status;
}
