// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// `kdnn sinkhorn`, run as a subprocess on .npy fixtures: R and dX against
// plain double references, each backward method, float32 in and out, the
// tolerance, an empty batch, the gradient choice on an unconverged R (the
// warning, CG's report), the order and eps, non-finite inputs named by
// their position, and shapes checked before anything is allocated.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli_fixture.hpp"
#include "cli_sinkhorn.hpp"
#include "kdnn/io/npy.hpp"
#include "random.hpp"
#include "sinkhorn_reference.hpp"

namespace {

using namespace kdnn_test;
using kdnn::io::DType;

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

}  // namespace
