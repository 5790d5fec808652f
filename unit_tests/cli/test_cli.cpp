// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The `kdnn` command-line tool, run as a subprocess on .npy fixtures: the
// top-level help, usage errors, input and output handling, and `kdnn
// sinkhorn` (results against plain double references, dtypes, optional
// outputs and every error path: exit status, one "kdnn: error:" line on
// stderr, nothing in --out). `kdnn mha`: test_cli_mha.cpp.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>

#include "cli_fixture.hpp"
#include "kdnn/io/npy.hpp"
#include "random.hpp"
#include "sinkhorn_reference.hpp"

namespace {

using namespace kdnn_test;
using kdnn::io::DType;

class Cli : public CliTest {
 protected:
  /// "sinkhorn --in IN --out OUT" followed by `extra`.
  Strings sinkhorn(const Strings& extra, const fs::path& out = {}) const {
    Strings args{"sinkhorn", "--in", in_.string(), "--out", (out.empty() ? out_ : out).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  /// Writes x.npy (and g.npy when `with_g`) for a [batch, n, n] problem.
  void write_problem(DType dtype, std::size_t batch, std::size_t n, bool with_g) {
    x_ = uniform(batch * n * n, 0.0, 4.0, 7);
    g_ = uniform(batch * n * n, -1.0, 1.0, 8);
    write("x.npy", dtype, {batch, n, n}, x_);
    if (with_g) write("g.npy", dtype, {batch, n, n}, g_);
  }

  std::vector<double> x_, g_;
};

void expect_zero_marginals(const std::vector<double>& dx, std::size_t batch, std::size_t n,
                           double tol) {
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t i = 0; i < n; ++i) {
      double row = 0, col = 0;
      for (std::size_t j = 0; j < n; ++j) {
        row += dx[(b * n + i) * n + j];
        col += dx[(b * n + j) * n + i];
      }
      EXPECT_NEAR(row, 0.0, tol) << "b=" << b << " row " << i;
      EXPECT_NEAR(col, 0.0, tol) << "b=" << b << " column " << i;
    }
  }
}

// ---- help ----------------------------------------------------------------

TEST_F(Cli, TopLevelHelp) {
  for (const char* flag : {"--help", "-h"}) {
    const Result r = run({flag});
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.err, "");
    EXPECT_NE(r.out.find("usage: kdnn <subcommand>"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("sinkhorn"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("Exit status"), std::string::npos) << r.out;
  }
}

TEST_F(Cli, SinkhornHelp) {
  write_problem(DType::f64, 2, 3, true);
  for (const Strings& args : {Strings{"sinkhorn", "--help"}, Strings{"sinkhorn", "-h"},
                              sinkhorn({"--iters", "3", "--help"})}) {
    const Result r = run(args);
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.err, "");
    for (const char* word :
         {"usage: kdnn sinkhorn", "--in", "--out", "--iters", "--tol", "--method", "unrolled"}) {
      EXPECT_NE(r.out.find(word), std::string::npos) << word;
    }
  }
  EXPECT_TRUE(files(out_).empty());
}

// ---- results -------------------------------------------------------------

TEST_F(Cli, ForwardOnlyMatchesReference) {
  const std::size_t batch = 3, n = 5;
  write_problem(DType::f64, batch, n, false);
  const Result r = run(sinkhorn({"--iters", "20"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* word : {"sinkhorn: B=3 n=5 dtype=float64", "method=none", "max_forward_iters=20",
                           "wrote=r.npy\n"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word << " in: " << r.out;
  }
  EXPECT_EQ(files(out_), std::set<std::string>{"r.npy"});
  const auto rr = read(out_ / "r.npy", DType::f64, {batch, n, n});
  for (std::size_t b = 0; b < batch; ++b) {
    EXPECT_LT(rel_error(matrix(rr, b, n), kdnn_test::ref_forward(matrix(x_, b, n), n, 20)), 1e-13);
  }
}

TEST_F(Cli, BackwardMethodsAgreeWhenConverged) {
  const std::size_t batch = 3, n = 5;
  const int iters = 300;
  write_problem(DType::f64, batch, n, true);
  std::vector<double> dx[3];
  const char* methods[] = {"implicit", "block", "unrolled"};
  for (int m = 0; m < 3; ++m) {
    const fs::path out = root_ / methods[m];
    fs::create_directories(out);
    // The default method is implicit.
    Strings extra{"--iters", std::to_string(iters)};
    if (m > 0) extra.insert(extra.end(), {"--method", methods[m]});
    const Result r = run(sinkhorn(extra, out));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find(std::string("method=") + methods[m]), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("max_cg_iters=") != std::string::npos, m < 2) << r.out;
    EXPECT_NE(r.out.find("wrote=r.npy,dx.npy"), std::string::npos) << r.out;
    EXPECT_EQ(files(out), (std::set<std::string>{"r.npy", "dx.npy"}));
    const auto rr = read(out / "r.npy", DType::f64, {batch, n, n});
    for (std::size_t b = 0; b < batch; ++b) {
      EXPECT_LT(rel_error(matrix(rr, b, n), kdnn_test::ref_forward(matrix(x_, b, n), n, iters)),
                1e-12);
    }
    dx[m] = read(out / "dx.npy", DType::f64, {batch, n, n});
    expect_zero_marginals(dx[m], batch, n, 1e-10);
  }
  for (std::size_t b = 0; b < batch; ++b) {
    const Mat ref = kdnn_test::ref_unrolled_backward(matrix(x_, b, n), matrix(g_, b, n), n, iters);
    EXPECT_LT(rel_error(matrix(dx[2], b, n), ref), 1e-11);
  }
  EXPECT_LT(rel_error(dx[0], dx[2]), 1e-9);
  EXPECT_LT(rel_error(dx[1], dx[2]), 1e-9);
}

TEST_F(Cli, UnrolledUsesTheGivenIterations) {
  const std::size_t batch = 2, n = 4;
  const int iters = 3;  // far from converged: only the unrolled gradient matches
  write_problem(DType::f64, batch, n, true);
  const Result r = run(sinkhorn({"--iters", "3", "--method", "unrolled", "--tol", "0"}));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto dx = read(out_ / "dx.npy", DType::f64, {batch, n, n});
  for (std::size_t b = 0; b < batch; ++b) {
    const Mat ref = kdnn_test::ref_unrolled_backward(matrix(x_, b, n), matrix(g_, b, n), n, iters);
    EXPECT_LT(rel_error(matrix(dx, b, n), ref), 1e-12);
  }
}

TEST_F(Cli, Float32InFloat32Out) {
  const std::size_t batch = 4, n = 6;
  const int iters = 300;
  write_problem(DType::f32, batch, n, true);
  // The reference sees the float-rounded inputs.
  std::vector<double> xr(x_.size()), gr(g_.size());
  for (std::size_t k = 0; k < x_.size(); ++k) {
    xr[k] = double(float(x_[k]));
    gr[k] = double(float(g_[k]));
  }
  for (const char* method : {"implicit", "block", "unrolled"}) {
    SCOPED_TRACE(method);
    const fs::path out = root_ / method;
    fs::create_directories(out);
    const Result r = run(sinkhorn({"--iters=300", "--method=" + std::string(method)}, out));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("dtype=float32"), std::string::npos) << r.out;
    const auto rr = read(out / "r.npy", DType::f32, {batch, n, n});
    const auto dx = read(out / "dx.npy", DType::f32, {batch, n, n});
    for (std::size_t b = 0; b < batch; ++b) {
      EXPECT_LT(rel_error(matrix(rr, b, n), kdnn_test::ref_forward(matrix(xr, b, n), n, iters)),
                1e-5);
      const Mat ref =
          kdnn_test::ref_unrolled_backward(matrix(xr, b, n), matrix(gr, b, n), n, iters);
      EXPECT_LT(rel_error(matrix(dx, b, n), ref), 1e-4);
    }
  }
}

TEST_F(Cli, ToleranceStopsEarly) {
  const std::size_t batch = 3, n = 5;
  write_problem(DType::f64, batch, n, true);
  const Result r = run(sinkhorn({"--iters", "500", "--tol", "1e-9", "--method", "block"}));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto pos = r.out.find("max_forward_iters=");
  ASSERT_NE(pos, std::string::npos) << r.out;
  EXPECT_LT(std::stoi(r.out.substr(pos + 18)), 500) << r.out;
  const auto rr = read(out_ / "r.npy", DType::f64, {batch, n, n});
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t j = 0; j < n; ++j) {
      double col = 0;
      for (std::size_t i = 0; i < n; ++i) col += rr[(b * n + i) * n + j];
      EXPECT_NEAR(col, 1.0, 1e-9);
    }
  }
  EXPECT_EQ(files(out_), (std::set<std::string>{"r.npy", "dx.npy"}));
}

TEST_F(Cli, EmptyBatch) {
  write("x.npy", DType::f64, {0, 4, 4}, {});
  write("g.npy", DType::f64, {0, 4, 4}, {});
  const Result r = run(sinkhorn({"--iters", "5"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(read(out_ / "r.npy", DType::f64, {0, 4, 4}).empty());
  EXPECT_TRUE(read(out_ / "dx.npy", DType::f64, {0, 4, 4}).empty());
}

// ---- gradient choice, order and eps ------------------------------------------

/// Writes a [batch, 4, 4] problem with logits randn × 5 (20 iterations do not
/// converge: the defect report's case).
void write_unconverged(const fs::path& dir, std::size_t batch) {
  std::vector<double> x = kdnn_test::normal(batch * 16, 301),
                      g = kdnn_test::normal(batch * 16, 302);
  for (double& v : x) v *= 5;
  kdnn::io::write_npy((dir / "x.npy").string(), Shape{batch, 4, 4}, x.data());
  kdnn::io::write_npy((dir / "g.npy").string(), Shape{batch, 4, 4}, g.data());
}

TEST_F(Cli, UnconvergedGradientWarnsOnceAndNamesTheRemedy) {
  write_unconverged(in_, 500);
  for (const std::string method : {"implicit", "block"}) {
    for (const std::string marginals : {"measured", "unit"}) {
      SCOPED_TRACE(method + " " + marginals);
      const Result r =
          run(sinkhorn({"--iters", "20", "--method", method, "--marginals", marginals}));
      ASSERT_EQ(r.status, 0) << r.err;
      EXPECT_EQ(r.err.rfind("kdnn: warning: dx.npy is not the converged gradient: R's max "
                            "marginal error ",
                            0),
                0u)
          << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
      EXPECT_NE(r.err.find("--method unrolled"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("more --iters"), std::string::npos) << r.err;
      EXPECT_NE(r.out.find("marginals=" + marginals), std::string::npos) << r.out;
    }
  }
  // Autograd's gradient through the 20 iterations is what was asked for: no
  // warning; nor once the forward has converged (a milder problem).
  const Result unrolled = run(sinkhorn({"--iters", "20", "--method", "unrolled"}));
  ASSERT_EQ(unrolled.status, 0) << unrolled.err;
  EXPECT_EQ(unrolled.err, "");
  write_problem(DType::f64, 5, 4, true);
  const Result converged = run(sinkhorn({"--iters", "300"}));
  ASSERT_EQ(converged.status, 0) << converged.err;
  EXPECT_EQ(converged.err, "");
}

TEST_F(Cli, CGThatDoesNotConvergeIsReported) {
  // Unit marginals on an unconverged R: the system is inconsistent, CG's
  // residual stays far above its tolerance.
  write_unconverged(in_, 2000);
  const Result r = run(sinkhorn({"--iters", "20", "--marginals", "unit"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("CG stopped at max relative residual "), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST_F(Cli, OrderAndEps) {
  const std::size_t batch = 3, n = 4;
  const int iters = 10;
  write_problem(DType::f64, batch, n, true);
  const kdnn_test::Variant variant{true, 1e-6};
  const Result r = run(sinkhorn(
      {"--iters", "10", "--order", "rows-first", "--eps", "1e-6", "--method", "unrolled"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("order=rows-first eps=1e-06"), std::string::npos) << r.out;
  const auto rr = read(out_ / "r.npy", DType::f64, {batch, n, n});
  const auto dx = read(out_ / "dx.npy", DType::f64, {batch, n, n});
  for (std::size_t b = 0; b < batch; ++b) {
    const Mat x = matrix(x_, b, n), g = matrix(g_, b, n);
    EXPECT_LT(rel_error(matrix(rr, b, n), kdnn_test::ref_forward(x, n, iters, variant)), 1e-13);
    EXPECT_LT(
        rel_error(matrix(dx, b, n), kdnn_test::ref_unrolled_backward(x, g, n, iters, variant)),
        1e-11);
  }
}

TEST_F(Cli, NonFiniteInputsAreRejectedWithTheirPosition) {
  const std::size_t batch = 2, n = 3;
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    const char* file;
    std::size_t at;  // flat index into [batch, n, n]
    double value;
    std::vector<std::size_t> also;  // more entries set to value
    const char* message;
  };
  const Case cases[] = {
      {"x.npy", 1 * 9 + 2 * 3 + 1, std::nan(""), {}, "x.npy: NaN at [1, 2, 1]"},
      {"x.npy", 0 * 9 + 1 * 3 + 2, inf, {}, "x.npy: +inf at [0, 1, 2]"},
      {"x.npy", 9 + 3, -inf, {9 + 4, 9 + 5}, "x.npy: row 1 entirely -inf at [1, 1, 0]"},
      {"x.npy", 2, -inf, {5, 8}, "x.npy: column 2 entirely -inf at [0, 0, 2]"},
      {"g.npy", 9 + 8, -inf, {}, "g.npy: -inf at [1, 2, 2] (expected finite values)"},
      {"g.npy", 4, std::nan(""), {}, "g.npy: NaN at [0, 1, 1]"},
  };
  for (const Case& c : cases) {
    for (const DType dtype : {DType::f64, DType::f32}) {
      SCOPED_TRACE(c.message);
      write_problem(dtype, batch, n, true);
      std::vector<double>& values = std::string(c.file) == "x.npy" ? x_ : g_;
      values[c.at] = c.value;
      for (std::size_t k : c.also) values[k] = c.value;
      write(c.file, dtype, {batch, n, n}, values);
      std::ofstream(out_ / "r.npy") << "earlier";
      expect_error(sinkhorn({"--iters", "5"}), kInput, c.message, {"r.npy"});
      EXPECT_EQ(read_text(out_ / "r.npy"), "earlier");
      fs::remove(out_ / "r.npy");
    }
  }
  // A partial -inf mask is valid: masked entries come out 0.
  write_problem(DType::f64, batch, n, true);
  x_[1] = x_[9 + 4] = -inf;
  write("x.npy", DType::f64, {batch, n, n}, x_);
  const Result r = run(sinkhorn({"--iters", "50", "--method", "unrolled"}));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rr = read(out_ / "r.npy", DType::f64, {batch, n, n});
  const auto dx = read(out_ / "dx.npy", DType::f64, {batch, n, n});
  EXPECT_EQ(rr[1], 0.0);
  EXPECT_EQ(rr[9 + 4], 0.0);
  for (double v : rr) EXPECT_TRUE(std::isfinite(v));
  for (double v : dx) EXPECT_TRUE(std::isfinite(v));
}

TEST_F(Cli, ShapesAreCheckedBeforeAnythingIsAllocated) {
  const std::size_t huge = std::size_t(1) << 40;
  const Shape shapes[] = {{huge, 0, 0},
                          {std::size_t(1) << 31, 0, 0},
                          {0, std::size_t(1) << 62, std::size_t(1) << 62},
                          {3, 0, 0}};
  for (const Shape& shape : shapes) {
    write("x.npy", DType::f64, shape, {});
    expect_error(sinkhorn({"--iters", "5"}), kInput, "expected [B, n, n] with 1 <= n <= ");
  }
}

// ---- errors ----------------------------------------------------------------

TEST_F(Cli, UsageErrors) {
  write_problem(DType::f64, 2, 3, true);
  const std::string in = in_.string(), out = out_.string();
  struct Case {
    Strings args;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {{}, "missing subcommand"},
      {{"frobnicate"}, "unknown subcommand 'frobnicate'"},
      {{"--verbose"}, "unknown option '--verbose'"},
      {{"sinkhorn", "--out", out, "--iters", "3"}, "--in is required"},
      {{"sinkhorn", "--in", in, "--iters", "3"}, "--out is required"},
      {{"sinkhorn", "--in", in, "--out", out}, "--iters is required"},
      {sinkhorn({"--iters", "3", "--bogus", "1"}), "unknown option '--bogus'"},
      {sinkhorn({"--iters", "3", "--bogus=1"}), "unknown option '--bogus'"},
      {sinkhorn({"--iters", "3", "extra"}), "unexpected argument 'extra'"},
      {sinkhorn({"--iters", "3", "--iters", "4"}), "--iters: At Most 1 required but received 2"},
      {sinkhorn({"--iters"}), "--iters: 1 required INT missing"},
      {sinkhorn({"--iters="}), "--iters: 1 required INT missing"},
      {sinkhorn({"--iters", "3", "--tol"}), "--tol: 1 required FLOAT missing"},
      {{"sinkhorn", "--in", "--out", out, "--iters", "3"}, "--in: requires a value, got '--out'"},
      {sinkhorn({"--iters", "--tol", "1"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "abc"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "0"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "-3"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "2.5"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "3x"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", " 3"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "99999999999"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "0x10"}), "--iters: expected an integer >= 1"},
      {sinkhorn({"--iters", "3", "--tol", "small"}), "--tol: expected a finite number >= 0"},
      {sinkhorn({"--iters", "3", "--tol", "-1e-6"}), "--tol: expected a finite number >= 0"},
      {sinkhorn({"--iters", "3", "--tol", "nan"}), "--tol: expected a finite number >= 0"},
      {sinkhorn({"--iters", "3", "--tol", "inf"}), "--tol: expected a finite number >= 0"},
      {sinkhorn({"--iters", "3", "--tol", "1e999"}), "--tol: expected a finite number >= 0"},
      {sinkhorn({"--iters", "3", "--tol", "1e-6x"}), "--tol: expected a finite number >= 0"},
      {sinkhorn({"--iters", "3", "--method", "newton"}),
       "--method: newton not in {implicit,block,unrolled}"},
      {sinkhorn({"--iters", "3", "--method", "unrolled", "--tol", "1e-6"}),
       "--method unrolled needs --tol 0"},
  };
  for (const Case& c : cases) expect_error(c.args, kUsage, c.fragment);
}

// A value given with `=` is the option's whatever it starts with (a
// directory named "-out"); the separate form still refuses a dash value, the
// next option swallowed ("--in --out DIR", in UsageErrors).
TEST_F(Cli, DashValuesGivenWithEqualsAreAccepted) {
  write_problem(DType::f64, 2, 4, true);
  fs::create_directories(root_ / "-out");
  fs::rename(in_, root_ / "-in");
  const std::string here = "cd " + quote(root_.string()) + " &&";
  const Result r =
      run({"sinkhorn", "--in=-in", "--out=-out", "--iters", "5", "--method", "unrolled"}, here);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(files(root_ / "-out"), (std::set<std::string>{"r.npy", "dx.npy"}));
  fs::rename(root_ / "-in", in_);
  // Every subcommand and option with a value that must not be an option.
  const std::string out = "--out=" + out_.string(), in = "--in=" + in_.string();
  const std::vector<Strings> commands = {{"sinkhorn", "--iters", "3"},
                                         {"mha", "--heads", "1"},
#ifdef KDNN_MPIEXEC
                                         {"cp-conv"},
                                         {"ssd"}
#endif
  };
  for (const Strings& command : commands) {
    Strings a = command;
    a.insert(a.end(), {"--in=-nope", out});
    expect_error(a, kInput, "--in '-nope' is not an existing directory");
    a = command;
    a.insert(a.end(), {in, "--out=-nope"});
    expect_error(a, kInput, "--out '-nope' is not an existing directory");
    a = command;
    a.insert(a.end(), {"--out", "-nope", in});
    expect_error(a, kUsage, "--out: requires a value, got '-nope'");
    if (command[0] == "cp-conv" || command[0] == "ssd") {
      a = command;
      a.insert(a.end(), {in, out, "--split=-1"});
      expect_error(a, kUsage,
                   "--split: expected counts >= 0 (at most 9223372036854775807), got '-1'");
      a = command;
      a.insert(a.end(), {in, out, "--split", "-1"});
      expect_error(a, kUsage, "--split: requires a value, got '-1'");
    }
  }
}

// The summary line (or the help) that cannot be written is an error, once;
// the outputs were written before it.
TEST_F(Cli, FailedWriteOfStdoutIsAnError) {
  write_problem(DType::f64, 2, 4, true);
  for (const Strings& args : {Strings{"--help"}, Strings{"sinkhorn", "--help"},
                              sinkhorn({"--iters", "5", "--method", "unrolled"})}) {
    SCOPED_TRACE(args[0] + " " + args[1 % args.size()]);
    const Result r = run_to("/dev/full", args);
    EXPECT_EQ(r.status, kInput);
    EXPECT_EQ(r.err, "kdnn: error: cannot write the standard output\n");
  }
  EXPECT_EQ(files(out_), (std::set<std::string>{"r.npy", "dx.npy"}));
  // An error already reported stays the only line.
  const Result bad = run_to("/dev/full", {"frobnicate"});
  EXPECT_EQ(bad.status, kUsage);
  EXPECT_EQ(bad.err, "kdnn: error: unknown subcommand 'frobnicate' (try 'kdnn --help')\n");
}

TEST_F(Cli, MissingX) {
  expect_error(sinkhorn({"--iters", "3"}), kInput, "missing input " + (in_ / "x.npy").string());
}

TEST_F(Cli, InNotADirectory) {
  const Strings args{"sinkhorn", "--in", (root_ / "nope").string(), "--out", out_.string(),
                     "--iters",  "3"};
  expect_error(args, kInput,
               "--in '" + (root_ / "nope").string() + "' is not an existing directory");
}

TEST_F(Cli, OutNotAnExistingDirectory) {
  write_problem(DType::f64, 2, 3, true);
  const fs::path missing = root_ / "missing";
  expect_error(sinkhorn({"--iters", "3"}, missing), kInput,
               "--out '" + missing.string() + "' is not an existing directory");
  EXPECT_FALSE(fs::exists(missing));
  const fs::path file = root_ / "file";
  std::ofstream(file) << "keep";
  expect_error(sinkhorn({"--iters", "3"}, file), kInput, "is not an existing directory");
  EXPECT_EQ(read_text(file), "keep");
}

TEST_F(Cli, XWrongRank) {
  write("x.npy", DType::f64, {4, 4}, uniform(16, 0, 1, 1));
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               "x.npy has shape (4, 4), expected a 3-d array [B, n, n]");
  write("x.npy", DType::f64, {1, 2, 2, 2}, uniform(8, 0, 1, 1));
  expect_error(sinkhorn({"--iters", "3"}), kInput, "expected a 3-d array");
}

TEST_F(Cli, XNotSquare) {
  write("x.npy", DType::f64, {2, 3, 4}, uniform(24, 0, 1, 1));
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               "x.npy has shape (2, 3, 4), expected [B, n, n] (a batch of square matrices)");
}

TEST_F(Cli, GShapeDiffers) {
  write("x.npy", DType::f64, {3, 4, 4}, uniform(48, 0, 1, 1));
  write("g.npy", DType::f64, {2, 4, 4}, uniform(32, 0, 1, 2));
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               "g.npy has shape (2, 4, 4), expected (3, 4, 4) (same as x.npy)");
}

TEST_F(Cli, DTypeMismatch) {
  write("x.npy", DType::f64, {2, 3, 3}, uniform(18, 0, 1, 1));
  write("g.npy", DType::f32, {2, 3, 3}, uniform(18, 0, 1, 2));
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               "g.npy has dtype float32, expected float64 (same as x.npy)");
}

TEST_F(Cli, UnsupportedDType) {
  // A valid float32 file relabelled as uint32 (same element size).
  write("x.npy", DType::f32, {2, 3, 3}, uniform(18, 0, 1, 1));
  std::string bytes = read_text(in_ / "x.npy");
  const auto pos = bytes.find("<f4");
  ASSERT_NE(pos, std::string::npos);
  bytes.replace(pos, 3, "<u4");
  std::ofstream(in_ / "x.npy", std::ios::binary) << bytes;
  expect_error(sinkhorn({"--iters", "3"}), kInput, "dtype '<u4' not supported");
}

TEST_F(Cli, IntegerInputsAreRejectedNotReadAsFloats) {
  // int32 has float32's element size and int64 float64's: the bytes would
  // make a valid float array; the tool must refuse them by their dtype.
  const std::vector<std::int32_t> i32(18, 1);
  const std::vector<std::int64_t> i64(18, 1);
  const std::string expected = ": dtype int32, expected float32 or float64";
  kdnn::io::write_npy<std::int32_t>((in_ / "x.npy").string(), {2, 3, 3}, i32.data());
  expect_error(sinkhorn({"--iters", "3"}), kInput, "x.npy" + expected);
  kdnn::io::write_npy<std::int64_t>((in_ / "x.npy").string(), {2, 3, 3}, i64.data());
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               "x.npy: dtype int64, expected float32 or float64");
  // A float x.npy with an integer g.npy, forward only and with a backward.
  write("x.npy", DType::f32, {2, 3, 3}, uniform(18, 0, 1, 1));
  kdnn::io::write_npy<std::int32_t>((in_ / "g.npy").string(), {2, 3, 3}, i32.data());
  expect_error(sinkhorn({"--iters", "3"}), kInput, "g.npy" + expected);
  expect_error(sinkhorn({"--iters", "3", "--method", "unrolled"}), kInput, "g.npy" + expected);
  // An earlier output in --out stays as it was.
  std::ofstream(out_ / "r.npy") << "earlier";
  expect_error(sinkhorn({"--iters", "3"}), kInput, "g.npy" + expected, {"r.npy"});
  EXPECT_EQ(read_text(out_ / "r.npy"), "earlier");
}

TEST_F(Cli, MalformedNpy) {
  write("x.npy", DType::f64, {2, 3, 3}, uniform(18, 0, 1, 1));
  std::ofstream(in_ / "g.npy") << "not an array\nsecond line\n";
  expect_error(sinkhorn({"--iters", "3"}), kInput, "not a .npy file");
}

TEST_F(Cli, FailedOutputLeavesOutAsItWas) {
  write_problem(DType::f64, 2, 3, true);
  // An r.npy from an earlier run, and a directory where dx.npy must go: both
  // outputs are written to temporaries, then neither may replace anything.
  std::ofstream(out_ / "r.npy") << "earlier";
  fs::create_directories(out_ / "dx.npy" / "keep");
  expect_error(sinkhorn({"--iters", "3"}), kInput, "dx.npy", {"r.npy", "dx.npy"});
  EXPECT_EQ(read_text(out_ / "r.npy"), "earlier");
}

TEST_F(Cli, TemporariesHaveUniqueNames) {
  write_problem(DType::f64, 2, 3, true);
  // Files under the names a fixed temporary would have are no obstacle.
  fs::create_directories(out_ / "r.npy.tmp");
  fs::create_directories(out_ / "dx.npy.tmp");
  const Result r = run(sinkhorn({"--iters", "3"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(files(out_), (std::set<std::string>{"r.npy", "dx.npy", "r.npy.tmp", "dx.npy.tmp"}));
}

// ---- Kokkos, MPI, memory -----------------------------------------------------

TEST_F(Cli, KokkosArgumentsGoToKokkos) {
  const std::size_t batch = 2, n = 4;
  write_problem(DType::f64, batch, n, true);
  // Anywhere on the command line. Kokkos 4 takes the thread count, 3.4 knows
  // it as --kokkos-threads and ignores this spelling; both know the other.
  Strings args{"--kokkos-num-threads=1",
               "sinkhorn",
               "--in",
               in_.string(),
               "--kokkos-tune-internals",
               "--out",
               out_.string(),
               "--iters",
               "20"};
  const Result r = run(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const auto rr = read(out_ / "r.npy", DType::f64, {batch, n, n});
  for (std::size_t b = 0; b < batch; ++b) {
    EXPECT_LT(rel_error(matrix(rr, b, n), kdnn_test::ref_forward(matrix(x_, b, n), n, 20)), 1e-13);
  }
}

// The integer-valued --kokkos-* arguments are checked before Kokkos sees them
// (Kokkos aborted with an uncaught std::invalid_argument): a usage error
// naming the argument, what it expects and what it got.
TEST_F(Cli, MalformedKokkosIntegersAreUsageErrors) {
  write_problem(DType::f64, 2, 4, true);
  const std::string at_most = " (at most 2147483647), got '";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--kokkos-threads=abc", "--kokkos-threads: expected --kokkos-threads=N, N an integer >= 1"},
      {"--kokkos-threads=-1", "--kokkos-threads: expected --kokkos-threads=N, N an integer >= 1"},
      {"--kokkos-threads=0", "N an integer >= 1" + at_most + "--kokkos-threads=0'"},
      {"--kokkos-threads=99999999999999", "N an integer >= 1" + at_most},
      {"--kokkos-threads=", "--kokkos-threads: expected --kokkos-threads=N"},
      {"--kokkos-threads", "N an integer >= 1" + at_most + "--kokkos-threads'"},
      {"--kokkos-threads=4x", "--kokkos-threads: expected"},
      {"--kokkos-num-threads=abc", "--kokkos-num-threads: expected --kokkos-num-threads=N"},
      {"--kokkos-num-threads", "--kokkos-num-threads: expected"},
      {"--kokkos-numa=x", "--kokkos-numa: expected --kokkos-numa=N, N an integer >= 1"},
      {"--kokkos-device-id=zz",
       "--kokkos-device-id: expected --kokkos-device-id=N, N an integer >= 0"},
      {"--kokkos-device-id=-1", "--kokkos-device-id: expected"},
      {"--kokkos-device=zz", "--kokkos-device: expected --kokkos-device=N, N an integer >= 0"},
      {"--kokkos-skip-device=zz", "--kokkos-skip-device: expected"},
      {"--kokkos-skip-device", "--kokkos-skip-device: expected"},
      {"--kokkos-num-devices=zz", "--kokkos-num-devices: expected --kokkos-num-devices=N[,S]"},
      {"--kokkos-num-devices=0", "--kokkos-num-devices: expected"},
      {"--kokkos-num-devices=2,x", "--kokkos-num-devices: expected"},
      {"--kokkos-ndevices=-3", "--kokkos-ndevices: expected --kokkos-ndevices=N[,S]"},
      {"--kokkos-ndevices", "--kokkos-ndevices: expected"},
  };
  for (const auto& [arg, fragment] : cases) {
    expect_error({arg, "--help"}, kUsage, fragment);
    expect_error(sinkhorn({"--iters", "3", arg}), kUsage, fragment);
  }
  // Well formed ones still go to Kokkos (a host backend ignores the devices),
  // in the spellings of the Kokkos the tool was built with: Kokkos 4 warns
  // about 3.x's --kokkos-threads, --kokkos-numa and --kokkos-num-devices.
#if KOKKOS_VERSION >= 40000
  const char* const well_formed[] = {"--kokkos-num-threads=1", "--kokkos-device-id=0"};
#else
  const char* const well_formed[] = {"--kokkos-threads=1", "--kokkos-num-threads=1",
                                     "--kokkos-numa=1", "--kokkos-device-id=0",
                                     "--kokkos-num-devices=1,0"};
#endif
  for (const char* arg : well_formed) {
    const Result r = run(sinkhorn({"--iters", "5", "--method", "unrolled", arg}));
    EXPECT_EQ(r.status, 0) << arg << ": " << r.err;
    EXPECT_EQ(r.err, "") << arg;
  }
}

#ifdef KDNN_MPIEXEC
TEST_F(Cli, MalformedKokkosIntegerUnderMpiIsOneErrorLine) {
  write_problem(DType::f64, 2, 4, true);
  const std::string mpiexec = kdnn_test::mpiexec(3);
  for (const Strings& args : {sinkhorn({"--iters", "3", "--kokkos-threads=abc"}),
                              Strings{"ssd", "--kokkos-threads=abc", "--help"}}) {
    const Result r = run(args, mpiexec);
    EXPECT_EQ(r.status, kUsage) << r.err;
    const std::string line =
        "kdnn: error: --kokkos-threads: expected --kokkos-threads=N, N an integer >= 1 (at most "
        "2147483647), got '--kokkos-threads=abc'\n";
    const auto first = r.err.find(line);
    EXPECT_NE(first, std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("kdnn: error:", first + 1), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
}
#endif

// Outside an MPI launcher the single-process subcommands do not initialise
// MPI (a singleton MPI_Init costs about 0.4 s). Observable with Open MPI,
// whose MPI_Init fails when told to use a component that does not exist;
// other MPI libraries ignore the variable and the test shows nothing.
TEST_F(Cli, SingleProcessSubcommandsDoNotInitialiseMpi) {
  write_problem(DType::f64, 2, 4, true);
  const std::string broken_mpi = "OMPI_MCA_pml=no_such_component";
  for (const Strings& args :
       {Strings{"--help"}, Strings{"sinkhorn", "--help"}, Strings{"mha", "--help"},
        sinkhorn({"--iters", "5", "--method", "unrolled"})}) {
    SCOPED_TRACE(args[0]);
    const Result r = run(args, broken_mpi);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
  }
  EXPECT_EQ(files(out_), (std::set<std::string>{"r.npy", "dx.npy"}));
  // The usage errors as well.
  const Result bad = run({"frobnicate"}, broken_mpi);
  EXPECT_EQ(bad.status, kUsage);
  EXPECT_EQ(bad.err, "kdnn: error: unknown subcommand 'frobnicate' (try 'kdnn --help')\n");
}

#ifdef KDNN_MPIEXEC
TEST_F(Cli, UnderMpiRankZeroWorksAndEveryRankExitsWithItsStatus) {
  write_problem(DType::f64, 2, 4, true);
  const std::string mpiexec = kdnn_test::mpiexec(3);
  const Result ok = run(sinkhorn({"--iters", "5", "--method", "unrolled"}), mpiexec);
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(ok.err, "");
  EXPECT_EQ(ok.out.rfind("sinkhorn: B=2 n=4", 0), 0u) << ok.out;
  EXPECT_EQ(std::count(ok.out.begin(), ok.out.end(), '\n'), 1) << ok.out;
  EXPECT_EQ(files(out_), (std::set<std::string>{"r.npy", "dx.npy"}));

  fs::remove_all(out_);
  fs::create_directories(out_);
  const Result bad = run(sinkhorn({}), mpiexec);  // no --iters
  EXPECT_EQ(bad.status, kUsage);
  const std::string line = "kdnn: error: --iters is required\n";
  const auto first = bad.err.find(line);
  EXPECT_NE(first, std::string::npos) << bad.err;
  EXPECT_EQ(bad.err.find("kdnn: error:", first + 1), std::string::npos) << bad.err;
  EXPECT_EQ(bad.out, "");
  EXPECT_TRUE(files(out_).empty());
}
#endif

TEST_F(Cli, PeakMemoryIsInputsPlusOutputs) {
  if (!Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                  Kokkos::DefaultExecutionSpace::memory_space>::accessible) {
    GTEST_SKIP() << "device backend: the tool copies to and from the device";
  }
  // 4 arrays (x, g, r, dx) of 64 MiB; a copy of any of them would exceed the
  // margin left for the libraries and Kokkos (about 22 MiB measured).
  const std::size_t batch = 32768, n = 16;
  const double array_mib = double(batch * n * n * sizeof(double)) / (1 << 20);
  write_problem(DType::f64, batch, n, true);
  const Result r = run(sinkhorn({"--iters", "5"}));
  ASSERT_EQ(r.status, 0) << r.err;
  const double peak_mib = kdnn_test::peak_child_mib();
  EXPECT_LT(peak_mib, 4 * array_mib + 48) << "peak RSS " << peak_mib << " MiB";
}

// ---- concurrent runs ---------------------------------------------------------

TEST_F(Cli, ConcurrentRunsIntoOneOutLeaveOneRunsFiles) {
  // Two problems; each run alone gives the reference outputs.
  const std::size_t batch = 64, n = 8;
  const fs::path in[2] = {in_, root_ / "in2"};
  fs::create_directories(in[1]);
  for (int k = 0; k < 2; ++k) {
    const auto x = uniform(batch * n * n, 0.0, 4.0, 10 + k);
    const auto g = uniform(batch * n * n, -1.0, 1.0, 20 + k);
    kdnn::io::write_npy((in[k] / "x.npy").string(), {batch, n, n}, x.data());
    kdnn::io::write_npy((in[k] / "g.npy").string(), {batch, n, n}, g.data());
  }
  const auto args = [&](int k, const fs::path& out) {
    return Strings{"sinkhorn", "--in", in[k].string(), "--out", out.string(), "--iters", "50"};
  };
  std::string expected[2][2];  // [run][r.npy, dx.npy], the files' bytes
  const char* names[2] = {"r.npy", "dx.npy"};
  for (int k = 0; k < 2; ++k) {
    const fs::path out = root_ / ("alone" + std::to_string(k));
    fs::create_directories(out);
    ASSERT_EQ(run(args(k, out)).status, 0);
    for (int f = 0; f < 2; ++f) expected[k][f] = read_text(out / names[f]);
    ASSERT_NE(expected[k][0], "");
  }
  ASSERT_NE(expected[0][0], expected[1][0]);

  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::string cmd;
    for (int k = 0; k < 2; ++k) {
      const fs::path status = root_ / ("status" + std::to_string(k));
      cmd += "(" + command(args(k, out_)) + " >/dev/null 2>&1; echo $? >" + quote(status.string()) +
             ") & ";
    }
    ASSERT_EQ(std::system((cmd + "wait").c_str()), 0);
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(read_text(root_ / ("status" + std::to_string(k))), "0\n") << "run " << k;
    }
    EXPECT_EQ(files(out_), (std::set<std::string>{"r.npy", "dx.npy"}));
    for (int f = 0; f < 2; ++f) {
      const std::string bytes = read_text(out_ / names[f]);
      EXPECT_TRUE(bytes == expected[0][f] || bytes == expected[1][f]) << names[f];
      read(out_ / names[f], DType::f64, {batch, n, n});  // a valid .npy file
    }
  }
}

// ---- inputs that are not regular files ---------------------------------------

TEST_F(Cli, FifoInputIsAnErrorNotAHang) {
  ASSERT_EQ(::mkfifo((in_ / "x.npy").c_str(), 0600), 0);
  // Under `timeout`, so that a regression fails (status 124) instead of hanging.
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               (in_ / "x.npy").string() + ": not a regular file (a FIFO)", {}, "timeout 20");
}

TEST_F(Cli, DanglingSymbolicLinkIsAnErrorNotAnAbsentInput) {
  write_problem(DType::f64, 2, 3, false);
  fs::create_symlink(in_ / "missing.npy", in_ / "g.npy");
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               (in_ / "g.npy").string() + ": symbolic link to a missing file");
}

TEST_F(Cli, SymbolicLinkLoopIsNamedAsSuch) {
  fs::create_symlink("y.npy", in_ / "x.npy");
  fs::create_symlink("x.npy", in_ / "y.npy");
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               (in_ / "x.npy").string() + ": cannot open file: " + std::strerror(ELOOP));
}

TEST_F(Cli, DirectoryInputIsAnError) {
  write_problem(DType::f64, 2, 3, false);
  fs::create_directories(in_ / "g.npy" / "keep");
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               (in_ / "g.npy").string() + ": not a regular file (a directory)");
}

TEST_F(Cli, UnreadableInputIsAnError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  write_problem(DType::f64, 2, 3, true);
  fs::permissions(in_ / "g.npy", fs::perms::none);
  expect_error(sinkhorn({"--iters", "3"}), kInput,
               (in_ / "g.npy").string() + ": cannot open file: " + std::strerror(EACCES));
}

TEST_F(Cli, SymbolicLinksToRegularFilesAreRead) {
  const std::size_t batch = 2, n = 3;
  const fs::path data = root_ / "data";
  fs::create_directories(data);
  write_problem(DType::f64, batch, n, true);
  for (const char* name : {"x.npy", "g.npy"}) {
    fs::rename(in_ / name, data / name);
    fs::create_symlink(data / name, in_ / name);
  }
  const Result r = run(sinkhorn({"--iters", "5"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(files(out_), (std::set<std::string>{"r.npy", "dx.npy"}));
  const auto rr = read(out_ / "r.npy", DType::f64, {batch, n, n});
  EXPECT_LT(rel_error(matrix(rr, 0, n), kdnn_test::ref_forward(matrix(x_, 0, n), n, 5)), 1e-13);
}

// ---- bytes from files in messages ----------------------------------------------

TEST_F(Cli, HeaderBytesAreEscapedOnStderr) {
  write("x.npy", DType::f64, {2, 3, 3}, uniform(18, 0, 1, 1));
  std::string bytes = read_text(in_ / "x.npy");
  const auto pos = bytes.find("'<f8'");
  ASSERT_NE(pos, std::string::npos);
  // A dtype with a terminal escape sequence, a NUL and a newline; as many
  // padding spaces removed, so that the header keeps its length.
  const std::string descr("'\x1b[31m\0\n'", 9);
  bytes.replace(pos, 5, descr);
  bytes.erase(bytes.find("} ") + 1, descr.size() - 5);
  std::ofstream(in_ / "x.npy", std::ios::binary) << bytes;
  // One line on stderr (checked by expect_error), with the bytes escaped.
  expect_error(sinkhorn({"--iters", "3"}), kInput, "dtype '\\x1b[31m\\x00\\x0a' not supported");
  const Result r = run(sinkhorn({"--iters", "3"}));
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
}

}  // namespace
