// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// `kdnn ssd` as a subprocess under mpiexec: outputs and gradients equal the
// float64 recurrence of ssd_reference.hpp for an uneven split with an empty
// rank, forward only writes only the forward's files, bad input fails on
// every rank with one error line and leaves --out untouched.
#ifdef KDNN_MPIEXEC
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "allclose.hpp"
#include "cli_fixture.hpp"
#include "random.hpp"
#include "ssd_reference.hpp"

namespace {

using kdnn::io::DType;
using kdnn_test::CliTest;
using kdnn_test::mpiexec;
using kdnn_test::Strings;
namespace ref = kdnn_test::ssm_ref;

class CliSsd : public CliTest {
 protected:
  static constexpr std::size_t L = 19, H = 4, P = 3, G = 2, N = 2;
  std::size_t B = 2;
  ref::SsdCase c_;

  void write_problem(DType dtype, bool backward) {
    c_.s = {int(B), int(L), int(H), int(P), int(G), int(N)};
    c_.x = kdnn_test::normal(B * L * H * P, 1);
    c_.dt = kdnn_test::uniform(B * L * H, 0.05, 0.6, 2);
    c_.A = kdnn_test::uniform(H, -1.5, -0.2, 3);
    c_.Bm = kdnn_test::normal(B * L * G * N, 4);
    c_.Cm = kdnn_test::normal(B * L * G * N, 5);
    c_.D = kdnn_test::uniform(H, -1, 1, 6);
    c_.init = kdnn_test::normal(B * H * P * N, 7);
    c_.dy = backward ? kdnn_test::normal(B * L * H * P, 8) : ref::Vec(B * L * H * P, 0.0);
    c_.dfinal = backward ? kdnn_test::normal(B * H * P * N, 9) : ref::Vec();
    if (dtype == DType::f32) {  // the reference sees what the tool reads
      for (auto* v : {&c_.x, &c_.dt, &c_.A, &c_.Bm, &c_.Cm, &c_.D, &c_.init, &c_.dy, &c_.dfinal}) {
        for (double& e : *v) e = double(float(e));
      }
    }
    write("x.npy", dtype, {B, L, H, P}, c_.x);
    write("dt.npy", dtype, {B, L, H}, c_.dt);
    write("a.npy", dtype, {H}, c_.A);
    write("b.npy", dtype, {B, L, G, N}, c_.Bm);
    write("c.npy", dtype, {B, L, G, N}, c_.Cm);
    write("d.npy", dtype, {H}, c_.D);
    write("init.npy", dtype, {B, H, P, N}, c_.init);
    if (backward) {
      write("dy.npy", dtype, {B, L, H, P}, c_.dy);
      write("dfinal.npy", dtype, {B, H, P, N}, c_.dfinal);
    }
  }
  /// Every float64 output of a run with the backward equals the recurrence's.
  void expect_float64_outputs_equal_the_recurrence() const {
    const auto f = ref::ssd_forward(c_);
    const auto g = ref::ssd_backward(c_);
    const double tol = 1e-11;
    EXPECT_ALLCLOSE(read(out_ / "y.npy", DType::f64, {B, L, H, P}), f.y, tol, tol);
    EXPECT_ALLCLOSE(read(out_ / "final.npy", DType::f64, {B, H, P, N}), f.final_state, tol, tol);
    EXPECT_ALLCLOSE(read(out_ / "dx.npy", DType::f64, {B, L, H, P}), g.dx, tol, tol);
    EXPECT_ALLCLOSE(read(out_ / "ddt.npy", DType::f64, {B, L, H}), g.ddt, tol, tol);
    EXPECT_ALLCLOSE(read(out_ / "da.npy", DType::f64, {H}), g.dA, tol, tol);
    EXPECT_ALLCLOSE(read(out_ / "db.npy", DType::f64, {B, L, G, N}), g.dB, tol, tol);
    EXPECT_ALLCLOSE(read(out_ / "dc.npy", DType::f64, {B, L, G, N}), g.dC, tol, tol);
    EXPECT_ALLCLOSE(read(out_ / "dd.npy", DType::f64, {H}), g.dD, tol, tol);
    EXPECT_ALLCLOSE(read(out_ / "dinit.npy", DType::f64, {B, H, P, N}), g.dinit, tol, tol);
  }
  Strings args(Strings extra) const {
    Strings a = {"ssd", "--in", in_.string(), "--out", out_.string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

TEST_F(CliSsd, UnevenSplitEqualsTheRecurrence) {
  write_problem(DType::f64, true);
  const auto r = run(args({"--split", "5,0,14", "--chunk", "4"}), mpiexec(3));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  // Each summary is B·H·(1 + P·N) = 56 values forward, 104 backward, sent
  // to 2 ranks; rank 0 sends two, its segment's and the initial state's.
  EXPECT_EQ(r.out,
            "ssd: B=2 L=19 H=4 P=3 G=2 N=2 Q=4 float64, 3 rank(s), state bytes sent by rank 0 "
            "1792 (forward), 3328 (backward)\n");
  expect_float64_outputs_equal_the_recurrence();
}

// seq_idx.npy (packed sequences): row 0's second sequence starts on rank
// 2's first step (split 5,0,14), row 1's inside a chunk of rank 0; the
// state is reset there, as in the recurrence.
TEST_F(CliSsd, PackedSequencesEqualTheRecurrence) {
  write_problem(DType::f64, true);
  std::vector<std::int64_t> ids(B * L, 0);
  for (std::size_t t = 0; t < L; ++t) {
    ids[t] = t < 5 ? 4 : t < 12 ? 5 : 6;  // starts at 5 and 12
    ids[L + t] = t < 3 ? 0 : 1;           // a start at 3
  }
  c_.seq = write_ids("seq_idx.npy", {B, L}, ids);
  const auto r = run(args({"--split", "5,0,14", "--chunk", "4"}), mpiexec(3));
  ASSERT_EQ(r.status, 0) << r.err;
  expect_float64_outputs_equal_the_recurrence();
}

// cu_seqlens.npy (B = 1): each sequence's final state in varlen_states.npy,
// the state of the float64 recurrence after its last step, for a split
// (4,7,8) where sequence 2 ends on rank 0's edge, sequence 3 starts on rank
// 1's and sequence 4 runs from rank 1 into rank 2; sequence 1 is empty (a
// zero state). The ids come from the offsets, or from a seq_idx.npy that
// agrees with them: the same files either way, gradients included.
TEST_F(CliSsd, PackedSequenceStatesEqualTheRecurrence) {
  B = 1;
  write_problem(DType::f64, true);
  const std::vector<std::int64_t> cu = {0, 3, 3, 4, 10, 19};
  write_ids("cu_seqlens.npy", {cu.size()}, cu);
  c_.seq.assign(L, 0.0);
  for (std::size_t s = 0; s + 1 < cu.size(); ++s) {
    for (auto t = cu[s]; t < cu[s + 1]; ++t) c_.seq[std::size_t(t)] = double(s);
  }
  const auto expected_states = [&] {
    ref::Vec states;
    for (std::size_t s = 0; s + 1 < cu.size(); ++s) {
      for (std::size_t h = 0; h < H; ++h) {
        const auto hs = ref::ssd_states(c_, 0, int(h));
        const auto& last = hs[std::size_t(cu[s + 1])];  // h_t after step cu[s + 1] - 1
        for (const double e : last) states.push_back(cu[s] == cu[s + 1] ? 0.0 : e);
      }
    }
    return states;
  }();
  for (const bool with_ids : {false, true}) {
    SCOPED_TRACE(with_ids ? "seq_idx.npy given" : "ids from cu_seqlens.npy");
    if (with_ids) {
      std::vector<std::int64_t> ids(L);
      for (std::size_t t = 0; t < L; ++t) ids[t] = 7 - 2 * std::int64_t(c_.seq[t]);  // any ids
      write_ids("seq_idx.npy", {B, L}, ids);
    }
    const auto r = run(args({"--split", "4,7,8", "--chunk", "4"}), mpiexec(3));
    ASSERT_EQ(r.status, 0) << r.err;
    expect_float64_outputs_equal_the_recurrence();
    EXPECT_ALLCLOSE(read(out_ / "varlen_states.npy", DType::f64, {cu.size() - 1, H, P, N}),
                    expected_states, 1e-11, 1e-11);
    for (const auto& name : files(out_)) std::filesystem::remove(out_ / name);
  }
}

// Offsets that are not those of L steps, or that seq_idx.npy contradicts,
// or a batch of more than one entry: an error naming the file, on every
// rank, and no output.
TEST_F(CliSsd, BadSequenceOffsetsFailOnEveryRank) {
  write_problem(DType::f64, false);
  write_ids("cu_seqlens.npy", {3}, {0, 5, 19});
  expect_mpi_failure(args({}), 1, "cu_seqlens.npy is given with B=2 (x.npy's axis 0), expected B=1",
                     2);
  B = 1;
  write_problem(DType::f64, false);
  write_ids("cu_seqlens.npy", {1, 3}, {0, 5, 19});
  expect_mpi_failure(args({}), 1, "cu_seqlens.npy has shape (1, 3), expected [S + 1]", 2);
  write_ids("cu_seqlens.npy", {3}, {0, 5, 18});
  expect_mpi_failure(args({}), 1, "ssd: cu_seqlens.npy[2]=18, expected 19 (L, x.npy's axis 1)", 2);
  write_ids("cu_seqlens.npy", {4}, {0, 6, 5, 19});
  expect_mpi_failure(args({}), 1,
                     "ssd: cu_seqlens.npy[2]=5 < cu_seqlens.npy[1]=6, expected offsets that "
                     "never decrease",
                     2);
  write_ids("cu_seqlens.npy", {3}, {0, 5, 19});
  std::vector<std::int64_t> ids(L, 0);
  for (std::size_t t = 6; t < L; ++t) ids[t] = 1;  // starts at 6, not 5
  write_ids("seq_idx.npy", {B, L}, ids);
  expect_mpi_failure(args({}), 1,
                     "seq_idx.npy[0, 4]=0, seq_idx.npy[0, 5]=0, expected a new id: "
                     "cu_seqlens.npy starts a sequence at step 5",
                     2);
}

TEST_F(CliSsd, ForwardOnlyWritesTheForwardsFiles) {
  write_problem(DType::f32, false);
  const auto r = run(args({}), mpiexec(1));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(files(out_), (std::set<std::string>{"y.npy", "final.npy"}));
  const auto f = ref::ssd_forward(c_);
  EXPECT_ALLCLOSE(read(out_ / "y.npy", DType::f32, {B, L, H, P}), f.y, 1e-4, 1e-4);
  EXPECT_ALLCLOSE(read(out_ / "final.npy", DType::f32, {B, H, P, N}), f.final_state, 1e-4, 1e-4);
}

// A context-parallel subcommand initialises MPI without a launcher too (one
// process).
TEST_F(CliSsd, RunsWithoutMpiexec) {
  write_problem(DType::f32, false);
  const auto r = run(args({}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out.rfind("ssd: B=2 L=19 H=4 P=3 G=2 N=2 Q=64 float32, 1 rank(s)", 0), 0u) << r.out;
  EXPECT_EQ(files(out_), (std::set<std::string>{"y.npy", "final.npy"}));
}

TEST_F(CliSsd, PeakMemoryIsInputsOutputsAndTheChunkStates) {
  // One process computes in the buffers it read and into the output files'
  // buffers: its peak is the files, the backward's chunk states and their
  // gradients (2·B·H·(ceil(L/Q) + 1)·P·N values), the per-step decay
  // gradients (B·H·L doubles) and the libraries (about 22 MiB). Arrays of
  // 64 MiB: a copy of any of the large ones would exceed the 48 MiB margin.
  const std::size_t b = 1, l = 16384, h = 8, p = 64, g = 8, n = 16, q = 64;
  const std::size_t x_values = b * l * h * p, bc_values = b * l * g * n;
  write("x.npy", DType::f64, {b, l, h, p}, kdnn_test::normal(x_values, 1));
  write("dt.npy", DType::f64, {b, l, h}, kdnn_test::uniform(b * l * h, 0.01, 0.1, 2));
  write("a.npy", DType::f64, {h}, kdnn_test::uniform(h, -2, -0.5, 3));
  write("b.npy", DType::f64, {b, l, g, n}, kdnn_test::normal(bc_values, 4));
  write("c.npy", DType::f64, {b, l, g, n}, kdnn_test::normal(bc_values, 5));
  write("dy.npy", DType::f64, {b, l, h, p}, kdnn_test::normal(x_values, 6));
  const auto r = run(args({"--chunk", std::to_string(q)}));
  ASSERT_EQ(r.status, 0) << r.err;
  // Inputs and outputs: x, dy, y, dx; b, c, db, dc; dt, ddt.
  const double files = 8.0 * (4 * x_values + 4 * bc_values + 2 * b * l * h);
  const double workspace = 8.0 * (2 * b * h * ((l + q - 1) / q + 1) * p * n + b * h * l);
  const double peak_mib = kdnn_test::peak_child_mib();
  EXPECT_LT(peak_mib, (files + workspace) / (1 << 20) + 48) << "peak RSS " << peak_mib << " MiB";
}

TEST_F(CliSsd, BadInputFailsOnEveryRankAndWritesNothing) {
  write_problem(DType::f64, true);
  expect_mpi_failure(args({"--chunk", "0"}), 2,
                     "--chunk: expected an integer >= 1 (at most 2147483647), got '0'", 2);
  expect_mpi_failure(args({"--split", "2,0,10"}), 1, "--split: counts sum to 12, expected L=19", 3);
  write("a.npy", DType::f64, {H}, {-1, 0.5, -1, -1});
  expect_mpi_failure(args({}), 1,
                     "cp::ssd_forward: A[1]=0.5, expected a finite A <= 0 (check_parameters)", 2);
  write("a.npy", DType::f64, {H}, c_.A);
  write("b.npy", DType::f64, {B, L, 3, N}, ref::Vec(B * L * 3 * N, 0.0));
  write("c.npy", DType::f64, {B, L, 3, N}, ref::Vec(B * L * 3 * N, 0.0));
  expect_mpi_failure(args({}), 1, "expected a number of groups G >= 1 that divides H=4", 2);
  write("b.npy", DType::f64, {B, L, G, N}, c_.Bm);
  write("c.npy", DType::f64, {B, L, G, N}, c_.Cm);
  write("dt.npy", DType::f64, {B, L + 1, H}, ref::Vec(B * (L + 1) * H, 0.0));
  expect_mpi_failure(args({}), 1, "dt.npy: shape (2, 20, 4), expected L 19 (from x.npy) at axis 1",
                     2);
  write("dt.npy", DType::f32, {B, L, H}, c_.dt);
  expect_mpi_failure(args({}), 1, "dt.npy has dtype float32, expected float64 (same as x.npy)", 2);
  // dt < 0 would grow the state instead of decaying it: refused, with the
  // first such step (as NaN and ±inf are).
  auto dt = c_.dt;
  dt[(1 * L + 3) * H + 2] = -0.5;
  dt[(1 * L + 9) * H + 0] = -1000;
  write("dt.npy", DType::f64, {B, L, H}, dt);
  expect_mpi_failure(args({}), 1, "dt.npy: -0.5 at [1, 3, 2] (expected dt >= 0)", 3);
}

// Counts whose int64 sum wraps around to L (cli_fixture.hpp).
TEST_F(CliSsd, SplitCountsAboveLAreRejectedOnEveryRank) {
  write_problem(DType::f64, false);
  expect_split_counts_above_length_rejected([&](const Strings& extra) { return args(extra); }, 19);
}

// A huge batch of empty sequences (headers only). With P = 0 every output is
// empty, but the state passing still holds B·H values per rank a few times
// (8 GiB each): a quick empty result where that fits in memory, a quick error
// naming it where it does not. A 9 PB final state, a state passing of
// B·H = 2^41 values, or a final state whose size in bytes does not fit 64
// bits, is an error before anything is allocated.
TEST_F(CliSsd, HugeBatchOfEmptySequences) {
  const std::size_t huge = 2147483647;  // 2^31 - 1
  const auto write_sizes = [&](std::size_t h, std::size_t p, std::size_t n) {
    write("x.npy", DType::f32, {huge, 0, h, p}, {});
    write("dt.npy", DType::f32, {huge, 0, h}, {});
    write("a.npy", DType::f32, {h}, ref::Vec(h, -0.5));
    write("b.npy", DType::f32, {huge, 0, 1, n}, {});
    write("c.npy", DType::f32, {huge, 0, 1, n}, {});
  };
  write_sizes(1, 0, 1);
  for (int ranks : {1, 2}) {
    const auto r = run(args({}), mpiexec(ranks));
    if (r.status == 0) {
      EXPECT_EQ(r.err, "");
      read(out_ / "y.npy", DType::f32, {huge, 0, 1, 0});
      read(out_ / "final.npy", DType::f32, {huge, 1, 0, 1});
      for (const auto& name : files(out_)) std::filesystem::remove(out_ / name);
    } else {
      expect_mpi_failure(args({}), 1,
                         "the state passing's buffers: shape (" + std::to_string(ranks + 2) +
                             ", 2147483647, 1) float32 is",
                         ranks);
    }
  }
  write_sizes(1024, 0, 1);
  expect_mpi_failure(args({}), 1,
                     "the state passing's buffers: shape (4, 2199023254528, 1) float32 is "
                     "35184372072448 bytes, more than",
                     2);
  write_sizes(1, 1024, 1024);
  expect_mpi_failure(
      args({}), 1,
      "final.npy: shape (2147483647, 1, 1024, 1024) float32 is 9007199250546688 bytes, "
      "more than",
      2);
  write_sizes(1, huge, huge);
  expect_mpi_failure(
      args({}), 1,
      "final.npy: shape (2147483647, 1, 2147483647, 2147483647) float32 is more than "
      "2^63 bytes",
      2);
}
}  // namespace
#endif
