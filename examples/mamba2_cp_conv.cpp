// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Mamba-2's conv1d + SiLU and dt softplus with the sequence sharded across
// MPI ranks (kdnn::cp), forward and backward, checked against the same
// operators run on the whole sequence on one rank:
//
//   mpiexec -n 4 mamba2_cp_conv [L] [B] [C] [K] [H]     (default 4099 2 64 4 8)
//
// The split is uneven on purpose (the last rank holds the remainder). Prints
// the largest difference from the single-rank run over every output and
// gradient, the halo bytes each rank sent, and how long the compute ran while
// the halo was in flight versus how long a rank then waited for it. Exits 1
// if the difference exceeds float64 round-off.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kdnn/core/compat.hpp"
#include "kdnn/cp/cp.hpp"
#include "kdnn/ssm/ssm.hpp"
#include "mamba2_example.hpp"

namespace {

using namespace mamba2_example;

struct Grads {
  View<T***> y, dt_out, dx, ddt;
  View<T**> dw;
  View<T*> dbias, ddt_bias;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const auto arg = [&](int i, int fallback) { return argc > i ? std::atoi(argv[i]) : fallback; };
  const int L = arg(1, 4099), B = arg(2, 2), C = arg(3, 64), K = arg(4, 4), H = arg(5, 8);
  kdnn::compat::initialize_without_warnings(argv[0], {});
  int status = 0;
  {
    const Space space;
    const auto x = random3("x", B, L, C, 1), dy = random3("dy", B, L, C, 2);
    const auto dt = random3("dt", B, L, H, 3), ddt_out = random3("ddt_out", B, L, H, 4);
    const auto w3 = random3("w", 1, C, K, 5), b3 = random3("b", 1, 1, C, 6);
    const auto db3 = random3("dt_bias", 1, 1, H, 7);
    const View<T**> w(w3.data(), C, K);
    const View<T*> bias(b3.data(), C), dt_bias(db3.data(), H);

    // This rank's steps: L / P each, the remainder on the last rank.
    const int share = L / P, first = rank * share, n = rank == P - 1 ? L - first : share;
    const auto run = [&](const View<T***>& xs, const View<T***>& dys, const View<T***>& dts,
                         const View<T***>& ddts, bool split, kdnn::cp::HaloStats* stats) {
      const int m = int(xs.extent(1));
      Grads g{View<T***>("y", B, m, C),   View<T***>("dt_out", B, m, H), View<T***>("dx", B, m, C),
              View<T***>("ddt", B, m, H), View<T**>("dw", C, K),         View<T*>("dbias", C),
              View<T*>("ddt_bias", H)};
      View<T***> halo("halo", B, K - 1, C);
      kdnn::cp::ConvDtForward<T, Space> f;
      f.conv.x = xs, f.conv.w = w, f.conv.bias = bias, f.conv.y = g.y, f.halo = halo;
      f.dt = dts, f.dt_bias = dt_bias, f.dt_out = g.dt_out;
      kdnn::cp::ConvDtBackward<T, Space> b;
      b.conv.x = xs, b.conv.w = w, b.conv.bias = bias, b.conv.initial_state = halo;
      b.conv.dy = dys, b.conv.dx = g.dx, b.conv.dw = g.dw, b.conv.dbias = g.dbias;
      b.dt = dts, b.dt_bias = dt_bias, b.ddt_out = ddts, b.ddt = g.ddt, b.ddt_bias = g.ddt_bias;
      if (!split) {  // the whole sequence on this rank alone
        kdnn::ssm::causal_conv1d_forward(space, f.conv);
        kdnn::ssm::dt_softplus_forward(space, dts, dt_bias, g.dt_out);
        kdnn::ssm::causal_conv1d_backward(space, b.conv);
        kdnn::ssm::dt_softplus_backward(space, dts, dt_bias, ddts, g.ddt, g.ddt_bias);
        return g;
      }
      stats[0] = kdnn::cp::conv_dt_forward(space, MPI_COMM_WORLD, f);
      stats[1] = kdnn::cp::conv_dt_backward(space, MPI_COMM_WORLD, b);
      kdnn::cp::allreduce_sum(MPI_COMM_WORLD, g.dw);
      kdnn::cp::allreduce_sum(MPI_COMM_WORLD, g.dbias);
      kdnn::cp::allreduce_sum(MPI_COMM_WORLD, g.ddt_bias);
      return g;
    };
    kdnn::cp::HaloStats stats[2];
    const Grads whole = run(x, dy, dt, ddt_out, false, nullptr);
    const Grads part = run(steps(x, first, n), steps(dy, first, n), steps(dt, first, n),
                           steps(ddt_out, first, n), true, stats);
    const double diff =
        std::max({max_diff(part.y, steps(whole.y, first, n)),
                  max_diff(part.dt_out, steps(whole.dt_out, first, n)),
                  max_diff(part.dx, steps(whole.dx, first, n)),
                  max_diff(part.ddt, steps(whole.ddt, first, n)), max_diff(part.dw, whole.dw),
                  max_diff(part.dbias, whole.dbias), max_diff(part.ddt_bias, whole.ddt_bias)});
    double worst = 0;
    MPI_Reduce(&diff, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("mamba2_cp_conv: B=%d L=%d C=%d K=%d H=%d float64 on %d rank(s)\n", B, L, C, K, H,
                  P);
      std::printf("max |split - single rank| over y, dt_out, dx, ddt, dw, dbias, ddt_bias: %.3g\n",
                  worst);
    }
    for (int r = 0; r < P; ++r) {
      if (r == rank) {
        std::printf(
            "rank %d: steps [%d, %d), halo sent %lld B forward, %lld B backward; compute while "
            "in flight %.3f ms fwd / %.3f ms bwd, then waited %.3f / %.3f ms\n",
            rank, first, first + n, (long long)stats[0].bytes_sent, (long long)stats[1].bytes_sent,
            1e3 * stats[0].overlapped_seconds, 1e3 * stats[1].overlapped_seconds,
            1e3 * stats[0].waited_seconds, 1e3 * stats[1].waited_seconds);
        std::fflush(stdout);
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
    status = worst <= 1e-12 ? 0 : 1;
    MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  }
  Kokkos::finalize();
  MPI_Finalize();
  return status;
}
