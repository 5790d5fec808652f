// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Context-parallel SSD (kdnn/cp/ssd.hpp), run by ctest under mpiexec at 1,
// 2, 3 and 4 ranks: for splits of one sequence (even, uneven, ranks shorter
// than a chunk, ranks with no steps, everything on one rank) every output
// and gradient on every rank equals the single-rank SSD on the whole
// sequence (the rank's slice of it; dA and dD summed over the ranks) to
// float64 round-off, and each rank's final state equals the float64
// recurrence's state at the end of its steps. The bytes a rank sends do not
// depend on L. Packed sequences (seq_idx) whose starts fall on the ranks'
// first steps reset the state passed between the ranks. The collective
// checks give every rank the same error.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/cp/cp.hpp"
#include "kdnn/ssm/ssd.hpp"
#include "rank_splits.hpp"
#include "ssd_reference.hpp"
#include "test_layouts.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
using ssm_ref::SsdCase;
using ssm_ref::SsdShape;
using ssm_ref::Vec;
namespace cp = kdnn::cp;
namespace ssm = kdnn::ssm;

SsdCase make_problem(SsdShape s, bool d, bool init, bool dfinal) {
  SsdCase a;
  a.s = s;
  const std::size_t nx = std::size_t(s.B) * s.L * s.H * s.P;
  const std::size_t nbc = std::size_t(s.B) * s.L * s.G * s.N;
  const std::size_t ns = std::size_t(s.B) * s.H * s.P * s.N;
  a.x = normal(nx, 1);
  a.dt = uniform(std::size_t(s.B) * s.L * s.H, 0.05, 0.6, 2);
  a.A = uniform(s.H, -1.5, -0.2, 3);
  a.Bm = normal(nbc, 4);
  a.Cm = normal(nbc, 5);
  a.dy = normal(nx, 6);
  if (d) a.D = uniform(s.H, -1, 1, 7);
  if (init) a.init = normal(ns, 8);
  if (dfinal) a.dfinal = normal(ns, 9);
  return a;
}

struct Result {
  Vec y, final_state, dx, ddt, dA, dB, dC, dD, dinit, ddt_bias, dz;
  Vec sequence_states;  ///< with `offsets` only
  cp::StateStats forward, backward;
};

/// What runs around the scan (ssd.hpp): dt_bias [H] and z [B, L, H, P]
/// when not empty, softplus of the steps.
struct Around {
  Vec dt_bias, z;
  bool softplus = false;
};

/// The run on this rank's `segments` of the sequence: the single-rank
/// operators when `comm` is null (one segment [0, L)), else this rank's
/// share under `layout` (or, when null, the contiguous split). Rank 0 holds
/// the initial state and its gradient, `dfinal_here` d(final state); every
/// rank asks for its final state, and with `offsets` (the steps' own
/// cu_seqlens) for the states after each of their sequences.
template <class T>
Result run_segments(const SsdCase& a, const std::vector<cp::Segment>& segments, int chunk,
                    MPI_Comm comm, const cp::SequenceLayout* layout, bool dfinal_here,
                    kdnn::KernelForm form = kdnn::KernelForm::automatic, const Around& around = {},
                    const Vec& offsets = {}) {
  int n = 0;
  for (const auto& seg : segments) n += int(seg.steps());
  const bool single = comm == MPI_COMM_NULL;
  const int rank = single ? 0 : comm_rank();
  const auto& s = a.s;
  const int HP = s.H * s.P, GN = s.G * s.N;
  const auto x = to_device<T****>(local_steps(a.x, s.B, s.L, HP, segments), s.B, n, s.H, s.P);
  const auto dy = to_device<T****>(local_steps(a.dy, s.B, s.L, HP, segments), s.B, n, s.H, s.P);
  const auto dt = to_device<T***>(local_steps(a.dt, s.B, s.L, s.H, segments), s.B, n, s.H);
  const auto Bm = to_device<T****>(local_steps(a.Bm, s.B, s.L, GN, segments), s.B, n, s.G, s.N);
  const auto Cm = to_device<T****>(local_steps(a.Cm, s.B, s.L, GN, segments), s.B, n, s.G, s.N);
  const auto A = to_device<T*>(a.A, s.H);
  DeviceView<T*> D, dD;
  if (!a.D.empty()) D = to_device<T*>(a.D, s.H), dD = DeviceView<T*>("dD", s.H);
  DeviceView<T****> init, dinit, dfinal;
  if (!a.init.empty() && rank == 0) {
    init = to_device<T****>(a.init, s.B, s.H, s.P, s.N);
    dinit = DeviceView<T****>("dinit", s.B, s.H, s.P, s.N);
  }
  if (!a.dfinal.empty() && dfinal_here) dfinal = to_device<T****>(a.dfinal, s.B, s.H, s.P, s.N);
  DeviceView<T****> y("y", s.B, n, s.H, s.P), fin("final", s.B, s.H, s.P, s.N);
  DeviceView<T****> dx("dx", s.B, n, s.H, s.P), dB("dB", s.B, n, s.G, s.N),
      dC("dC", s.B, n, s.G, s.N);
  DeviceView<T***> ddt("ddt", s.B, n, s.H);
  DeviceView<T*> dA("dA", s.H), dt_bias, ddt_bias;
  DeviceView<T****> z, dz;
  DeviceView<int**> seq;
  if (!a.seq.empty()) seq = to_device<int**>(local_steps(a.seq, s.B, s.L, 1, segments), s.B, n);
  if (!around.dt_bias.empty()) {
    dt_bias = to_device<T*>(around.dt_bias, s.H), ddt_bias = DeviceView<T*>("ddt_bias", s.H);
  }
  if (!around.z.empty()) {
    z = to_device<T****>(local_steps(around.z, s.B, s.L, HP, segments), s.B, n, s.H, s.P);
    dz = DeviceView<T****>("dz", s.B, n, s.H, s.P);
  }

  ssm::SsdForward<T, Space> f;
  f.x = x, f.dt = dt, f.A = A, f.B = Bm, f.C = Cm, f.D = D, f.initial_state = init;
  f.dt_bias = dt_bias, f.z = z, f.seq_idx = seq;
  f.y = y, f.final_state = fin;
  DeviceView<int*> cu;
  DeviceView<T****> states;
  if (!offsets.empty()) {
    cu = to_device<int*>(offsets, offsets.size());
    states = DeviceView<T****>("states", offsets.size() - 1, s.H, s.P, s.N);
    f.cu_seqlens = cu, f.sequence_states = states;
  }
  ssm::SsdBackward<T, Space> g;
  g.x = x, g.dt = dt, g.A = A, g.B = Bm, g.C = Cm, g.D = D, g.initial_state = init;
  g.dt_bias = dt_bias, g.z = z, g.seq_idx = seq;
  g.dy = dy, g.dfinal_state = dfinal;
  g.dx = dx, g.ddt = ddt, g.dA = dA, g.dB = dB, g.dC = dC, g.dD = dD, g.dinitial_state = dinit;
  g.ddt_bias = ddt_bias, g.dz = dz;
  ssm::SsdOptions opts;
  opts.chunk = chunk;
  opts.launch.form = form;
  opts.dt_softplus = around.softplus;
  Result r;
  if (single) {
    ssm::ssd_forward(Space(), f, opts);
    ssm::ssd_backward(Space(), g, opts);
  } else {
    r.forward = layout ? cp::ssd_forward(Space(), comm, *layout, f, opts)
                       : cp::ssd_forward(Space(), comm, f, opts);
    r.backward = layout ? cp::ssd_backward(Space(), comm, *layout, g, opts)
                        : cp::ssd_backward(Space(), comm, g, opts);
    cp::allreduce_sum(comm, dA);
    if (!a.D.empty()) cp::allreduce_sum(comm, dD);
    if (!around.dt_bias.empty()) cp::allreduce_sum(comm, ddt_bias);
  }
  r.y = to_host(y), r.final_state = to_host(fin), r.dx = to_host(dx), r.ddt = to_host(ddt);
  r.dA = to_host(dA), r.dB = to_host(dB), r.dC = to_host(dC);
  if (!a.D.empty()) r.dD = to_host(dD);
  if (dinit.size()) r.dinit = to_host(dinit);
  if (!around.dt_bias.empty()) r.ddt_bias = to_host(ddt_bias);
  if (!around.z.empty()) r.dz = to_host(dz);
  if (!offsets.empty()) r.sequence_states = to_host(states);
  return r;
}

/// The run on steps [first, first + n) of a contiguous split (the last
/// rank gets d(final state)), or of the whole sequence when `comm` is null.
template <class T>
Result run(const SsdCase& a, int first, int n, int chunk, MPI_Comm comm,
           kdnn::KernelForm form = kdnn::KernelForm::automatic, const Around& around = {},
           const Vec& offsets = {}) {
  const bool last = comm == MPI_COMM_NULL || comm_rank() == comm_size() - 1;
  return run_segments<T>(a, {{first, first + n}}, chunk, comm, nullptr, last, form, around,
                         offsets);
}

/// The float64 recurrence's state after step `end` − 1 ([B, H, P, N]).
Vec state_at(const SsdCase& a, int end) {
  const auto& s = a.s;
  Vec out(std::size_t(s.B) * s.H * s.P * s.N);
  const ssm_ref::SsdIndex ix{s};
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h) {
      const auto hs = ssm_ref::ssd_states(a, b, h);
      for (int p = 0; p < s.P; ++p)
        for (int j = 0; j < s.N; ++j) out[ix.state(b, h, p, j)] = hs[end][std::size_t(p) * s.N + j];
    }
  return out;
}

/// `a` on the step sizes after the transform (dt_bias, softplus): what the
/// float64 recurrence's states run on.
SsdCase on_step_sizes(const SsdCase& a, const Around& around) {
  SsdCase steps = a;
  for (std::size_t i = 0; i < steps.dt.size(); ++i) {
    const double u = a.dt[i] + (around.dt_bias.empty() ? 0.0 : around.dt_bias[i % a.s.H]);
    steps.dt[i] = around.softplus ? std::log1p(std::exp(u)) : u;
  }
  return steps;
}

void expect_equal_to_single_rank(const SsdCase& a, int chunk,
                                 kdnn::KernelForm form = kdnn::KernelForm::automatic,
                                 const Around& around = {}) {
  const int R = comm_size(), rank = comm_rank();
  const auto& s = a.s;
  const Result whole = run<double>(a, 0, s.L, chunk, MPI_COMM_NULL, form, around);
  const SsdCase steps = on_step_sizes(a, around);
  // Short ranks hold less than a chunk; uneven ones more than one.
  for (const auto& lengths : kdnn_test::rank_splits(R, s.L, chunk > 1 ? chunk - 1 : 1, chunk)) {
    const int first = std::accumulate(lengths.begin(), lengths.begin() + rank, 0);
    const int n = lengths[rank];
    std::string text;
    for (int l : lengths) text += std::to_string(l) + " ";
    SCOPED_TRACE("Q=" + std::to_string(chunk) + " L=" + std::to_string(s.L) + " split " + text +
                 "rank " + std::to_string(rank));
    const Result part = run<double>(a, first, n, chunk, MPI_COMM_WORLD, form, around);
    const double tol = 1e-12;
    const int HP = s.H * s.P, GN = s.G * s.N;
    EXPECT_ALLCLOSE(part.y, slice(whole.y, s.B, s.L, HP, first, n), tol, tol);
    EXPECT_ALLCLOSE(part.dx, slice(whole.dx, s.B, s.L, HP, first, n), tol, tol);
    EXPECT_ALLCLOSE(part.ddt, slice(whole.ddt, s.B, s.L, s.H, first, n), tol, tol);
    EXPECT_ALLCLOSE(part.dB, slice(whole.dB, s.B, s.L, GN, first, n), tol, tol);
    EXPECT_ALLCLOSE(part.dC, slice(whole.dC, s.B, s.L, GN, first, n), tol, tol);
    EXPECT_ALLCLOSE(part.dA, whole.dA, tol, tol);
    EXPECT_ALLCLOSE(part.dD, whole.dD, tol, tol);
    EXPECT_ALLCLOSE(part.ddt_bias, whole.ddt_bias, tol, tol);
    if (!around.z.empty()) {
      EXPECT_ALLCLOSE(part.dz, slice(whole.dz, s.B, s.L, HP, first, n), tol, tol);
    }
    if (rank == 0) {
      EXPECT_ALLCLOSE(part.dinit, whole.dinit, tol, tol);
    }
    EXPECT_ALLCLOSE(part.final_state, state_at(steps, first + n), tol, tol);
    // Each rank's summary goes to every other rank: B·H·(1 + P·N) values
    // forward, B·H·(1 + 2·P·N) backward, whatever L and the split; rank 0's
    // initial state is one summary more.
    const std::int64_t bh = std::int64_t(s.B) * s.H, pn = std::int64_t(s.P) * s.N;
    const bool init = !a.init.empty();
    const std::int64_t mine = rank == 0 && init ? 2 : 1, others = R - 1 + (rank > 0 && init);
    EXPECT_EQ(part.forward.bytes_sent, mine * (R - 1) * bh * (1 + pn) * 8);
    EXPECT_EQ(part.backward.bytes_sent, mine * (R - 1) * bh * (1 + 2 * pn) * 8);
    EXPECT_EQ(part.forward.bytes_received, others * bh * (1 + pn) * 8);
  }
}

TEST(CpSsd, EqualsSingleRankForEverySplit) {
  expect_equal_to_single_rank(make_problem({2, 29, 4, 5, 2, 3}, true, true, true), 4);
  expect_equal_to_single_rank(make_problem({1, 37, 2, 4, 1, 4}, false, false, false), 8);
  expect_equal_to_single_rank(make_problem({1, 23, 3, 3, 3, 2}, true, false, true), 64);
  expect_equal_to_single_rank(make_problem({2, 0, 2, 3, 1, 2}, true, true, true), 4);  // no steps
}

/// dt_bias, softplus and a gate z for the problem `a` (H = 4).
Around step_sizes_and_gate(const SsdCase& a) {
  Around around;
  around.dt_bias = uniform(4, -1.0, 0.3, 21);
  around.z = normal(a.x.size(), 22);
  around.softplus = true;
  return around;
}

// The step-size transform and the gate (ssm/impl/ssd_around.hpp) on every
// rank's steps: dt_bias's gradient summed over the ranks, and the
// backward's recomputation of the ungated output a collective forward.
TEST(CpSsd, StepSizesAndGateEqualSingleRankForEverySplit) {
  const SsdCase a = make_problem({2, 29, 4, 5, 2, 3}, true, true, true);
  expect_equal_to_single_rank(a, 4, kdnn::KernelForm::automatic, step_sizes_and_gate(a));
}

/// The same on every layout of test_layouts (contiguous splits,
/// load-balanced, interleaved with short and empty segments, a rank's own
/// adjacent ones): each rank's rows equal the single rank's rows for its
/// segments, and its final state the recurrence's at the end of its last
/// segment.
void expect_layout_equal_to_single_rank(const SsdCase& a, int chunk,
                                        kdnn::KernelForm form = kdnn::KernelForm::automatic,
                                        const Around& around = {}) {
  const int R = comm_size(), rank = comm_rank();
  const auto& s = a.s;
  const Result whole = run<double>(a, 0, s.L, chunk, MPI_COMM_NULL, form, around);
  const SsdCase steps = on_step_sizes(a, around);
  for (const auto& named : test_layouts(R, s.L, chunk > 1 ? chunk - 1 : 1)) {
    const auto& segments = named.layout.segments(rank);
    SCOPED_TRACE("Q=" + std::to_string(chunk) + " L=" + std::to_string(s.L) +
                 " B=" + std::to_string(s.B) + " " + named.name + " rank " + std::to_string(rank));
    const Result part = run_segments<double>(a, segments, chunk, MPI_COMM_WORLD, &named.layout,
                                             rank == final_rank(named.layout), form, around);
    const auto mine = [&](const Vec& v, int E) { return local_steps(v, s.B, s.L, E, segments); };
    const double tol = 1e-12;
    const int HP = s.H * s.P, GN = s.G * s.N;
    EXPECT_ALLCLOSE(part.y, mine(whole.y, HP), tol, tol);
    EXPECT_ALLCLOSE(part.dx, mine(whole.dx, HP), tol, tol);
    EXPECT_ALLCLOSE(part.ddt, mine(whole.ddt, s.H), tol, tol);
    EXPECT_ALLCLOSE(part.dB, mine(whole.dB, GN), tol, tol);
    EXPECT_ALLCLOSE(part.dC, mine(whole.dC, GN), tol, tol);
    EXPECT_ALLCLOSE(part.dA, whole.dA, tol, tol);
    EXPECT_ALLCLOSE(part.dD, whole.dD, tol, tol);
    EXPECT_ALLCLOSE(part.ddt_bias, whole.ddt_bias, tol, tol);
    if (!around.z.empty()) {
      EXPECT_ALLCLOSE(part.dz, mine(whole.dz, HP), tol, tol);
    }
    if (rank == 0) {
      EXPECT_ALLCLOSE(part.dinit, whole.dinit, tol, tol);
    }
    EXPECT_ALLCLOSE(part.final_state, state_at(steps, int(segments.back().end)), tol, tol);
    // One summary per segment, B·H·(1 + P·N) values, to each other rank.
    const std::int64_t bh = std::int64_t(s.B) * s.H, pn = std::int64_t(s.P) * s.N;
    const std::int64_t summaries =
        std::int64_t(segments.size()) + (rank == 0 && !a.init.empty() ? 1 : 0);
    EXPECT_EQ(part.forward.bytes_sent, summaries * (R - 1) * bh * (1 + pn) * 8);
  }
}

TEST(CpSsd, EqualsSingleRankOnEveryLayout) {
  // B = 2: a rank's segments run on copies of their rows; B = 1 on views.
  expect_layout_equal_to_single_rank(make_problem({2, 29, 4, 5, 2, 3}, true, true, true), 4);
  expect_layout_equal_to_single_rank(make_problem({1, 37, 2, 4, 1, 4}, false, false, true), 8);
  expect_layout_equal_to_single_rank(make_problem({1, 3, 2, 3, 1, 2}, true, true, true), 4);
  const SsdCase a = make_problem({2, 29, 4, 5, 2, 3}, true, true, true);
  expect_layout_equal_to_single_rank(a, 4, kdnn::KernelForm::automatic, step_sizes_and_gate(a));
}

// Packed sequences on every layout: a segment whose first step starts a
// sequence drops the state entering it, wherever the step before it is.
TEST(CpSsd, PackedSequencesEqualSingleRankOnEveryLayout) {
  SsdCase a = make_problem({2, 29, 4, 5, 2, 3}, true, true, true);
  a.seq = packed_ids(a.s.B, a.s.L, {{3, 5, 2, 5, 5, 1, 1, 7}, {1, 14, 1, 6, 7}});
  expect_layout_equal_to_single_rank(a, 4);
}

// The GPU forms (P = N = 64, ssm/impl/ssd_gpu_chunks.hpp) under a GPU launch
// on every rank and on one: the backward's da_diag kernel runs before the
// states are exchanged, its gradient kernels after.
TEST(CpSsd, GpuFormsEqualSingleRankForEverySplit) {
  expect_equal_to_single_rank(make_problem({1, 150, 2, 64, 1, 64}, true, true, true), 64,
                              kdnn::KernelForm::gpu);
}

// Packed sequences across ranks: where a rank's first step starts a
// sequence, the state entering it is dropped and it passes none of it on
// (its Λ and dS are 0); starts inside a rank reset its chunks as on one
// rank. Every split puts starts on some rank's first step (lengths 3, 8,
// 10, 15, 20, 21, 22 and 1, 15, 16, 22), and every step its own sequence
// is the extreme.
TEST(CpSsd, PackedSequencesEqualSingleRankForEverySplit) {
  SsdCase a = make_problem({3, 29, 4, 5, 2, 3}, true, true, true);
  a.seq = packed_ids(3, 29, {{3, 5, 2, 5, 5, 1, 1, 7}, {1}, {1, 14, 1, 6, 7}});
  expect_equal_to_single_rank(a, 4);
  SsdCase b = make_problem({2, 37, 2, 4, 1, 4}, false, false, true);
  b.seq = packed_ids(2, 37, {{2, 9, 26}, {37}});
  expect_equal_to_single_rank(b, 8);
  expect_equal_to_single_rank(a, 4, kdnn::KernelForm::automatic, step_sizes_and_gate(a));
}

TEST(CpSsd, PackedSequencesInTheGpuFormsEqualSingleRank) {
  SsdCase a = make_problem({1, 150, 2, 64, 1, 64}, true, true, true);
  a.seq = packed_ids(1, 150, {{30, 45, 1, 38, 36}});
  expect_equal_to_single_rank(a, 64, kdnn::KernelForm::gpu);
}

TEST(CpSsd, BytesSentDoNotDependOnTheLength) {
  const int R = comm_size(), rank = comm_rank();
  std::int64_t sent[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const int per_rank = k == 0 ? 16 : 160;
    const SsdCase a = make_problem({2, per_rank * R, 2, 8, 1, 8}, false, false, false);
    sent[k] = run<float>(a, per_rank * rank, per_rank, 16, MPI_COMM_WORLD).forward.bytes_sent;
  }
  EXPECT_EQ(sent[0], sent[1]);
  EXPECT_EQ(sent[0], std::int64_t(R - 1) * 2 * 2 * (1 + 64) * 4);
}

TEST(CpSsd, MismatchOnOneRankGivesEveryRankTheSameError) {
  const int R = comm_size(), rank = comm_rank();
  const int odd = R - 1;
  const int B = 1, n = 6, H = 4, N = 2;
  const int P = rank == odd && R > 1 ? 4 : 3;
  DeviceView<double****> x("x", B, n, H, P), y("y", B, n, H, P);
  DeviceView<double***> dt("dt", B, n, H);
  DeviceView<double*> A = to_device<double*>({-1, -1, -1, -1}, H);
  DeviceView<double****> Bm("B", B, n, 2, N), Cm("C", B, n, 2, N);
  ssm::SsdForward<double, Space> f;
  f.x = x, f.dt = dt, f.A = A, f.B = Bm, f.C = Cm, f.y = y;
  const auto call = [&](const ssm::SsdForward<double, Space>& args,
                        ssm::SsdOptions o = ssm::SsdOptions()) {
    return error_of([&] { cp::ssd_forward(Space(), MPI_COMM_WORLD, args, o); });
  };
  if (R > 1) {
    EXPECT_EQ(call(f), "cp::ssd_forward: P=4 on rank " + std::to_string(odd) +
                           ", expected 3 (as on rank 0; every rank must agree)");
  }
  DeviceView<double****> x3("x", B, n, H, 3), y3("y", B, n, H, 3);
  f.x = x3, f.y = y3;
  // A local mistake on one rank: G = 3 does not divide H = 4.
  auto bad = f;
  DeviceView<double****> b3("b3", B, n, 3, N);
  if (rank == odd) bad.B = bad.C = b3;
  EXPECT_EQ(call(bad),
            "cp::ssd_forward: B has extent(2)=3, expected a number of groups G >= 1 "
            "that divides H=4 (on rank " +
                std::to_string(odd) + " of " + std::to_string(R) + ")");
  // A positive entry of A, refused with check_parameters.
  auto positive = f;
  if (rank == odd) positive.A = to_device<double*>({-1, 0.5, -1, -1}, H);
  EXPECT_EQ(call(positive, ssm::SsdOptions{4, true}),
            "cp::ssd_forward: A[1]=0.5, expected a finite A <= 0 (check_parameters) (on rank " +
                std::to_string(odd) + " of " + std::to_string(R) + ")");
  if (R > 1) {
    auto late = f;
    DeviceView<double****> init("init", B, H, 3, N);
    if (rank == odd) late.initial_state = init;
    EXPECT_EQ(call(late), "cp::ssd_forward: initial_state given on rank " + std::to_string(odd) +
                              ", expected it on rank 0 only (it belongs to the start of the "
                              "sequence)");
  }
  // seq_idx is given on every rank or on none.
  if (R > 1) {
    auto packed = f;
    DeviceView<int**> seq("seq_idx", B, n);
    if (rank == odd) packed.seq_idx = seq;
    EXPECT_EQ(call(packed), "cp::ssd_forward: seq_idx given=1 on rank " + std::to_string(odd) +
                                ", expected 0 (as on rank 0; every rank must agree)");
  }
  // Under a layout: x must hold the layout's steps on this rank, the layout
  // must be every rank's and the communicator's, and cu_seqlens needs a
  // rank of one segment.
  const auto with_layout = [&](const cp::SequenceLayout& layout,
                               const ssm::SsdForward<double, Space>& args) {
    return error_of([&] { cp::ssd_forward(Space(), MPI_COMM_WORLD, layout, args); });
  };
  const auto even = cp::SequenceLayout::contiguous(std::vector<std::int64_t>(R, n));
  EXPECT_EQ(with_layout(even, f), "");
  const auto balanced = cp::SequenceLayout::load_balanced(std::int64_t(n) * R, R);
  EXPECT_EQ(with_layout(balanced, f), "");
  std::vector<std::int64_t> longer(R, n);
  longer[std::size_t(odd)] = n + 1;
  EXPECT_EQ(with_layout(cp::SequenceLayout::contiguous(longer), f),
            "cp::ssd_forward: x has extent(1)=" + std::to_string(n) + ", expected " +
                std::to_string(n + 1) + " (the layout's steps on this rank) (on rank " +
                std::to_string(odd) + " of " + std::to_string(R) + ")");
  if (R > 1) {
    EXPECT_EQ(with_layout(rank == odd ? balanced : even, f),
              "cp::ssd_forward: layout on rank " + std::to_string(odd) +
                  " differs from rank 0's, expected the same values on every rank (a parameter "
                  "of the whole sequence)");
  }
  EXPECT_EQ(with_layout(cp::SequenceLayout::load_balanced(n, R + 1), f),
            "cp::ssd_forward: the layout has " + std::to_string(R + 1) + " ranks, expected " +
                std::to_string(R) + " (the communicator's) (on rank 0 of " + std::to_string(R) +
                ")");
  auto offsets = f;
  DeviceView<int*> cu2 = to_device<int*>({0, n}, 2);
  DeviceView<double****> one_state("states", 1, H, 3, N);
  DeviceView<int**> one_sequence("seq_idx", B, n);
  offsets.cu_seqlens = cu2, offsets.sequence_states = one_state, offsets.seq_idx = one_sequence;
  EXPECT_EQ(with_layout(balanced, offsets),
            "cp::ssd_forward: cu_seqlens given on a rank of 2 segments, expected one segment "
            "(the offsets of one run of the rank's steps) (on rank 0 of " +
                std::to_string(R) + ")");
  // Per-sequence states on one rank only: that rank's mistake (no
  // sequence_states), every rank's error.
  auto varlen = f;
  DeviceView<int*> cu("cu_seqlens", 2);
  if (rank == odd) varlen.cu_seqlens = cu;
  EXPECT_EQ(call(varlen),
            "cp::ssd_forward: cu_seqlens is given without sequence_states, expected both (the "
            "output [S, H, P, N]) (on rank " +
                std::to_string(odd) + " of " + std::to_string(R) + ")");
  if (R > 1) {
    // Valid on each rank alone, different between ranks: the parameters'
    // values, D's form and the step sizes' limits.
    auto other_a = f;
    if (rank == odd) other_a.A = to_device<double*>({-1, -1, -2, -1}, H);
    EXPECT_EQ(call(other_a), "cp::ssd_forward: A on rank " + std::to_string(odd) +
                                 " differs from rank 0's, expected the same values on every rank "
                                 "(a parameter of the whole sequence)");
    auto per_channel = f;
    DeviceView<double*> d_head("D", H), d_channel("D", H * 3);
    per_channel.D = rank == odd ? d_channel : d_head;
    EXPECT_EQ(call(per_channel), "cp::ssd_forward: D's length (H, or H·P per channel)=12 on rank " +
                                     std::to_string(odd) +
                                     ", expected 4 (as on rank 0; every rank must agree)");
    auto bias = f;
    bias.dt_bias = rank == odd ? to_device<double*>({0, 0, 0, 1}, H) : DeviceView<double*>("b", H);
    EXPECT_EQ(call(bias), "cp::ssd_forward: dt_bias on rank " + std::to_string(odd) +
                              " differs from rank 0's, expected the same values on every rank "
                              "(a parameter of the whole sequence)");
    ssm::SsdOptions limited{4};
    limited.dt_max = rank == odd ? 2.0 : limited.dt_max;
    EXPECT_EQ(call(f, limited), "cp::ssd_forward: opts.dt_max=2 on rank " + std::to_string(odd) +
                                    ", expected inf (as on rank 0; every rank must agree)");
  }
  EXPECT_EQ(call(f), "");
}

// The communicator is checked before it is used: MPI_COMM_NULL (what a freed
// communicator becomes) and an intercommunicator are errors naming comm.
TEST(CpSsd, ANullOrInterCommunicatorIsAnErrorNamingComm) {
  DeviceView<double****> x("x", 1, 2, 2, 3), y("y", 1, 2, 2, 3);
  DeviceView<double***> dt("dt", 1, 2, 2);
  DeviceView<double*> A = to_device<double*>({-1, -1}, 2);
  DeviceView<double****> Bm("B", 1, 2, 1, 2), Cm("C", 1, 2, 1, 2);
  ssm::SsdForward<double, Space> f;
  f.x = x, f.dt = dt, f.A = A, f.B = Bm, f.C = Cm, f.y = y;
  EXPECT_EQ(error_of([&] { cp::ssd_forward(Space(), MPI_COMM_NULL, f); }),
            "cp::ssd_forward: comm is MPI_COMM_NULL, expected a live communicator");
  MPI_Comm freed = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &freed);
  MPI_Comm_free(&freed);
  EXPECT_EQ(error_of([&] { cp::ssd_forward(Space(), freed, f); }),
            "cp::ssd_forward: comm is MPI_COMM_NULL, expected a live communicator");
  const int R = comm_size(), rank = comm_rank();
  if (R > 1) {
    MPI_Comm half = MPI_COMM_NULL, inter = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, 1 - rank % 2, 7, &inter);
    EXPECT_EQ(error_of([&] { cp::ssd_forward(Space(), inter, f); }),
              "cp::ssd_forward: comm is an intercommunicator, expected an intracommunicator");
    MPI_Comm_free(&inter);
    MPI_Comm_free(&half);
  }
}

// Each rank's per-sequence states, from its own offsets (0, the starts
// inside its steps, its step count), are the float64 recurrence's states
// after each of those segments: the final state of every sequence that ends
// on the rank, wherever it started (the state passed from the ranks before
// included), 0 for an empty one; for every split, with an initial state.
TEST(CpSsd, SequenceStatesOfEachRankEqualTheRecurrence) {
  const int R = comm_size(), rank = comm_rank();
  const int chunk = 8;
  SsdCase a = make_problem({1, 45, 2, 3, 1, 4}, true, true, false);
  std::vector<int> starts;  // the sequences' global offsets (an empty one repeats)
  int id = 5;
  for (const int n : {1, 7, 0, 8, 9, 20}) {
    starts.push_back(int(a.seq.size()));
    for (int i = 0; i < n; ++i) a.seq.push_back(id);
    ++id;
  }
  const std::size_t state = std::size_t(a.s.H) * a.s.P * a.s.N;
  for (const auto& lengths : kdnn_test::rank_splits(R, a.s.L, chunk - 1, chunk)) {
    const int first = std::accumulate(lengths.begin(), lengths.begin() + rank, 0);
    const int n = lengths[rank];
    Vec offsets{0};
    for (const int c : starts) {
      if (c > first && c < first + n) offsets.push_back(c - first);
    }
    offsets.push_back(n);
    std::string text;
    for (int l : lengths) text += std::to_string(l) + " ";
    SCOPED_TRACE("split " + text + "rank " + std::to_string(rank));
    const Result r =
        run<double>(a, first, n, chunk, MPI_COMM_WORLD, kdnn::KernelForm::automatic, {}, offsets);
    ASSERT_EQ(r.sequence_states.size(), (offsets.size() - 1) * state);
    for (std::size_t q = 0; q + 1 < offsets.size(); ++q) {
      const int begin = int(offsets[q]), end = int(offsets[q + 1]);
      const Vec want = end > begin ? state_at(a, first + end) : Vec(state, 0.0);
      const Vec got(r.sequence_states.begin() + q * state,
                    r.sequence_states.begin() + (q + 1) * state);
      EXPECT_ALLCLOSE(got, want, 1e-12, 1e-12) << "segment " << q;
    }
  }
}

}  // namespace
