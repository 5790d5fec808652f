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
#include "conv_reference.hpp"
#include "expect_error.hpp"
#include "kdnn/cp/cp.hpp"
#include "kdnn/ssm/ssm.hpp"
#include "rank_splits.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
using ssm_ref::Vec;
namespace cp = kdnn::cp;
namespace ssm = kdnn::ssm;

/// One whole-sequence problem: conv inputs [B, L, C], dt [B, L, H] and the
/// upstream gradients.
struct Problem {
  int B, L, C, K, H;
  bool bias, init, dfinal;
  Vec x, w, b, h0, dy, dfin, dt, dt_bias, ddt_out;
  Vec seq;  ///< [B, L] sequence ids, or empty

  Problem(int B_, int L_, int C_, int K_, int H_, bool bias_, bool init_, bool dfinal_)
      : B(B_), L(L_), C(C_), K(K_), H(H_), bias(bias_), init(init_), dfinal(dfinal_) {
    const std::size_t n = std::size_t(B) * L * C, ns = std::size_t(B) * (K - 1) * C;
    x = normal(n, 1);
    w = uniform(std::size_t(C) * K, -0.6, 0.6, 2);
    if (bias) b = uniform(C, -0.5, 0.5, 3);
    if (init) h0 = normal(ns, 4);
    dy = normal(n, 5);
    if (dfinal) dfin = normal(ns, 6);
    dt = uniform(std::size_t(B) * L * H, -4, 4, 7);
    dt_bias = uniform(H, -1, 1, 8);
    ddt_out = normal(dt.size(), 9);
  }
};

/// Steps [first, first + n) of a [B, L, E] tensor.
Vec slice(const Vec& v, int B, int L, int E, int first, int n) {
  Vec out;
  for (int b = 0; b < B; ++b) {
    const auto at = v.begin() + (std::size_t(b) * L + first) * E;
    out.insert(out.end(), at, at + std::size_t(n) * E);
  }
  return out;
}

/// Every output and gradient of one run, flat.
struct Result {
  Vec y, final_state, dt_out, dx, dw, dbias, dinit, ddt, ddt_bias;
};

/// The run on this rank's steps [first, first + n) (first = 0, n = L and
/// `comm` = null: the single-rank operators on the whole sequence). Rank 0
/// holds the initial state and its gradient; every rank asks for its final
/// state, the last rank gets d(final state).
template <class T>
Result run(const Problem& p, int first, int n, MPI_Comm comm, cp::HaloStats* fwd = nullptr,
           cp::HaloStats* bwd = nullptr) {
  const bool single = comm == MPI_COMM_NULL;
  const int rank = single ? 0 : comm_rank(), last = single ? 0 : comm_size() - 1;
  const int B = p.B, C = p.C, K = p.K, H = p.H;
  const auto x = to_device<T***>(slice(p.x, B, p.L, C, first, n), B, n, C);
  const auto dy = to_device<T***>(slice(p.dy, B, p.L, C, first, n), B, n, C);
  const auto dt = to_device<T***>(slice(p.dt, B, p.L, H, first, n), B, n, H);
  const auto ddt_out = to_device<T***>(slice(p.ddt_out, B, p.L, H, first, n), B, n, H);
  const auto w = to_device<T**>(p.w, C, K);
  const auto dt_bias = to_device<T*>(p.dt_bias, H);
  DeviceView<T*> bias, dbias;
  DeviceView<T***> init, dinit, dfinal;
  if (p.bias) bias = to_device<T*>(p.b, C), dbias = DeviceView<T*>("dbias", C);
  if (p.init && rank == 0) {
    init = to_device<T***>(p.h0, B, K - 1, C);
    dinit = DeviceView<T***>("dinit", B, K - 1, C);
  }
  if (p.dfinal && rank == last) dfinal = to_device<T***>(p.dfin, B, K - 1, C);
  DeviceView<T***> y("y", B, n, C), fin("final", B, K - 1, C), halo("halo", B, K - 1, C);
  DeviceView<T***> dt_out("dt_out", B, n, H), dx("dx", B, n, C), ddt("ddt", B, n, H);
  DeviceView<T**> dw("dw", C, K);
  DeviceView<T*> ddt_bias("ddt_bias", H);
  DeviceView<int**> seq;
  if (!p.seq.empty()) seq = to_device<int**>(slice(p.seq, B, p.L, 1, first, n), B, n);

  ssm::ConvForward<T, Space> f;
  f.x = x, f.w = w, f.bias = bias, f.initial_state = init, f.y = y, f.final_state = fin;
  f.seq_idx = seq;
  ssm::ConvBackward<T, Space> g;
  g.x = x, g.w = w, g.bias = bias, g.dy = dy, g.dfinal_state = dfinal, g.seq_idx = seq;
  g.dx = dx, g.dw = dw, g.dbias = dbias, g.dinitial_state = dinit;
  if (single) {
    ssm::causal_conv1d_forward(Space(), f);
    ssm::dt_softplus_forward(Space(), dt, dt_bias, dt_out);
    g.initial_state = init;
    ssm::causal_conv1d_backward(Space(), g);
    ssm::dt_softplus_backward(Space(), dt, dt_bias, ddt_out, ddt, ddt_bias);
  } else {
    cp::ConvDtForward<T, Space> cf;
    cf.conv = f, cf.halo = halo, cf.dt = dt, cf.dt_bias = dt_bias, cf.dt_out = dt_out;
    const auto sf = cp::conv_dt_forward(Space(), comm, cf);
    g.initial_state = halo;
    cp::ConvDtBackward<T, Space> cb;
    cb.conv = g, cb.dt = dt, cb.dt_bias = dt_bias, cb.ddt_out = ddt_out, cb.ddt = ddt;
    cb.ddt_bias = ddt_bias;
    const auto sb = cp::conv_dt_backward(Space(), comm, cb);
    cp::allreduce_sum(comm, dw);
    if (p.bias) cp::allreduce_sum(comm, dbias);
    cp::allreduce_sum(comm, ddt_bias);
    if (fwd) *fwd = sf;
    if (bwd) *bwd = sb;
  }
  Result r{to_host(y),
           to_host(fin),
           to_host(dt_out),
           to_host(dx),
           to_host(dw),
           p.bias ? to_host(dbias) : Vec{},
           dinit.size() ? to_host(dinit) : Vec{},
           to_host(ddt),
           to_host(ddt_bias)};
  return r;
}

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
  DeviceView<double***> x("x", B, n, C), y("y", B, n, C), halo("halo", B, K - 1, C);
  DeviceView<double**> w("w", C, K);
  DeviceView<double***> dt("dt", B, n, H), dt_out("dt_out", B, n, H);
  DeviceView<double*> dt_bias("dt_bias", H);
  cp::ConvDtForward<double, Space> a;
  a.conv.x = x, a.conv.w = w, a.conv.y = y, a.halo = halo;
  a.dt = dt, a.dt_bias = dt_bias, a.dt_out = dt_out;
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
  DeviceView<double***> x3("x", B, n, 3), y3("y", B, n, 3), halo3("halo", B, K - 1, 3);
  DeviceView<double**> w3("w", 3, K);
  a.conv.x = x3, a.conv.w = w3, a.conv.y = y3, a.halo = halo3;
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

TEST(SequenceSplit, PiecesComeFromEveryPredecessorInTheWindow) {
  // Lengths 1, 0, 2, 5 with K−1 = 3: rank 3's window [0, 3) comes from ranks
  // 0 (step 0) and 2 (steps 1, 2); with an initial state rank 1's window
  // [−2, 1) takes [−2, 0) and step 0 from rank 0, and so does empty rank 2.
  const auto pieces = cp::halo_pieces({0, 1, 1, 3, 8}, 3, true);
  std::vector<std::vector<std::int64_t>> got;
  for (const auto& p : pieces) got.push_back({p.from, p.to, p.begin, p.end});
  const std::vector<std::vector<std::int64_t>> expected = {
      {0, 1, -2, 0}, {0, 1, 0, 1}, {0, 2, -2, 0}, {0, 2, 0, 1}, {0, 3, 0, 1}, {2, 3, 1, 3}};
  EXPECT_EQ(got, expected);
}

}  // namespace
