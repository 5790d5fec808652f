// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::cp::HaloPlan (kdnn/cp/halo_plan.hpp), run by ctest under mpiexec at
// 1, 2, 3 and 4 ranks: gather() brings each rank the K−1 steps before each
// of its segments (from one or more ranks, itself included, rank 0's
// initial state, or zeros) for every layout (contiguous splits,
// load-balanced, interleaved); scatter_add() is its adjoint (each received gradient
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
#include "test_layouts.hpp"

namespace {

using namespace kdnn_test;

/// An integer-valued element of the whole sequence (t < 0: the initial
/// state's row t + K − 1), so that sums of a few are exact.
double sequence_value(int b, std::int64_t t, int c) { return 1000.0 * b + 10.0 * double(t) + c; }
/// The gradient rank r's halo row j gets, also integer-valued.
double gradient_value(int r, int b, int j, int c) { return 100.0 * r + 20.0 * b + 3.0 * j + c; }

/// For every layout and K, with and without an initial state: gather()'s
/// halo holds, for each of the rank's segments, the whole sequence's K−1
/// steps before it (zeros before step 0 without an initial state), and
/// scatter_add() adds to each step (and to rank 0's initial state) the
/// gradients of every halo row that read it, its own rank's included.
void expect_gather_and_scatter_add(const NamedLayout& named, int K, bool init) {
  const int P = comm_size(), rank = comm_rank(), B = 2, C = 3;
  const auto& layout = named.layout;
  const auto& segments = layout.segments(rank);
  const int n = int(layout.local_steps(rank)), K1 = K - 1, rows = int(segments.size()) * K1;
  SCOPED_TRACE(named.name + " K=" + std::to_string(K) + " init=" + std::to_string(init) + " rank " +
               std::to_string(rank));
  const cp::HaloPlan plan = named.contiguous ? cp::HaloPlan(MPI_COMM_WORLD, n, K)
                                             : cp::HaloPlan(MPI_COMM_WORLD, layout, K);
  ASSERT_TRUE(plan.layout() == layout);
  ASSERT_EQ(plan.halo_rows(), rows);
  Vec x, h0, expected_halo, dhalo, expected_dx, expected_dinit;
  for (int b = 0; b < B; ++b) {
    for (const auto& seg : segments) {
      for (std::int64_t t = seg.begin; t < seg.end; ++t) {
        for (int c = 0; c < C; ++c) x.push_back(sequence_value(b, t, c));
      }
    }
    for (int j = 0; j < K1; ++j) {
      for (int c = 0; c < C; ++c) h0.push_back(sequence_value(b, j - K1, c));
    }
    for (std::size_t s = 0; s < segments.size(); ++s) {
      for (int j = 0; j < K1; ++j) {
        for (int c = 0; c < C; ++c) {
          const std::int64_t t = segments[s].begin - K1 + j;
          expected_halo.push_back(t >= 0 || init ? sequence_value(b, t, c) : 0.0);
          dhalo.push_back(gradient_value(rank, b, int(s) * K1 + j, c));
        }
      }
    }
  }
  // dx of step t: the rows of every rank's halo that read it.
  const auto gradient_of = [&](int b, std::int64_t t, int c) {
    double sum = 0;
    for (int r = 0; r < P; ++r) {
      const auto& list = layout.segments(r);
      for (std::size_t s = 0; s < list.size(); ++s) {
        const std::int64_t j = t - (list[s].begin - K1);
        if (j >= 0 && j < K1 && (t >= 0 || init)) {
          sum += gradient_value(r, b, int(s) * K1 + int(j), c);
        }
      }
    }
    return sum;
  };
  for (int b = 0; b < B; ++b) {
    for (const auto& seg : segments) {
      for (std::int64_t t = seg.begin; t < seg.end; ++t) {
        for (int c = 0; c < C; ++c) expected_dx.push_back(gradient_of(b, t, c));
      }
    }
    for (int j = 0; j < K1; ++j) {
      for (int c = 0; c < C; ++c) expected_dinit.push_back(gradient_of(b, j - K1, c));
    }
  }
  const auto xd = to_device<double***>(x, B, n, C);
  DeviceView<double***> init_d, dinit_d, halo("halo", B, rows, C), dx("dx", B, n, C);
  if (init && rank == 0) {
    init_d = to_device<double***>(h0, B, K1, C);
    dinit_d = DeviceView<double***>("dinit", B, K1, C);
  }
  plan.gather(Space(), kdnn::StridedTensor3<const double, Space>(xd),
              kdnn::StridedTensor3<const double, Space>(init_d), kdnn::Tensor3<double, Space>(halo))
      .finish();
  EXPECT_EQ(to_host(halo), expected_halo);
  const auto dhalo_d = to_device<double***>(dhalo, B, rows, C);
  plan.scatter_add(Space(), kdnn::Tensor3<const double, Space>(dhalo_d),
                   kdnn::StridedTensor3<double, Space>(dx),
                   kdnn::StridedTensor3<double, Space>(dinit_d))
      .finish();
  EXPECT_EQ(to_host(dx), expected_dx);
  if (init && rank == 0) {
    EXPECT_EQ(to_host(dinit_d), expected_dinit);
  }
}

TEST(CpHaloPlan, GatherBringsTheStepsBeforeAndScatterAddSendsTheirGradientsBack) {
  for (int K : {1, 2, 4, 7}) {
    for (int L : {11, 3, 0}) {
      for (const auto& named : test_layouts(comm_size(), L, K > 2 ? K - 2 : 1)) {
        for (bool init : {false, true}) expect_gather_and_scatter_add(named, K, init);
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
  // A layout that differs between the ranks, or is not the communicator's.
  const auto layout = cp::SequenceLayout::load_balanced(10, P);
  const auto other = cp::SequenceLayout::load_balanced(rank == odd ? 11 : 10, P);
  if (P > 1) {
    EXPECT_EQ(error_of([&] { cp::HaloPlan(MPI_COMM_WORLD, other, 4); }),
              "cp::HaloPlan: layout on rank " + std::to_string(odd) +
                  " differs from rank 0's, expected the same values on every rank (a parameter "
                  "of the whole sequence)");
  }
  EXPECT_EQ(error_of([&] {
              cp::HaloPlan(MPI_COMM_WORLD, cp::SequenceLayout::load_balanced(10, P + 1), 4);
            }),
            "cp::HaloPlan: the layout has " + std::to_string(P + 1) + " ranks, expected " +
                std::to_string(P) + " (the communicator's) (on rank 0 of " + std::to_string(P) +
                ")");
  // A conv call on a plan whose layout differs between the ranks (made
  // locally, as Agreed wrongly claims): every rank refuses it.
  if (P > 1) {
    const cp::HaloPlan local(MPI_COMM_WORLD, rank == odd ? other : layout, 4,
                             cp::HaloPlan::Agreed{});
    const auto b = zero_forward(1, int(local.steps()), 2, 4, 1);
    auto with_rows = b;
    with_rows.halo = DeviceView<double***>("halo", 1, local.halo_rows(), 2);
    EXPECT_EQ(error_of([&] { cp::conv_dt_forward(Space(), local, with_rows); }),
              "cp::conv_dt_forward: plan's layout on rank " + std::to_string(odd) +
                  " differs from rank 0's, expected the same values on every rank (a parameter "
                  "of the whole sequence)");
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
                std::to_string(K - 1) + " ((K-1)·segments, the plan's halo rows)" + on_odd);
  // After the errors, the plan still works on every rank.
  EXPECT_EQ(
      error_of([&] {
        plan.gather(Space(), kdnn::StridedTensor3<const double, Space>(xs), {}, a.halo).finish();
      }),
      "");
}

}  // namespace
