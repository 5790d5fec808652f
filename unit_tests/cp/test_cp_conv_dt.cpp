// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Context-parallel conv + dt (kdnn/cp/conv_dt.hpp), run by ctest under
// mpiexec at 1, 2, 3 and 4 ranks: for splits of one sequence (even, uneven,
// ranks shorter than K−1, ranks with no steps) every output and gradient on
// every rank equals the single-rank operators on the whole sequence (the
// rank's slice of it; parameter gradients summed over the ranks), to float64
// round-off; with packed sequences (seq_idx) too, whose starts fall on the
// ranks' edges and inside their halos. And the collective checks: a bad or
// mismatched argument on one rank gives every rank the same error, and the
// test finishes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "allclose.hpp"
#include "conv_dt_runs.hpp"
#include "expect_error.hpp"

namespace {

using namespace kdnn_test;

void expect_equal_to_single_rank(const Problem& p) {
  const int P = comm_size(), rank = comm_rank();
  const Result whole = run<double>(p, 0, p.L, MPI_COMM_NULL);
  // Short ranks hold fewer than the K − 1 steps of a halo.
  for (const auto& lengths : kdnn_test::rank_splits(P, p.L, p.K > 2 ? p.K - 2 : 1, 0)) {
    const int first = std::accumulate(lengths.begin(), lengths.begin() + rank, 0);
    const int n = lengths[rank];
    std::string text;
    for (int l : lengths) text += std::to_string(l) + " ";
    SCOPED_TRACE("K=" + std::to_string(p.K) + " split " + text + "rank " + std::to_string(rank));
    cp::HaloStats fs, bs;
    const Result part = run<double>(p, first, n, MPI_COMM_WORLD, &fs, &bs);
    const double tol = 1e-13;
    EXPECT_ALLCLOSE(part.y, slice(whole.y, p.B, p.L, p.C, first, n), tol, tol);
    EXPECT_ALLCLOSE(part.dt_out, slice(whole.dt_out, p.B, p.L, p.H, first, n), tol, tol);
    EXPECT_ALLCLOSE(part.dx, slice(whole.dx, p.B, p.L, p.C, first, n), tol, tol);
    EXPECT_ALLCLOSE(part.ddt, slice(whole.ddt, p.B, p.L, p.H, first, n), tol, tol);
    EXPECT_ALLCLOSE(part.dw, whole.dw, tol, tol);
    EXPECT_ALLCLOSE(part.dbias, whole.dbias, tol, tol);
    EXPECT_ALLCLOSE(part.ddt_bias, whole.ddt_bias, tol, tol);
    if (rank == 0) {
      EXPECT_ALLCLOSE(part.dinit, whole.dinit, tol, tol);
    }
    if (rank == P - 1) {
      EXPECT_ALLCLOSE(part.final_state, whole.final_state, 0, 0);
    }
    // Every rank but the first receives B·(K−1)·C elements, less before the
    // sequence starts when there is no initial state (zeros are not sent).
    const int before = rank == 0 ? 0 : first + (p.init ? p.K - 1 : 0);
    const int window = before < p.K - 1 ? before : p.K - 1;
    EXPECT_EQ(fs.bytes_received, std::int64_t(p.B) * window * p.C * 8);
    EXPECT_EQ(bs.bytes_sent, fs.bytes_received);  // the gradients go back
    // A plan made once for this split gives the same, bit for bit.
    const cp::HaloPlan plan(MPI_COMM_WORLD, n, p.K);
    cp::HaloStats pfs, pbs;
    expect_same(run<double>(p, first, n, MPI_COMM_WORLD, &pfs, &pbs, &plan), part);
    EXPECT_EQ(pfs.bytes_received, fs.bytes_received);
    EXPECT_EQ(pbs.bytes_sent, bs.bytes_sent);
  }
}

TEST(CpConvDt, EqualsSingleRankForEverySplit) {
  for (int K : {1, 2, 4, 7}) {
    expect_equal_to_single_rank(Problem(2, 23, 5, K, 3, true, true, true));
  }
  expect_equal_to_single_rank(Problem(1, 9, 3, 4, 2, false, false, false));
  expect_equal_to_single_rank(Problem(2, 0, 3, 3, 2, true, true, true));  // no steps at all
}

// Packed sequences across ranks: each rank's halo carries the ids of the
// steps before it, so a window stops at a start wherever it falls (on a
// rank's first step, inside its halo, on an earlier rank than the one
// before); each rank's final state keeps only its last step's sequence.
TEST(CpConvDt, PackedSequencesEqualSingleRankForEverySplit) {
  for (int K : {2, 4, 7}) {
    Problem p(3, 29, 4, K, 2, true, true, true);
    p.seq = packed_ids(p.B, p.L, {{3, 5, 2, 5, 5, 1, 1, 7}, {1}, {1, 14, 1, 6, 7}});
    expect_equal_to_single_rank(p);
  }
  // Ids that recur: a step reads the steps of equal id in its window, as on
  // one rank, also when they are on another rank than its own.
  Problem p(2, 23, 3, 4, 2, false, false, true);
  for (int b = 0; b < p.B; ++b) {
    for (int t = 0; t < p.L; ++t) p.seq.push_back((t / (b + 1)) % 2);
  }
  expect_equal_to_single_rank(p);
}

TEST(CpConvDt, LongerRanksSendExactlyTheHalo) {
  // Every rank holds at least K−1 steps: one message of B·(K−1)·C each way.
  const int P = comm_size(), rank = comm_rank();
  const Problem p(2, 16 * P, 6, 4, 2, true, false, false);
  cp::HaloStats fs, bs;
  run<float>(p, 16 * rank, 16, MPI_COMM_WORLD, &fs, &bs);
  const std::int64_t halo_bytes = std::int64_t(p.B) * (p.K - 1) * p.C * 4;
  EXPECT_EQ(fs.bytes_sent, rank < P - 1 ? halo_bytes : 0);
  EXPECT_EQ(fs.bytes_received, rank > 0 ? halo_bytes : 0);
  EXPECT_EQ(fs.messages_sent, rank < P - 1 ? 1 : 0);
  EXPECT_EQ(bs.bytes_sent, fs.bytes_received);
  EXPECT_EQ(bs.bytes_received, fs.bytes_sent);
}

TEST(CpConvDt, MismatchOnOneRankGivesEveryRankTheSameError) {
  const int P = comm_size(), rank = comm_rank();
  const int odd = P - 1;  // the rank that passes a different argument
  const int B = 2, n = 5, K = 4, H = 2;
  const int C = rank == odd && P > 1 ? 4 : 3;
  auto a = zero_forward(B, n, C, K, H);
  const auto call = [&](const cp::ConvDtForward<double, Space>& args) {
    return error_of([&] { cp::conv_dt_forward(Space(), MPI_COMM_WORLD, args); });
  };
  if (P > 1) {
    EXPECT_EQ(call(a), "cp::conv_dt_forward: C=4 on rank " + std::to_string(odd) +
                           ", expected 3 (as on rank 0; every rank must agree)");
  }
  // A local mistake on one rank (w's K does not match the halo's K−1).
  auto bad = a;
  if (rank == odd) bad.halo = DeviceView<double***>("halo", B, K, C);
  EXPECT_EQ(call(bad),
            "cp::conv_dt_forward: halo has extent(1)=4, expected 3 (K-1, from w's "
            "extent(1)) (on rank " +
                std::to_string(odd) + " of " + std::to_string(P) + ")");
  // After the errors, a correct call on every rank still works.
  a = zero_forward(B, n, 3, K, H);
  // The initial state belongs to rank 0.
  if (P > 1) {
    auto late = a;
    DeviceView<double***> init("init", B, K - 1, 3);
    if (rank == odd) late.conv.initial_state = init;
    EXPECT_EQ(call(late), "cp::conv_dt_forward: initial_state given on rank " +
                              std::to_string(odd) +
                              ", expected it on rank 0 only (it belongs to the start of the "
                              "sequence)");
  }
  // seq_idx is given on every rank or on none.
  if (P > 1) {
    auto packed = a;
    DeviceView<int**> seq("seq_idx", B, n);
    if (rank == odd) packed.conv.seq_idx = seq;
    EXPECT_EQ(call(packed), "cp::conv_dt_forward: seq_idx given=1 on rank " + std::to_string(odd) +
                                ", expected 0 (as on rank 0; every rank must agree)");
  }
  // Parameters valid on each rank alone but with other values on one: the
  // weights and dt_bias, compared by fingerprint; and dt's limits.
  if (P > 1) {
    const std::string on_odd = " on rank " + std::to_string(odd);
    const std::string same =
        " differs from rank 0's, expected the same values on every rank "
        "(a parameter of the whole sequence)";
    auto weights = a;
    if (rank == odd) weights.conv.w = to_device<double**>(std::vector<double>(3 * K, 0.5), 3, K);
    EXPECT_EQ(call(weights), "cp::conv_dt_forward: weight" + on_odd + same);
    auto bias = a;
    if (rank == odd) bias.dt_bias = to_device<double*>({0, 1}, H);
    EXPECT_EQ(call(bias), "cp::conv_dt_forward: dt_bias" + on_odd + same);
    cp::ConvDtOptions limited;
    if (rank == odd) limited.dt.dt_min = 0.25;
    EXPECT_EQ(error_of([&] { cp::conv_dt_forward(Space(), MPI_COMM_WORLD, a, limited); }),
              "cp::conv_dt_forward: opts.dt.dt_min=0.25" + on_odd +
                  ", expected 0 (as on rank 0; every rank must agree)");
  }
  EXPECT_EQ(call(a), "");
}

TEST(SequenceSplit, PiecesComeFromEveryRankInTheWindow) {
  // Contiguous lengths 1, 0, 2, 5 with K−1 = 3: rank 3's window [0, 3) comes
  // from ranks 0 (step 0) and 2 (steps 1, 2); with an initial state rank 0's
  // window [−3, 0) is its own, rank 1's [−2, 1) takes [−2, 0) and step 0 from
  // rank 0, and so does empty rank 2. Rows: {from, to, segment, begin, end,
  // from_row, to_row}.
  using Rows = std::vector<std::vector<std::int64_t>>;
  const auto rows_of = [](const std::vector<cp::HaloPiece>& pieces) {
    Rows got;
    for (const auto& p : pieces)
      got.push_back({p.from, p.to, p.segment, p.begin, p.end, p.from_row, p.to_row});
    return got;
  };
  EXPECT_EQ(rows_of(cp::halo_pieces(cp::SequenceLayout::contiguous({1, 0, 2, 5}), 3, true)),
            (Rows{{0, 0, 0, -3, 0, 0, 0},
                  {0, 1, 0, -2, 0, 1, 0},
                  {0, 1, 0, 0, 1, 0, 2},
                  {0, 2, 0, -2, 0, 1, 0},
                  {0, 2, 0, 0, 1, 0, 2},
                  {0, 3, 0, 0, 1, 0, 0},
                  {2, 3, 0, 1, 3, 0, 1}}));
  // Load-balanced, 7 steps on 2 ranks (chunks [0,2) [2,4) [4,6) [6,7)), K−1
  // = 2, no initial state: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and
  // 2; rank 1's second segment reads its own first (a piece to itself), and
  // rank 0's second segment, its halo rows 2 and 3, reads rank 1's local
  // steps 2 and 3.
  EXPECT_EQ(rows_of(cp::halo_pieces(cp::SequenceLayout::load_balanced(7, 2), 2, false)),
            (Rows{{1, 0, 1, 4, 6, 2, 2}, {0, 1, 0, 0, 2, 0, 0}, {1, 1, 1, 2, 4, 0, 2}}));
}

// Every layout (contiguous splits, load-balanced, interleaved with short
// segments and a rank's own adjacent ones): each rank's outputs and
// gradients equal the single-rank operators' rows for its segments, with
// packed sequences too; the rank whose last segment ends the sequence has
// the sequence's final state.
void expect_layout_equal_to_single_rank(const Problem& p) {
  const int rank = comm_rank();
  const Result whole = run<double>(p, 0, p.L, MPI_COMM_NULL);
  for (const auto& named : test_layouts(comm_size(), p.L, p.K > 2 ? p.K - 2 : 1)) {
    const auto& segments = named.layout.segments(rank);
    SCOPED_TRACE("K=" + std::to_string(p.K) + " " + named.name + " rank " + std::to_string(rank));
    const cp::HaloPlan plan(MPI_COMM_WORLD, named.layout, p.K);
    const bool last = rank == final_rank(named.layout);
    const Result part =
        run_segments<double>(p, segments, MPI_COMM_WORLD, last, nullptr, nullptr, &plan);
    const auto mine = [&](const Vec& v, int E) { return local_steps(v, p.B, p.L, E, segments); };
    const double tol = 1e-13;
    EXPECT_ALLCLOSE(part.y, mine(whole.y, p.C), tol, tol);
    EXPECT_ALLCLOSE(part.dt_out, mine(whole.dt_out, p.H), tol, tol);
    EXPECT_ALLCLOSE(part.dx, mine(whole.dx, p.C), tol, tol);
    EXPECT_ALLCLOSE(part.ddt, mine(whole.ddt, p.H), tol, tol);
    EXPECT_ALLCLOSE(part.dw, whole.dw, tol, tol);
    EXPECT_ALLCLOSE(part.dbias, whole.dbias, tol, tol);
    EXPECT_ALLCLOSE(part.ddt_bias, whole.ddt_bias, tol, tol);
    if (rank == 0) {
      EXPECT_ALLCLOSE(part.dinit, whole.dinit, tol, tol);
    }
    if (last) {
      EXPECT_ALLCLOSE(part.final_state, whole.final_state, 0, 0);
    }
  }
}

TEST(CpConvDt, EqualsSingleRankOnEveryLayout) {
  for (int K : {1, 2, 4}) {
    expect_layout_equal_to_single_rank(Problem(2, 23, 5, K, 3, true, true, true));
  }
  expect_layout_equal_to_single_rank(Problem(1, 5, 3, 4, 2, false, false, true));  // short
  Problem packed(3, 29, 4, 4, 2, true, true, true);
  packed.seq = packed_ids(packed.B, packed.L, {{3, 5, 2, 5, 5, 1, 1, 7}, {1}, {1, 14, 1, 6, 7}});
  expect_layout_equal_to_single_rank(packed);
}

}  // namespace
