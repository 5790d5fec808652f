// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::cp::HaloPlan (kdnn/cp/halo_plan.hpp), run by ctest under mpiexec at
// 1, 2, 3 and 4 ranks: gather() brings each rank the K−1 steps before its
// first (from one or more predecessors, rank 0's initial state, or zeros)
// for every split; scatter_add() is its adjoint (each received gradient
// added once to the step it came from); one plan serves layers of other
// B and C and repeated steps, bit for bit as the calls that make their own;
// a call takes one set-up collective; and a bad or mismatched argument on
// one rank gives every rank the same error.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "collective_counts.hpp"
#include "conv_dt_runs.hpp"
#include "expect_error.hpp"

namespace {

using namespace kdnn_test;

/// An integer-valued element of the whole sequence (t < 0: the initial
/// state's row t + K − 1), so that sums of a few are exact.
double sequence_value(int b, std::int64_t t, int c) { return 1000.0 * b + 10.0 * double(t) + c; }
/// The gradient rank r's halo row j gets, also integer-valued.
double gradient_value(int r, int b, int j, int c) { return 100.0 * r + 20.0 * b + 3.0 * j + c; }

/// For every split and K, with and without an initial state: gather()'s halo
/// is the whole sequence's K−1 steps before the rank's first (zeros before
/// step 0 without an initial state), and scatter_add() adds to each step
/// (and to rank 0's initial state) the gradients of the halo rows that read it.
TEST(CpHaloPlan, GatherBringsTheStepsBeforeAndScatterAddSendsTheirGradientsBack) {
  const int P = comm_size(), rank = comm_rank(), B = 2, C = 3, L = 11;
  for (int K : {1, 2, 4, 7}) {
    for (const auto& lengths : rank_splits(P, L, K > 2 ? K - 2 : 1, 0)) {
      for (bool init : {false, true}) {
        const std::vector<std::int64_t> offsets = [&] {
          std::vector<std::int64_t> o{0};
          for (int l : lengths) o.push_back(o.back() + l);
          return o;
        }();
        const std::int64_t begin = offsets[rank];
        const int n = lengths[rank];
        SCOPED_TRACE("K=" + std::to_string(K) + " init=" + std::to_string(init) + " rank " +
                     std::to_string(rank) + " of split starting " + std::to_string(begin));
        const cp::HaloPlan plan(MPI_COMM_WORLD, n, K);
        ASSERT_EQ(plan.offsets(), offsets);
        Vec x, h0, expected_halo, dhalo, expected_dx, expected_dinit;
        for (int b = 0; b < B; ++b) {
          for (int s = 0; s < n; ++s) {
            for (int c = 0; c < C; ++c) x.push_back(sequence_value(b, begin + s, c));
          }
          for (int j = 0; j < K - 1; ++j) {
            for (int c = 0; c < C; ++c) {
              const std::int64_t t = begin - (K - 1) + j;
              h0.push_back(sequence_value(b, j - (K - 1), c));
              expected_halo.push_back(t >= 0 || init ? sequence_value(b, t, c) : 0.0);
              dhalo.push_back(gradient_value(rank, b, j, c));
            }
          }
        }
        // dx of step t: the rows of every rank's halo that read it.
        const auto gradient_of = [&](int b, std::int64_t t, int c) {
          double sum = 0;
          for (int r = 0; r < P; ++r) {
            const std::int64_t j = t - (offsets[r] - (K - 1));
            if (j >= 0 && j < K - 1 && (t >= 0 || init)) sum += gradient_value(r, b, int(j), c);
          }
          return sum;
        };
        for (int b = 0; b < B; ++b) {
          for (int s = 0; s < n; ++s) {
            for (int c = 0; c < C; ++c) expected_dx.push_back(gradient_of(b, begin + s, c));
          }
          for (int j = 0; j < K - 1; ++j) {
            for (int c = 0; c < C; ++c) expected_dinit.push_back(gradient_of(b, j - (K - 1), c));
          }
        }
        const auto xd = to_device<double***>(x, B, n, C);
        DeviceView<double***> init_d, dinit_d, halo("halo", B, K - 1, C), dx("dx", B, n, C);
        if (init && rank == 0) {
          init_d = to_device<double***>(h0, B, K - 1, C);
          dinit_d = DeviceView<double***>("dinit", B, K - 1, C);
        }
        plan.gather(Space(), kdnn::StridedTensor3<const double, Space>(xd),
                    kdnn::StridedTensor3<const double, Space>(init_d),
                    kdnn::Tensor3<double, Space>(halo))
            .finish();
        EXPECT_EQ(to_host(halo), expected_halo);
        const auto dhalo_d = to_device<double***>(dhalo, B, K - 1, C);
        plan.scatter_add(Space(), kdnn::Tensor3<const double, Space>(dhalo_d),
                         kdnn::StridedTensor3<double, Space>(dx),
                         kdnn::StridedTensor3<double, Space>(dinit_d))
            .finish();
        EXPECT_EQ(to_host(dx), expected_dx);
        if (init && rank == 0) {
          EXPECT_EQ(to_host(dinit_d), expected_dinit);
        }
      }
    }
  }
}

// One plan, made once, for two layers of other B, C and H (the same split
// and K) and two steps of each: bit for bit the calls that make their own.
TEST(CpHaloPlan, OnePlanServesEveryLayerAndStep) {
  const int P = comm_size(), rank = comm_rank(), L = 5 * P + 3, K = 4;
  const int n = L / P + (rank < L % P ? 1 : 0);
  const int first = rank * (L / P) + std::min(rank, L % P);
  const cp::HaloPlan plan(MPI_COMM_WORLD, n, K);
  const std::vector<Problem> layers = {Problem(2, L, 5, K, 3, true, true, true),
                                       Problem(3, L, 2, K, 1, false, false, true)};
  for (int step = 0; step < 2; ++step) {
    for (const Problem& layer : layers) {
      expect_same(run<double>(layer, first, n, MPI_COMM_WORLD, nullptr, nullptr, &plan),
                  run<double>(layer, first, n, MPI_COMM_WORLD));
    }
  }
}

// The set-up collectives of one call: one all-gather of its checks and
// signature; no reduction, no broadcast (those come only with an error).
TEST(CpHaloPlan, ACallAgreesInOneCollective) {
  const int n = 6, K = 3, B = 2, C = 3, H = 2;
  const cp::HaloPlan plan(MPI_COMM_WORLD, n, K);
  const auto a = zero_forward(B, n, C, K, H);
  for (bool with_plan : {false, true}) {
    const CollectiveCounts before = collective_counts();
    if (with_plan) {
      cp::conv_dt_forward(Space(), plan, a);
    } else {
      cp::conv_dt_forward(Space(), MPI_COMM_WORLD, a);
    }
    const CollectiveCounts made = collective_counts() - before;
    EXPECT_EQ(made.allgather, 1) << "with_plan=" << with_plan;
    EXPECT_EQ(made.allreduce, 0) << "with_plan=" << with_plan;
    EXPECT_EQ(made.bcast, 0) << "with_plan=" << with_plan;
  }
}

TEST(CpHaloPlan, BadOrMismatchedArgumentsGiveEveryRankTheSameError) {
  const int P = comm_size(), rank = comm_rank(), odd = P - 1;
  const std::string on_odd = " (on rank " + std::to_string(odd) + " of " + std::to_string(P) + ")";
  EXPECT_EQ(error_of([&] { cp::HaloPlan(MPI_COMM_WORLD, rank == odd ? -1 : 3, 4); }),
            "cp::HaloPlan: steps=-1, expected >= 0 (this rank's sequence steps)" + on_odd);
  EXPECT_EQ(error_of([&] { cp::HaloPlan(MPI_COMM_WORLD, 3, rank == odd ? 0 : 4); }),
            "cp::HaloPlan: K=0, expected >= 1 (the convolution's width)" + on_odd);
  if (P > 1) {
    EXPECT_EQ(error_of([&] { cp::HaloPlan(MPI_COMM_WORLD, 3, rank == odd ? 5 : 4); }),
              "cp::HaloPlan: K=5 on rank " + std::to_string(odd) +
                  ", expected 4 (as on rank 0; every rank must agree)");
  }
  // A call whose steps or K are not its plan's.
  const int n = 4, K = 3, B = 1, C = 2, H = 1;
  const cp::HaloPlan plan(MPI_COMM_WORLD, n, K);
  const int mine = rank == odd ? n + 1 : n;
  const auto a = zero_forward(B, mine, C, K, H);
  EXPECT_EQ(error_of([&] { cp::conv_dt_forward(Space(), plan, a); }),
            "cp::conv_dt_forward: x has extent(1)=" + std::to_string(n + 1) + ", expected " +
                std::to_string(n) + " (the plan's steps on this rank)" + on_odd);
  // gather(): a halo of the wrong width on one rank.
  DeviceView<double***> wide("halo", B, rank == odd ? K : K - 1, C);
  DeviceView<double***> xs("x", B, n, C);
  EXPECT_EQ(error_of([&] {
              plan.gather(Space(), kdnn::StridedTensor3<const double, Space>(xs), {},
                          kdnn::Tensor3<double, Space>(wide))
                  .finish();
            }),
            "cp::HaloPlan::gather: halo has extent(1)=" + std::to_string(K) + ", expected " +
                std::to_string(K - 1) + " (K-1, the plan's width - 1)" + on_odd);
  // After the errors, the plan still works on every rank.
  EXPECT_EQ(
      error_of([&] {
        plan.gather(Space(), kdnn::StridedTensor3<const double, Space>(xs), {}, a.halo).finish();
      }),
      "");
}

}  // namespace
