// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// `kdnn cp-conv` as a subprocess under mpiexec: outputs and gradients equal
// the double loops of conv_reference.hpp for an uneven split with an empty
// rank, forward only writes only the forward's files, bad input fails on
// every rank with one error line and leaves --out untouched.
#ifdef KDNN_MPIEXEC
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "allclose.hpp"
#include "cli_fixture.hpp"
#include "conv_reference.hpp"
#include "random.hpp"

namespace {

using kdnn::io::DType;
using kdnn_test::CliTest;
using kdnn_test::mpiexec;
using kdnn_test::Strings;
namespace ref = kdnn_test::ssm_ref;
namespace fs = std::filesystem;

class CliCpConv : public CliTest {
 protected:
  static constexpr std::size_t B = 2, L = 13, C = 4, K = 4, H = 3;
  ref::ConvCase conv_;
  ref::Vec dt_, dt_bias_, ddt_out_;

  void write_problem(DType dtype, bool backward) {
    conv_.s = {int(B), int(L), int(C), int(K)};
    conv_.x = kdnn_test::normal(B * L * C, 1);
    conv_.w = kdnn_test::uniform(C * K, -0.6, 0.6, 2);
    conv_.bias = kdnn_test::uniform(C, -0.5, 0.5, 3);
    conv_.init = kdnn_test::normal(B * (K - 1) * C, 4);
    conv_.dy = backward ? kdnn_test::normal(B * L * C, 5) : ref::Vec(B * L * C, 0.0);
    dt_ = kdnn_test::uniform(B * L * H, -4, 4, 6);
    dt_bias_ = kdnn_test::uniform(H, -1, 1, 7);
    ddt_out_ = kdnn_test::normal(B * L * H, 8);
    if (dtype == DType::f32) {  // the reference sees what the tool reads
      for (auto* v :
           {&conv_.x, &conv_.w, &conv_.bias, &conv_.init, &conv_.dy, &dt_, &dt_bias_, &ddt_out_}) {
        for (double& e : *v) e = double(float(e));
      }
    }
    write("xbc.npy", dtype, {B, L, C}, conv_.x);
    write("conv_w.npy", dtype, {C, K}, conv_.w);
    write("conv_b.npy", dtype, {C}, conv_.bias);
    write("init.npy", dtype, {B, K - 1, C}, conv_.init);
    write("dt.npy", dtype, {B, L, H}, dt_);
    write("dt_bias.npy", dtype, {H}, dt_bias_);
    if (backward) {
      write("dy.npy", dtype, {B, L, C}, conv_.dy);
      write("ddt_out.npy", dtype, {B, L, H}, ddt_out_);
    }
  }
  Strings args(Strings extra) const {
    Strings a = {"cp-conv", "--in", in_.string(), "--out", out_.string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

TEST_F(CliCpConv, UnevenSplitEqualsTheDoubleLoops) {
  write_problem(DType::f64, true);
  const auto r = run(args({"--split", "2,0,11", "--dt-max", "2.5"}), mpiexec(3));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out.rfind("cp-conv: B=2 L=13 C=4 K=4 H=3 float64, 3 rank(s)", 0), 0u) << r.out;
  const auto f = ref::conv_forward(conv_);
  const auto g = ref::conv_backward(conv_);
  const auto d = ref::dt_softplus(dt_, dt_bias_, ddt_out_, 0, 2.5);
  const double tol = 1e-12;
  EXPECT_ALLCLOSE(read(out_ / "y.npy", DType::f64, {B, L, C}), f.y, tol, tol);
  EXPECT_ALLCLOSE(read(out_ / "final.npy", DType::f64, {B, K - 1, C}), f.final_state, 0, 0);
  EXPECT_ALLCLOSE(read(out_ / "dt_out.npy", DType::f64, {B, L, H}), d.out, tol, tol);
  EXPECT_ALLCLOSE(read(out_ / "dxbc.npy", DType::f64, {B, L, C}), g.dx, tol, tol);
  EXPECT_ALLCLOSE(read(out_ / "dconv_w.npy", DType::f64, {C, K}), g.dw, tol, tol);
  EXPECT_ALLCLOSE(read(out_ / "dconv_b.npy", DType::f64, {C}), g.dbias, tol, tol);
  EXPECT_ALLCLOSE(read(out_ / "dinit.npy", DType::f64, {B, K - 1, C}), g.dinit, tol, tol);
  EXPECT_ALLCLOSE(read(out_ / "ddt.npy", DType::f64, {B, L, H}), d.ddt, tol, tol);
  EXPECT_ALLCLOSE(read(out_ / "ddt_bias.npy", DType::f64, {H}), d.ddt_bias, tol, tol);
}

// seq_idx.npy (packed sequences; int64, as numpy writes Python integers):
// row 0's sequences of 2, 3, 1 and 7 steps start on rank 2's first step and
// inside its halo, row 1's at step 5; equal to the double loops that count
// only the steps of a step's own sequence.
TEST_F(CliCpConv, PackedSequencesEqualTheDoubleLoops) {
  write_problem(DType::f64, true);
  conv_.dfinal = kdnn_test::normal(B * (K - 1) * C, 9);
  write("dfinal.npy", DType::f64, {B, K - 1, C}, conv_.dfinal);
  conv_.seq = write_ids("seq_idx.npy", {B, L}, {0, 0, 1, 1, 1, 2, 3, 3, 3, 3, 3, 3, 3,
                                                7, 7, 7, 7, 7, 9, 9, 9, 9, 9, 9, 9, 9});
  const auto r = run(args({"--split", "2,0,11"}), mpiexec(3));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto f = ref::conv_forward(conv_);
  const auto g = ref::conv_backward(conv_);
  const double tol = 1e-12;
  EXPECT_ALLCLOSE(read(out_ / "y.npy", DType::f64, {B, L, C}), f.y, tol, tol);
  EXPECT_ALLCLOSE(read(out_ / "final.npy", DType::f64, {B, K - 1, C}), f.final_state, 0, 0);
  EXPECT_ALLCLOSE(read(out_ / "dxbc.npy", DType::f64, {B, L, C}), g.dx, tol, tol);
  EXPECT_ALLCLOSE(read(out_ / "dconv_w.npy", DType::f64, {C, K}), g.dw, tol, tol);
  EXPECT_ALLCLOSE(read(out_ / "dconv_b.npy", DType::f64, {C}), g.dbias, tol, tol);
  EXPECT_ALLCLOSE(read(out_ / "dinit.npy", DType::f64, {B, K - 1, C}), g.dinit, tol, tol);
}

TEST_F(CliCpConv, ForwardOnlyWritesTheForwardsFiles) {
  write_problem(DType::f32, false);
  const auto r = run(args({"--no-silu"}), mpiexec(1));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(files(out_), (std::set<std::string>{"y.npy", "dt_out.npy", "final.npy"}));
  conv_.silu = false;
  const auto f = ref::conv_forward(conv_);
  EXPECT_ALLCLOSE(read(out_ / "y.npy", DType::f32, {B, L, C}), f.y, 2e-6, 2e-6);
}

TEST_F(CliCpConv, FinalStateGradientReachesEveryInput) {
  // dfinal.npy, the gradient of final.npy (training with carried states),
  // alone or with dy.npy, at a split whose last rank holds fewer steps than
  // K − 1 (the final state reaches back into the previous ranks).
  for (const bool with_dy : {false, true}) {
    SCOPED_TRACE(with_dy);
    fs::remove_all(in_);
    fs::create_directories(in_);
    fs::remove_all(out_);
    fs::create_directories(out_);
    write_problem(DType::f64, with_dy);
    if (!with_dy) conv_.dy.assign(B * L * C, 0.0);
    conv_.dfinal = kdnn_test::normal(B * (K - 1) * C, 9);
    write("dfinal.npy", DType::f64, {B, K - 1, C}, conv_.dfinal);
    const auto r = run(args({"--split", "6,5,2"}), mpiexec(3));
    ASSERT_EQ(r.status, 0) << r.err;
    const auto g = ref::conv_backward(conv_);
    const double tol = 1e-12;
    EXPECT_ALLCLOSE(read(out_ / "dxbc.npy", DType::f64, {B, L, C}), g.dx, tol, tol);
    EXPECT_ALLCLOSE(read(out_ / "dconv_w.npy", DType::f64, {C, K}), g.dw, tol, tol);
    EXPECT_ALLCLOSE(read(out_ / "dconv_b.npy", DType::f64, {C}), g.dbias, tol, tol);
    EXPECT_ALLCLOSE(read(out_ / "dinit.npy", DType::f64, {B, K - 1, C}), g.dinit, tol, tol);
  }
  fs::remove_all(out_);
  fs::create_directories(out_);
  write("dfinal.npy", DType::f64, {B, K, C}, ref::Vec(B * K * C, 0.0));
  expect_mpi_failure(args({}), 1, "dfinal.npy has shape (2, 4, 4), expected (2, 3, 4)", 2);
}

TEST_F(CliCpConv, PeakMemoryIsInputsPlusOutputs) {
  // One process computes in the buffers it read and into the output files'
  // buffers: its peak is the files and the libraries (about 22 MiB). Arrays
  // of 64 MiB: a copy of any of the large ones would exceed the 48 MiB margin.
  const std::size_t b = 2, l = 8192, c = 512, k = 4, h = 8;
  const std::size_t values = b * l * c;
  write("xbc.npy", DType::f64, {b, l, c}, kdnn_test::normal(values, 1));
  write("conv_w.npy", DType::f64, {c, k}, kdnn_test::uniform(c * k, -0.5, 0.5, 2));
  write("dt.npy", DType::f64, {b, l, h}, kdnn_test::normal(b * l * h, 3));
  write("dt_bias.npy", DType::f64, {h}, kdnn_test::normal(h, 4));
  write("dy.npy", DType::f64, {b, l, c}, kdnn_test::normal(values, 5));
  write("ddt_out.npy", DType::f64, {b, l, h}, kdnn_test::normal(b * l * h, 6));
  const auto r = run(args({}));
  ASSERT_EQ(r.status, 0) << r.err;
  // xbc, dy, y, dxbc; dt, ddt_out, dt_out, ddt.
  const double files = 8.0 * (4 * values + 4 * b * l * h);
  const double peak_mib = kdnn_test::peak_child_mib();
  EXPECT_LT(peak_mib, files / (1 << 20) + 48) << "peak RSS " << peak_mib << " MiB";
}

TEST_F(CliCpConv, BadInputFailsOnEveryRankAndWritesNothing) {
  write_problem(DType::f64, true);
  expect_mpi_failure(args({"--split", "2,0,10"}), 1, "--split: counts sum to 12, expected L=13", 3);
  expect_mpi_failure(args({"--split", "2,x,11"}), 2,
                     "--split: expected counts >= 0 (at most 9223372036854775807), got 'x'", 3);
  expect_mpi_failure(args({"--dt-min", "3", "--dt-max", "1"}), 2, "--dt-max 1 is below --dt-min 3",
                     2);
  write("dt.npy", DType::f64, {B, L + 1, H}, ref::Vec(B * (L + 1) * H, 0.0));
  expect_mpi_failure(args({}), 1,
                     "dt.npy: shape (2, 14, 3), expected L 13 (from xbc.npy) at axis 1", 2);
  write("dt.npy", DType::f32, {B, L, H}, dt_);
  expect_mpi_failure(args({}), 1, "dt.npy has dtype float32, expected float64 (same as xbc.npy)",
                     2);
  write("dt.npy", DType::f64, {B, L, H}, dt_);
  write_ids("seq_idx.npy", {B, L - 1}, std::vector<std::int64_t>(B * (L - 1), 0));
  expect_mpi_failure(args({}), 1, "seq_idx.npy has shape (2, 12), expected (2, 13)", 2);
  write("seq_idx.npy", DType::f64, {B, L}, ref::Vec(B * L, 0.0));
  expect_mpi_failure(args({}), 1, "seq_idx.npy: dtype float64, expected int32 or int64", 2);
  write_ids("seq_idx.npy", {B, L}, std::vector<std::int64_t>(B * L, std::int64_t(1) << 40));
  expect_mpi_failure(args({}), 1,
                     "seq_idx.npy: value 1099511627776 at flat index 0 is outside the range of "
                     "int [-2147483648, 2147483647]",
                     2);
}

// Counts whose int64 sum wraps around to L (cli_fixture.hpp).
TEST_F(CliCpConv, SplitCountsAboveLAreRejectedOnEveryRank) {
  write_problem(DType::f64, false);
  expect_split_counts_above_length_rejected([&](const Strings& extra) { return args(extra); }, 13);
}

// A huge batch of empty sequences: the arrays are headers only. Scattering
// and gathering whole blocks makes the empty outputs quick to produce, and an
// output too large for any machine is an error before anything is allocated.
TEST_F(CliCpConv, HugeBatchOfEmptySequences) {
  const std::size_t huge = 2147483647;  // 2^31 - 1
  write("xbc.npy", DType::f32, {huge, 0, 4}, {});
  write("dt.npy", DType::f32, {huge, 0, 3}, {});
  write("conv_w.npy", DType::f32, {4, 1}, kdnn_test::uniform(4, -1, 1, 1));
  write("dt_bias.npy", DType::f32, {3}, kdnn_test::uniform(3, -1, 1, 2));
  for (int ranks : {1, 2}) {
    const auto r = run(args({}), mpiexec(ranks));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
    read(out_ / "y.npy", DType::f32, {huge, 0, 4});
    read(out_ / "dt_out.npy", DType::f32, {huge, 0, 3});
    read(out_ / "final.npy", DType::f32, {huge, 0, 4});
    for (const auto& name : files(out_)) std::filesystem::remove(out_ / name);
  }
  // final.npy [B, K-1, C] is 9 PB.
  write("xbc.npy", DType::f32, {huge, 0, 1024}, {});
  write("conv_w.npy", DType::f32, {1024, 1024}, ref::Vec(1024 * 1024, 0.5));
  expect_mpi_failure(args({}), 1,
                     "final.npy: shape (2147483647, 1023, 1024) float32 is 8998403157528576 bytes, "
                     "more than",
                     2);
}

}  // namespace
#endif
