// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The Sinkhorn's three backwards (implicit, block, unrolled) against
// independent double references (reverse mode through stored iterates,
// finite differences) and each other, their invariants (zero row and column
// sums, a row-plus-column gradient giving zero), an unconverged R (measured
// and unit marginals) and the CG's report.
#include <algorithm>
#include <cmath>
#include <vector>

#include "sinkhorn_problems.hpp"
#include "sinkhorn_test_util.hpp"

namespace {

using namespace kdnn_test;
namespace sk = kdnn::sinkhorn;

using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SinkhornTyped, Types);

// ---- backward ------------------------------------------------------------

TYPED_TEST(SinkhornTyped, UnrolledMatchesReverseModeReference) {
  using T = TypeParam;
  for (int n : {1, 2, 4, 5, 16}) {
    const auto p = make_problem(n, 3, 9, 4.0, 20 + n);  // far from converged
    const auto dx = run_unrolled<T>(p);
    for (int b = 0; b < p.batch; ++b) {
      const Mat ref = ref_unrolled_backward(matrix(p.x, b, n), matrix(p.g, b, n), n, p.iters);
      if (n == 1) {
        for (double v : matrix(dx, b, n)) EXPECT_EQ(v, 0.0);
        continue;
      }
      EXPECT_LT(rel_error(matrix(dx, b, n), ref), tol<T>(1e-11, 1e-5)) << "n=" << n;
    }
  }
}

// Rows offset by hundreds make the first iteration's exponentials underflow
// (its log-domain path); the reference runs in long double, whose exp()
// neither overflows nor underflows there.
TEST(Sinkhorn, UnrolledFiniteWhereFirstIterationUnderflows) {
  // The defect report: x = [[0, 0], [-800, -800]], g = [[1, 0], [0, 0]], 5 iterations.
  const std::vector<double> x{0, 0, -800, -800}, g{1, 0, 0, 0};
  auto X = batch_of<double>(x, 1, 2);
  auto G = batch_of<double>(g, 1, 2);
  Batch<double> dX("dX", 1, 2, 2);
  sk::backward_unrolled(Space(), X, G, dX, {5});
  const auto dx = to_host(dX);
  const Mat ref = ref_unrolled_backward<long double>(x, g, 2, 5);
  for (int e = 0; e < 4; ++e) {
    ASSERT_TRUE(std::isfinite(dx[e])) << "element " << e;
    EXPECT_NEAR(dx[e], ref[e], 1e-15) << "element " << e;
  }
}

TYPED_TEST(SinkhornTyped, UnrolledWithHugeRowOffsetsMatchesUnshiftedReference) {
  using T = TypeParam;
  const int n = 6, batch = 3, iters = 7;
  const auto z = uniform(std::size_t(batch) * n * n, -2.0, 2.0, 31);
  const auto g = normal(std::size_t(batch) * n * n, 32);
  std::vector<double> x(z.size());
  for (std::size_t e = 0; e < x.size(); ++e) {
    const double offset = (e / n) % 2 ? 400.0 : -400.0;  // by row
    x[e] = double(T(z[e] + offset));                     // as the kernel sees it
  }
  auto X = batch_of<T>(x, batch, n);
  auto G = batch_of<T>(g, batch, n);
  Batch<T> dX("dX", batch, n, n);
  sk::backward_unrolled(Space(), X, G, dX, {iters});
  const auto dx = to_host(dX);
  for (double v : dx) ASSERT_TRUE(std::isfinite(v));
  for (int b = 0; b < batch; ++b) {
    const Mat ref = ref_unrolled_backward<long double>(matrix(x, b, n), matrix(g, b, n), n, iters);
    EXPECT_LT(rel_error(matrix(dx, b, n), ref), tol<T>(1e-12, 1e-5)) << "b=" << b;
  }
}

TYPED_TEST(SinkhornTyped, ImplicitAndBlockMatchUnrolledWhenConverged) {
  using T = TypeParam;
  for (int n : {2, 3, 4, 8, 16}) {
    const auto p = make_problem(n, 6, 300, 4.0, 40 + n);
    const auto ref = run_unrolled<double>(p);
    CGReport cg;
    const auto implicit = run_backward<T>(p, {}, &cg);
    const auto block = run_backward<T>(p, with_method(sk::Method::block));
    EXPECT_LT(rel_error(implicit, ref), tol<T>(1e-10, 2e-5)) << "n=" << n;
    EXPECT_LT(rel_error(block, ref), tol<T>(1e-10, 2e-5)) << "n=" << n;
    // CG converged (the reported residual meets the default rtol) and did
    // so before its cap of 2n iterations.
    for (int b = 0; b < p.batch; ++b) {
      EXPECT_GE(cg.iterations[b], 1) << "n=" << n;
      EXPECT_LT(cg.iterations[b], 2 * n) << "n=" << n;
      EXPECT_LE(cg.residual[b], tol<T>(1e-12, 1e-6)) << "n=" << n;
    }
  }
}

TEST(Sinkhorn, AllBackwardsMatchFiniteDifferences) {
  const int n = 4, iters = 400;
  const auto p = make_problem(n, 3, iters, 3.0, 77);
  const auto implicit = run_backward<double>(p, {});
  const auto block = run_backward<double>(p, with_method(sk::Method::block));
  const auto unrolled = run_unrolled<double>(p);
  for (int b = 0; b < p.batch; ++b) {
    const Mat fd = finite_difference(matrix(p.x, b, n), matrix(p.g, b, n), n, iters, 1e-5);
    EXPECT_LT(rel_error(matrix(implicit, b, n), fd), 1e-7);
    EXPECT_LT(rel_error(matrix(block, b, n), fd), 1e-7);
    EXPECT_LT(rel_error(matrix(unrolled, b, n), fd), 1e-7);
  }
  // The unrolled backward also matches finite differences before convergence.
  const auto early = make_problem(n, 2, 3, 3.0, 78);
  const auto dx = run_unrolled<double>(early);
  for (int b = 0; b < early.batch; ++b) {
    const Mat fd = finite_difference(matrix(early.x, b, n), matrix(early.g, b, n), n, 3, 1e-5);
    EXPECT_LT(rel_error(matrix(dx, b, n), fd), 1e-7);
  }
}

TYPED_TEST(SinkhornTyped, GradientHasZeroRowAndColumnSums) {
  using T = TypeParam;
  const int n = 7;
  const auto p = make_problem(n, 4, 200, 4.0, 90);
  for (auto method : {sk::Method::implicit, sk::Method::block}) {
    const auto dx = run_backward<T>(p, with_method(method));
    double scale = 0;
    for (double v : dx) scale = std::max(scale, std::abs(v));
    for (int b = 0; b < p.batch; ++b)
      for (int k = 0; k < n; ++k) {
        double rs = 0, cs = 0;
        for (int l = 0; l < n; ++l) {
          rs += dx[(b * n + k) * n + l];
          cs += dx[(b * n + l) * n + k];
        }
        EXPECT_LT(std::abs(rs), tol<T>(1e-12, 1e-5) * scale);
        EXPECT_LT(std::abs(cs), tol<T>(1e-12, 1e-5) * scale);
      }
  }
}

TYPED_TEST(SinkhornTyped, RowPlusColumnGradientGivesZero) {
  using T = TypeParam;
  const int n = 5, batch = 3;
  auto p = make_problem(n, batch, 200, 4.0, 91);
  // G = a1ᵀ + 1bᵀ: L changes only by constants on the converged manifold.
  const auto a = normal(batch * n, 5), c = normal(batch * n, 6);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) p.g[(b * n + i) * n + j] = a[b * n + i] + c[b * n + j];
  for (auto method : {sk::Method::implicit, sk::Method::block}) {
    for (double v : run_backward<T>(p, with_method(method))) {
      EXPECT_LT(std::abs(v), tol<T>(1e-12, 1e-5));
    }
  }
}

sk::BackwardOptions with_marginals(sk::Method m, sk::Marginals marginals) {
  sk::BackwardOptions o = with_method(m);
  o.marginals = marginals;
  return o;
}

/// Largest |row or column sum| of each dX matrix, relative to its largest entry.
double max_relative_marginal(const std::vector<double>& dx, int batch, int n) {
  double worst = 0;
  for (int b = 0; b < batch; ++b) {
    const Mat m = matrix(dx, b, n);
    double scale = 0;
    for (double v : m) scale = std::max(scale, std::abs(v));
    for (int k = 0; k < n; ++k) {
      double rs = 0, cs = 0;
      for (int l = 0; l < n; ++l) {
        rs += m[k * n + l];
        cs += m[l * n + k];
      }
      worst = std::max({worst, std::abs(rs) / scale, std::abs(cs) / scale});
    }
  }
  return worst;
}

// The defect report: 20 iterations (what mHC models use) on logits of scale 5
// leave R unconverged; the implicit backward with unit marginals then solves
// an inconsistent system (max|dX| 4.92 against 0.0157 converged, with a CG
// residual that looked fine, or CG diverging). The default (measured
// marginals) stays well posed for both CG methods.
TYPED_TEST(SinkhornTyped, DefaultBackwardIsWellPosedOnUnconvergedR) {
  using T = TypeParam;
  const int n = 4, batch = 2000, iters = 20;
  Problem p{n, batch, iters, normal(std::size_t(batch) * n * n, 301),
            normal(std::size_t(batch) * n * n, 302)};
  for (double& v : p.x) v *= 5;
  Problem converged = p;
  converged.iters = 4000;
  const auto reference = run_unrolled<double>(converged);
  for (auto method : {sk::Method::implicit, sk::Method::block}) {
    SCOPED_TRACE(method == sk::Method::block ? "block" : "implicit");
    CGReport cg;
    const auto dx = run_backward<T>(p, with_method(method), &cg);
    double worst_marginal = 0;
    for (int b = 0; b < batch; ++b) {
      // CG reached its tolerance on every matrix (or stopped at a breakdown
      // at round-off level).
      EXPECT_LE(cg.residual[b], tol<T>(1e-10, 1e-4)) << "b=" << b;
      worst_marginal = std::max(worst_marginal, cg.marginal_error[b]);
      // Close to the converged gradient: the difference is of the order of
      // R's distance from convergence (measured up to 8 × marginal error ×
      // max|G|), where unit marginals gave differences 300× the gradient.
      const Mat d = matrix(dx, b, n), ref = matrix(reference, b, n), g = matrix(p.g, b, n);
      double diff = 0, gmax = 0;
      for (int e = 0; e < n * n; ++e) {
        diff = std::max(diff, std::abs(d[e] - ref[e]));
        gmax = std::max(gmax, std::abs(g[e]));
      }
      EXPECT_LE(diff, 10 * cg.marginal_error[b] * gmax + tol<T>(1e-12, 1e-4) * gmax) << "b=" << b;
    }
    EXPECT_GT(worst_marginal, 1e-2);  // the case is really unconverged
    if (sizeof(T) == 8) {
      EXPECT_LT(max_relative_marginal(dx, batch, n), 1e-10);
    } else {  // float: the same gradient as in double, to its precision
      const auto dx64 = run_backward<double>(p, with_method(method));
      EXPECT_LT(rel_error(dx, dx64), 1e-4);
    }
  }
}

TEST(Sinkhorn, ReportNamesUnconvergedRAndUnitMarginalsStayAvailable) {
  const int n = 6, batch = 4;
  const auto p = make_problem(n, batch, 3, 4.0, 92);  // 3 iterations: not converged
  const auto R = to_host(run_forward<double>(p));
  for (auto method : {sk::Method::implicit, sk::Method::block}) {
    CGReport measured, unit;
    const auto dx = run_backward<double>(p, with_method(method), &measured);
    run_backward<double>(p, with_marginals(method, sk::Marginals::unit), &unit);
    // Exact derivative of balancing to R's own marginals: zero row/col sums.
    EXPECT_LT(max_relative_marginal(dx, batch, n), 1e-12);
    for (int b = 0; b < batch; ++b) {
      const double expected = marginal_error(matrix(R, b, n), n);
      EXPECT_GT(expected, 1e-4);
      EXPECT_NEAR(measured.marginal_error[b], expected, 1e-15);
      EXPECT_NEAR(unit.marginal_error[b], expected, 1e-15);
    }
  }
  // On a converged R all four agree.
  const auto conv = make_problem(n, batch, 300, 4.0, 93);
  const auto ref = run_backward<double>(conv, {});
  for (auto method : {sk::Method::implicit, sk::Method::block}) {
    for (auto marginals : {sk::Marginals::measured, sk::Marginals::unit}) {
      EXPECT_LT(rel_error(run_backward<double>(conv, with_marginals(method, marginals)), ref),
                1e-10);
    }
  }
}

TEST(Sinkhorn, CGThatStopsShortIsReported) {
  const auto p = make_problem(8, 3, 300, 4.0, 95);
  sk::BackwardOptions o;
  o.max_iters = 1;
  CGReport cg;
  run_backward<double>(p, o, &cg);
  for (int b = 0; b < p.batch; ++b) {
    EXPECT_EQ(cg.iterations[b], 1);
    EXPECT_GT(cg.residual[b], 1e-6);
  }
}

// NaN in the input is carried into every statistic of the report (and into
// its summary), never reported as 0.
TEST(Sinkhorn, NaNInputGivesNaNInTheReport) {
  const int n = 4, batch = 3;
  auto p = make_problem(n, batch, 20, 4.0, 96);
  p.x[(1 * n + 2) * n + 3] = std::nan("");
  auto X = batch_of<double>(p.x, batch, n);
  auto G = batch_of<double>(p.g, batch, n);
  Batch<double> R("R", batch, n, n), dX("dX", batch, n, n);
  const auto fwd = Report::allocate(batch), bwd = Report::allocate(batch);
  sk::forward(Space(), X, R, {20}, fwd);
  sk::backward(Space(), R, G, dX, {}, bwd);
  const auto fe = to_host(fwd.marginal_error), be = to_host(bwd.marginal_error),
             res = to_host(bwd.residual);
  for (int b = 0; b < batch; ++b) {
    EXPECT_EQ(std::isnan(fe[b]), b == 1) << fe[b];
    EXPECT_EQ(std::isnan(be[b]), b == 1) << be[b];
    EXPECT_EQ(std::isnan(res[b]), b == 1) << res[b];
  }
  for (const auto& report : {fwd, bwd}) {
    const auto summary = sk::summarize(report);
    EXPECT_TRUE(std::isnan(summary.max_marginal_error));
  }
  EXPECT_TRUE(std::isnan(sk::summarize(bwd).max_residual));
  // A G with NaN poisons the residual of its matrix only.
  p = make_problem(n, batch, 20, 4.0, 97);
  p.g[(2 * n + 1) * n] = std::nan("");
  const auto clean_r = run_forward<double>(p);
  sk::backward(Space(), clean_r, batch_of<double>(p.g, batch, n), dX, {}, bwd);
  const auto res2 = to_host(bwd.residual);
  for (int b = 0; b < batch; ++b) EXPECT_EQ(std::isnan(res2[b]), b == 2) << res2[b];
}

TEST(Sinkhorn, SummaryIsTheMaximumOverTheBatch) {
  const auto report = Report::allocate(3);
  const auto it = Kokkos::create_mirror_view(report.iterations);
  const auto me = Kokkos::create_mirror_view(report.marginal_error);
  const auto re = Kokkos::create_mirror_view(report.residual);
  for (int b = 0; b < 3; ++b) {
    it(b) = 10 - b;
    me(b) = 0.5 * b;
    re(b) = b == 1 ? 3.0 : 1e-8;
  }
  Kokkos::deep_copy(report.iterations, it);
  Kokkos::deep_copy(report.marginal_error, me);
  Kokkos::deep_copy(report.residual, re);
  const auto s = sk::summarize(report);
  EXPECT_EQ(s.max_iterations, 10);
  EXPECT_EQ(s.max_marginal_error, 1.0);
  EXPECT_EQ(s.max_residual, 3.0);
  const auto empty = sk::summarize(Report{});
  EXPECT_EQ(empty.max_iterations, 0);
  EXPECT_EQ(empty.max_marginal_error, 0.0);
}

}  // namespace
