// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// mHC-style residual mixing: every token carries an n×n mixing matrix that
// must be doubly stochastic. Forward Sinkhorn for a batch of tokens, then the
// implicit backward for a random upstream gradient, checked against the
// unrolled (autograd-equivalent) backward. With MPI, the tokens are split
// across ranks (uneven splits allowed) and the statistics are reduced.
//
//   mhc_sinkhorn [tokens=16384] [n=4] [iters=48]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#include <Kokkos_Core.hpp>
#ifdef KDNN_ENABLE_MPI
#include <mpi.h>
#endif

#include "kdnn/kdnn.hpp"

namespace sk = kdnn::sinkhorn;
using Space = Kokkos::DefaultExecutionSpace;
using Batch = sk::Batch<float, Space>;

struct Stats {
  double seconds_fwd = 0, seconds_bwd = 0, max_marginal = 0, max_rel_diff = 0;
  int max_cg = 0;
  double mean_cg = 0;
};

static double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

static Stats run(int tokens, int n, int iters, unsigned seed) {
  Batch X("X", tokens, n, n), G("G", tokens, n, n), R("R", tokens, n, n);
  Batch dX("dX", tokens, n, n), dX_unrolled("dX_unrolled", tokens, n, n);
  {
    auto hx = Kokkos::create_mirror_view(X);
    auto hg = Kokkos::create_mirror_view(G);
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> logits(0.f, 4.f);
    std::normal_distribution<float> grad(0.f, 1.f);
    for (int b = 0; b < tokens; ++b)
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          hx(b, i, j) = logits(gen);
          hg(b, i, j) = grad(gen);
        }
    Kokkos::deep_copy(X, hx);
    Kokkos::deep_copy(G, hg);
  }
  const auto fwd = sk::Report<Space>::allocate(tokens);
  const auto bwd = sk::Report<Space>::allocate(tokens);
  Stats s;
  Space space;
  auto t0 = std::chrono::steady_clock::now();
  sk::forward(space, X, R, {iters}, fwd);
  space.fence();
  s.seconds_fwd = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  sk::backward(space, R, G, dX, {}, bwd);
  space.fence();
  s.seconds_bwd = seconds_since(t0);
  sk::backward_unrolled(space, X, G, dX_unrolled, {iters});

  auto marginal = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), fwd.marginal_error);
  auto cg = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), bwd.iterations);
  auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dX);
  auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dX_unrolled);
  for (int t = 0; t < tokens; ++t) {
    s.max_marginal = kdnn::nan_max(s.max_marginal, marginal(t));
    s.max_cg = std::max(s.max_cg, cg(t));
    s.mean_cg += cg(t);
    double num = 0, den = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        num += std::pow(double(a(t, i, j)) - double(b(t, i, j)), 2);
        den += std::pow(double(b(t, i, j)), 2);
      }
    if (den > 0) s.max_rel_diff = std::max(s.max_rel_diff, std::sqrt(num / den));
  }
  return s;
}

int main(int argc, char** argv) {
  int rank = 0, ranks = 1;
#ifdef KDNN_ENABLE_MPI
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
#endif
  const int tokens = argc > 1 ? std::atoi(argv[1]) : 16384;
  const int n = argc > 2 ? std::atoi(argv[2]) : 4;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 48;
  int status = 0;
  Kokkos::initialize(argc, argv);
  try {
    // Uneven split: the first `tokens % ranks` ranks take one token more.
    const int mine = tokens / ranks + (rank < tokens % ranks ? 1 : 0);
    Stats s = run(mine, n, iters, 1234u + rank);
    double local[4] = {s.seconds_fwd, s.seconds_bwd, s.max_marginal, s.max_rel_diff};
    double global[4] = {local[0], local[1], local[2], local[3]};
    int max_cg = s.max_cg;
    double sum_cg = s.mean_cg;
#ifdef KDNN_ENABLE_MPI
    MPI_Allreduce(local, global, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&s.max_cg, &max_cg, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&s.mean_cg, &sum_cg, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
#endif
    if (rank == 0) {
      std::printf(
          "mHC Sinkhorn: %d tokens of %dx%d mixing matrices over %d rank(s), %d iterations, "
          "float32, %s\n",
          tokens, n, n, ranks, iters, Space::name());
      std::printf("  forward           %.3f ms  (max marginal error %.2e)\n", global[0] * 1e3,
                  global[2]);
      std::printf("  implicit backward %.3f ms  (CG iterations: mean %.2f, max %d)\n",
                  global[1] * 1e3, tokens > 0 ? sum_cg / tokens : 0.0, max_cg);
      std::printf("  implicit vs unrolled backward: max relative difference %.2e\n", global[3]);
    }
    if (global[3] > 1e-4) status = 1;
  } catch (const kdnn::Error& e) {
    std::fprintf(stderr, "mhc_sinkhorn: %s\n", e.what());
    status = 1;
  }
  Kokkos::finalize();
#ifdef KDNN_ENABLE_MPI
  MPI_Finalize();
#endif
  return status;
}
