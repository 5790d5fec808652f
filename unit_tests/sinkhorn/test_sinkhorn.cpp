// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Sinkhorn forward and the three backwards against independent double
// references (plain loops, reverse mode through stored iterates, finite
// differences), invariants, edge cases and every validation error.
#include <cmath>
#include <limits>

#include "kdnn/core/impl/backend_traits.hpp"
#include "sinkhorn_test_util.hpp"

namespace {

using namespace kdnn_test;
namespace sk = kdnn::sinkhorn;

template <class T>
class SinkhornTyped : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SinkhornTyped, Types);

// ---- forward -------------------------------------------------------------

TYPED_TEST(SinkhornTyped, ForwardMatchesPlainFormula) {
  using T = TypeParam;
  for (int n : {1, 2, 3, 4, 7, 16}) {
    const int batch = 5, iters = 20;
    const auto x = uniform(std::size_t(batch) * n * n, 0.0, 4.0, 11 + n);
    auto X = batch_of<T>(x, batch, n);
    Batch<T> R("R", batch, n, n);
    sk::forward(Space(), X, R, {iters});
    expect_plain_formula(to_host(R), x, batch, n, iters, tol<T>(1e-13, 2e-6));
  }
}

TYPED_TEST(SinkhornTyped, ForwardLargeMagnitudeStaysFinite) {
  using T = TypeParam;
  const int n = 8, batch = 4, iters = 30;
  auto x = uniform(std::size_t(batch) * n * n, -80.0, 80.0, 3);
  // Matrix 1: one row of −80 among +80s; exp() of it underflows against the
  // rest in float32, where the plain formula produces 0/0.
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) x[(n + i) * n + j] = i == 2 ? -80.0 : 80.0;
  // Matrix 2: a single column of +80 among −80s.
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) x[(2 * n + i) * n + j] = j == 5 ? 80.0 : -80.0;
  auto X = batch_of<T>(x, batch, n);
  Batch<T> R("R", batch, n, n);
  sk::forward(Space(), X, R, {iters});
  const auto r = to_host(R);
  for (double v : r) ASSERT_TRUE(std::isfinite(v));
  for (int b = 0; b < batch; ++b) {
    // The double plain formula is finite for |X| <= 80.
    EXPECT_LT(rel_error(matrix(r, b, n), ref_forward(matrix(x, b, n), n, iters)),
              tol<T>(1e-12, 1e-5))
        << "b=" << b;
  }
}

TYPED_TEST(SinkhornTyped, ForwardHugeRowAndColumnOffsetsGiveUniform) {
  // X_ij = a_i + c_j balances to R = 11ᵀ/n exactly, whatever the offsets.
  // With |a_i| far beyond exp's range the plain formula gives 0/0; rows of
  // exp(X − column max) underflow even in double, which takes the log-domain
  // path of the first iteration.
  using T = TypeParam;
  const int n = 6, batch = 3;
  const double big = sizeof(T) == 8 ? 400.0 : 1e4;
  const auto c = uniform(batch * n, -0.75 * big, 0.75 * big, 21);
  std::vector<double> x(std::size_t(batch) * n * n);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)  // integers: X is exact in float too
        x[(b * n + i) * n + j] = (i % 2 ? big : -big) + std::round(c[b * n + j]);
  auto X = batch_of<T>(x, batch, n);
  Batch<T> R("R", batch, n, n);
  sk::forward(Space(), X, R, {5});
  for (double v : to_host(R)) EXPECT_NEAR(v, 1.0 / n, tol<T>(1e-12, 1e-6));
}

// docs/sinkhorn.md promises any finite X: rows of constant ±DBL_MAX-scale values
// (whose differences overflow) balance to 11ᵀ/n like any X_ij = a_i + c_j, and
// the gradient is the one at offsets ±400, where e^{−800} is already below
// double precision (reference in long double).
TYPED_TEST(SinkhornTyped, ExtremeFiniteValuesAreSafe) {
  using T = TypeParam;
  const int n = 4, batch = 3, iters = 6;
  const double huge = double(std::numeric_limits<T>::max());
  const double offsets[batch][n] = {{huge, -huge, huge, -huge},
                                    {1e308 < huge ? 1e308 : huge / 2, -huge / 3, 0, huge},
                                    {-huge, -huge, -huge, huge}};
  const auto g = normal(std::size_t(batch) * n * n, 33);
  std::vector<double> x(std::size_t(batch) * n * n);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) x[(b * n + i) * n + j] = offsets[b][i];
  for (auto order : {sk::Order::columns_first, sk::Order::rows_first}) {
    sk::ForwardOptions o{iters};
    o.order = order;
    std::vector<double> xs = x;
    if (order == sk::Order::rows_first) {  // offsets by column instead
      for (int b = 0; b < batch; ++b)
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < n; ++j) xs[(b * n + i) * n + j] = x[(b * n + j) * n + i];
    }
    auto X = batch_of<T>(xs, batch, n);
    Batch<T> R("R", batch, n, n), dX("dX", batch, n, n);
    sk::forward(Space(), X, R, o);
    for (double v : to_host(R)) EXPECT_NEAR(v, 1.0 / n, tol<T>(1e-15, 1e-7));
    sk::backward_unrolled(Space(), X, batch_of<T>(g, batch, n), dX, o);
    const auto dx = to_host(dX);
    for (double v : dx) ASSERT_TRUE(std::isfinite(v));
    if (order == sk::Order::rows_first) continue;
    for (int b = 0; b < batch; ++b) {
      // The same matrix with every offset replaced by 0 or ±400.
      Mat m(n * n);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j)
          m[i * n + j] = offsets[b][i] == 0 ? 0 : (offsets[b][i] > 0 ? 400.0 : -400.0);
      const Mat ref = ref_unrolled_backward<long double>(m, matrix(g, b, n), n, iters);
      EXPECT_LT(rel_error(matrix(dx, b, n), ref), tol<T>(1e-12, 1e-5)) << "b=" << b;
    }
  }
}

TEST(Sinkhorn, ForwardToleranceStopsEarlyAndReports) {
  const int n = 6, batch = 7, iters = 500;
  const auto x = uniform(std::size_t(batch) * n * n, 0.0, 4.0, 5);
  auto X = batch_of<double>(x, batch, n);
  Batch<double> R("R", batch, n, n);
  const auto report = Report::allocate(batch);
  const double tolerance = 1e-9;
  sk::forward(Space(), X, R, {iters, tolerance}, report);
  const auto used = to_host(report.iterations);
  const auto err = to_host(report.marginal_error);
  const auto r = to_host(R);
  for (int b = 0; b < batch; ++b) {
    EXPECT_GE(used[b], 1);
    EXPECT_LT(used[b], iters);
    EXPECT_LE(err[b], tolerance);
    // Same result as the plain formula run for the reported iterations.
    const int k = int(used[b]);
    EXPECT_LT(rel_error(matrix(r, b, n), ref_forward(matrix(x, b, n), n, k)), 1e-13);
    // The reported error is the largest |row or column sum − 1| of the
    // returned R.
    EXPECT_NEAR(err[b], marginal_error(matrix(r, b, n), n), 1e-14);
    // One iteration fewer would not have met the tolerance.
    const Mat prev = ref_forward(matrix(x, b, n), n, k - 1);
    double e_prev = 0;
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int i = 0; i < n; ++i) s += prev[i * n + j];
      e_prev = std::max(e_prev, std::abs(s - 1));
    }
    if (k > 1) {
      EXPECT_GT(e_prev, tolerance);
    }
  }
}

TEST(Sinkhorn, ForwardReportsAllIterationsWithoutTolerance) {
  const int n = 3, batch = 2;
  auto X = batch_of<double>(uniform(batch * n * n, 0, 1, 9), batch, n);
  Batch<double> R("R", batch, n, n);
  Report report{Kokkos::View<int*, Space::memory_space>("it", batch), {}};
  sk::forward(Space(), X, R, {17}, report);
  for (double v : to_host(report.iterations)) EXPECT_EQ(v, 17);
}

// ---- backward ------------------------------------------------------------

struct Problem {
  int n, batch, iters;
  std::vector<double> x, g;
};

Problem make_problem(int n, int batch, int iters, double spread, unsigned seed) {
  return {n, batch, iters, uniform(std::size_t(batch) * n * n, 0.0, spread, seed),
          normal(std::size_t(batch) * n * n, seed + 1)};
}

/// Per-matrix CG diagnostics of a backward.
struct CGReport {
  std::vector<double> iterations, residual, marginal_error;
};

template <class T>
std::vector<double> run_backward(const Problem& p, sk::BackwardOptions opts,
                                 CGReport* cg = nullptr) {
  auto X = batch_of<T>(p.x, p.batch, p.n);
  auto G = batch_of<T>(p.g, p.batch, p.n);
  Batch<T> R("R", p.batch, p.n, p.n), dX("dX", p.batch, p.n, p.n);
  sk::forward(Space(), X, R, {p.iters});
  const auto report = Report::allocate(p.batch);
  sk::backward(Space(), R, G, dX, opts, report);
  if (cg) {
    *cg = {to_host(report.iterations), to_host(report.residual), to_host(report.marginal_error)};
  }
  return to_host(dX);
}

template <class T>
Batch<T> run_forward(const Problem& p) {
  Batch<T> R("R", p.batch, p.n, p.n);
  sk::forward(Space(), batch_of<T>(p.x, p.batch, p.n), R, {p.iters});
  return R;
}

template <class T>
std::vector<double> run_unrolled(const Problem& p) {
  auto X = batch_of<T>(p.x, p.batch, p.n);
  auto G = batch_of<T>(p.g, p.batch, p.n);
  Batch<T> dX("dX", p.batch, p.n, p.n);
  sk::backward_unrolled(Space(), X, G, dX, {p.iters});
  return to_host(dX);
}

sk::BackwardOptions with_method(sk::Method m) {
  sk::BackwardOptions o;
  o.method = m;
  return o;
}

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

// ---- order and eps (TransformerEngine's and TileKernels' semantics) ---------

sk::ForwardOptions variant_options(int iters, const Variant& v) {
  sk::ForwardOptions o;
  o.iters = iters;
  o.order = v.rows_first ? sk::Order::rows_first : sk::Order::columns_first;
  o.eps = v.eps;
  return o;
}

const Variant kVariants[] = {{false, 0}, {true, 0}, {false, 1e-6}, {true, 1e-6}, {true, 0.05}};

TYPED_TEST(SinkhornTyped, OrderAndEpsMatchThePlainFormula) {
  using T = TypeParam;
  for (const Variant& v : kVariants) {
    for (int n : {1, 2, 4, 8}) {
      for (int iters : {1, 2, 10}) {
        SCOPED_TRACE("rows_first=" + std::to_string(v.rows_first) +
                     " eps=" + std::to_string(v.eps) + " n=" + std::to_string(n) +
                     " iters=" + std::to_string(iters));
        const auto p = make_problem(n, 3, iters, 4.0, 200 + n + iters);
        auto X = batch_of<T>(p.x, p.batch, n);
        auto G = batch_of<T>(p.g, p.batch, n);
        Batch<T> R("R", p.batch, n, n), dX("dX", p.batch, n, n);
        sk::forward(Space(), X, R, variant_options(iters, v));
        sk::backward_unrolled(Space(), X, G, dX, variant_options(iters, v));
        const auto r = to_host(R), dx = to_host(dX);
        for (int b = 0; b < p.batch; ++b) {
          const Mat x = matrix(p.x, b, n), g = matrix(p.g, b, n);
          EXPECT_LT(rel_error(matrix(r, b, n), ref_forward(x, n, iters, v)), tol<T>(1e-13, 2e-6));
          const Mat ref = ref_unrolled_backward(x, g, n, iters, v);
          if (n == 1) {  // R = 1 (or a constant with eps): dX = 0
            for (double e : matrix(dx, b, n)) EXPECT_NEAR(e, 0.0, 1e-12);
          } else {
            EXPECT_LT(rel_error(matrix(dx, b, n), ref), tol<T>(1e-11, 1e-5));
          }
        }
      }
    }
  }
}

TEST(Sinkhorn, RowsFirstIsColumnsFirstOnTheTranspose) {
  const int n = 5, batch = 4, iters = 7;
  const auto p = make_problem(n, batch, iters, 4.0, 210);
  std::vector<double> xt(p.x.size()), gt(p.g.size());
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        xt[(b * n + j) * n + i] = p.x[(b * n + i) * n + j];
        gt[(b * n + j) * n + i] = p.g[(b * n + i) * n + j];
      }
  Batch<double> R("R", batch, n, n), Rt("Rt", batch, n, n), dX("dX", batch, n, n),
      dXt("dXt", batch, n, n);
  sk::ForwardOptions rows = variant_options(iters, {true, 1e-3});
  sk::ForwardOptions cols = variant_options(iters, {false, 1e-3});
  sk::forward(Space(), batch_of<double>(p.x, batch, n), R, rows);
  sk::forward(Space(), batch_of<double>(xt, batch, n), Rt, cols);
  sk::backward_unrolled(Space(), batch_of<double>(p.x, batch, n), batch_of<double>(p.g, batch, n),
                        dX, rows);
  sk::backward_unrolled(Space(), batch_of<double>(xt, batch, n), batch_of<double>(gt, batch, n),
                        dXt, cols);
  const auto r = to_host(R), rt = to_host(Rt), dx = to_host(dX), dxt = to_host(dXt);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        EXPECT_EQ(r[(b * n + i) * n + j], rt[(b * n + j) * n + i]);
        EXPECT_EQ(dx[(b * n + i) * n + j], dxt[(b * n + j) * n + i]);
      }
}

TEST(Sinkhorn, UnrolledWithEpsMatchesFiniteDifferences) {
  const int n = 4, iters = 6;
  const auto p = make_problem(n, 2, iters, 3.0, 211);
  for (const Variant& v : kVariants) {
    Batch<double> dX("dX", p.batch, n, n);
    sk::backward_unrolled(Space(), batch_of<double>(p.x, p.batch, n),
                          batch_of<double>(p.g, p.batch, n), dX, variant_options(iters, v));
    const auto dx = to_host(dX);
    for (int b = 0; b < p.batch; ++b) {
      const Mat fd = finite_difference(matrix(p.x, b, n), matrix(p.g, b, n), n, iters, 1e-5, v);
      EXPECT_LT(rel_error(matrix(dx, b, n), fd), 1e-8) << "eps=" << v.eps;
    }
  }
}

// What the launch may change (sinkhorn.hpp, Launch): nothing, except
// that on a GPU the vector length reorders the CG's dot products across lanes.
TYPED_TEST(SinkhornTyped, ResultsDoNotDependOnLaunchShape) {
  using T = TypeParam;
  constexpr bool host = kdnn::impl::BackendTraits<Space>::is_host;
  const int n = 5;
  const auto p = make_problem(n, 11, 50, 4.0, 94);
  auto X = batch_of<T>(p.x, p.batch, n);
  auto G = batch_of<T>(p.g, p.batch, n);
  struct Results {
    std::vector<double> exact;  // forward R and unrolled dX: bitwise on every backend
    std::vector<double> cg;     // implicit and block dX
  };
  auto run = [&](sk::Launch launch) {
    Batch<T> R("R", p.batch, n, n), dX("dX", p.batch, n, n), dXb("dXb", p.batch, n, n),
        dXu("dXu", p.batch, n, n);
    sk::ForwardOptions f{p.iters};
    f.launch = launch;
    sk::forward(Space(), X, R, f);
    sk::BackwardOptions o;
    o.launch = launch;
    sk::backward(Space(), R, G, dX, o);
    o.method = sk::Method::block;
    sk::backward(Space(), R, G, dXb, o);
    sk::backward_unrolled(Space(), X, G, dXu, f);
    Results r{to_host(R), to_host(dX)};
    const auto u = to_host(dXu), b = to_host(dXb);
    r.exact.insert(r.exact.end(), u.begin(), u.end());
    r.cg.insert(r.cg.end(), b.begin(), b.end());
    return r;
  };
  const Results ref = run({});
  for (int tile : {1, 2, 3, 4, 11, 16}) {
    for (int vector_length : {0, 1, 4, 8}) {
      sk::Launch l;
      l.tile = tile;
      l.vector_length = vector_length;
      SCOPED_TRACE("tile=" + std::to_string(tile) +
                   " vector_length=" + std::to_string(vector_length));
      const Results got = run(l);
      EXPECT_EQ(got.exact, ref.exact);
      if (host || vector_length == 0) {
        EXPECT_EQ(got.cg, ref.cg);
      } else {
        EXPECT_LT(rel_error(got.cg, ref.cg), tol<T>(1e-12, 1e-5));
      }
    }
  }
  // Team sizes beyond what the backend allows are a kdnn::Error (Serial: 1).
  for (int team_size : {1, 2, 4}) {
    sk::Launch l;
    l.tile = 4;
    l.team_size = team_size;
    Results got;
    const std::string err = error_of([&] { got = run(l); });
    if (team_size == 1) {
      EXPECT_EQ(err, "");
    }
    if (err.empty()) {
      EXPECT_EQ(got.exact, ref.exact) << "team_size=" << team_size;
      EXPECT_EQ(got.cg, ref.cg) << "team_size=" << team_size;
    } else {
      EXPECT_NE(err.find("launch.team_size="), std::string::npos) << err;
    }
  }
}

// ---- edge cases ----------------------------------------------------------

TYPED_TEST(SinkhornTyped, SizeOneIsIdentity) {
  using T = TypeParam;
  const auto p = make_problem(1, 4, 10, 50.0, 95);
  auto X = batch_of<T>(p.x, 4, 1);
  Batch<T> R("R", 4, 1, 1);
  sk::forward(Space(), X, R, {10});
  for (double v : to_host(R)) EXPECT_EQ(v, 1.0);
  for (double v : run_backward<T>(p, {})) EXPECT_EQ(v, 0.0);
  for (double v : run_backward<T>(p, with_method(sk::Method::block))) EXPECT_EQ(v, 0.0);
}

TEST(Sinkhorn, SizeTwoMatchesClosedForm) {
  // For n = 2 the converged R is [[s, 1−s], [1−s, s]] with
  // s/(1−s) = sqrt(P00 P11 / (P01 P10)), i.e. s = σ((x00 + x11 − x01 − x10)/2).
  const auto p = make_problem(2, 5, 200, 3.0, 96);
  auto X = batch_of<double>(p.x, 5, 2);
  Batch<double> R("R", 5, 2, 2);
  sk::forward(Space(), X, R, {200});
  const auto r = to_host(R);
  for (int b = 0; b < 5; ++b) {
    const double* x = &p.x[b * 4];
    const double s = 1 / (1 + std::exp(-(x[0] + x[3] - x[1] - x[2]) / 2));
    EXPECT_NEAR(r[b * 4 + 0], s, 1e-12);
    EXPECT_NEAR(r[b * 4 + 1], 1 - s, 1e-12);
  }
}

TEST(Sinkhorn, EmptyBatchIsANoOp) {
  Batch<float> X("X", 0, 4, 4), R("R", 0, 4, 4), G("G", 0, 4, 4), dX("dX", 0, 4, 4);
  Report report{Kokkos::View<int*, Space::memory_space>("it", 0), {}};
  EXPECT_NO_THROW(sk::forward(Space(), X, R, {}, report));
  EXPECT_NO_THROW(sk::backward(Space(), R, G, dX, {}, report));
  EXPECT_NO_THROW(sk::backward_unrolled(Space(), X, G, dX, {}));
}

TEST(Sinkhorn, BadlyConditionedNeedsMoreIterationsButConverges) {
  // A large spread of X pushes σ₂(R) towards 1: CG needs more iterations.
  const int n = 16, iters = 3000;
  const auto easy = make_problem(n, 8, iters, 1.0, 97);
  const auto hard = make_problem(n, 8, iters, 12.0, 97);
  CGReport cg_easy, cg_hard;
  run_backward<double>(easy, {}, &cg_easy);
  const auto dx = run_backward<double>(hard, {}, &cg_hard);
  const auto& it_easy = cg_easy.iterations;
  const auto& it_hard = cg_hard.iterations;
  EXPECT_LT(rel_error(dx, run_unrolled<double>(hard)), 1e-10);
  double max_easy = 0, min_hard = 1e9;
  for (double v : it_easy) max_easy = std::max(max_easy, v);
  for (double v : it_hard) min_hard = std::min(min_hard, v);
  EXPECT_GT(min_hard, max_easy);
}

// ---- execution spaces ----------------------------------------------------

// An execution space libkdnn does not instantiate (core/impl/eti.hpp) works
// through the definitions its headers include: the same results as the
// default space.
TEST(Sinkhorn, OtherExecutionSpaceInstantiatesFromHeaders) {
#ifdef KOKKOS_ENABLE_SERIAL
  if constexpr (std::is_same_v<Kokkos::Serial, Space> ||
                std::is_same_v<Kokkos::Serial, Kokkos::DefaultHostExecutionSpace>) {
    GTEST_SKIP() << "Kokkos::Serial is instantiated in libkdnn in this build";
  } else {
    using Other = Kokkos::Serial;
    using OtherBatch = sk::Batch<double, Other>;
    const auto p = make_problem(5, 3, 40, 4.0, 98);
    OtherBatch X("X", 3, 5, 5), G("G", 3, 5, 5), R("R", 3, 5, 5), dX("dX", 3, 5, 5);
    std::copy(p.x.begin(), p.x.end(), X.data());
    std::copy(p.g.begin(), p.g.end(), G.data());
    sk::forward(Other(), X, R, {p.iters});
    sk::backward(Other(), R, G, dX);
    Other().fence();
    EXPECT_ALLCLOSE(to_host(R), to_host(run_forward<double>(p)), 1e-14, 0.0);
    EXPECT_ALLCLOSE(to_host(dX), run_backward<double>(p, {}), 1e-10, 1e-14);
  }
#else
  GTEST_SKIP() << "Kokkos::Serial is not enabled";
#endif
}

// ---- validation ------------------------------------------------------------

TEST(Sinkhorn, ValidationErrors) {
  Batch<float> X("X", 2, 4, 4), R("R", 2, 4, 4), G("G", 2, 4, 4), dX("dX", 2, 4, 4);
  Batch<float> wrong_n("w", 2, 5, 5), wrong_b("wb", 3, 4, 4), rect("rect", 2, 4, 5);
  EXPECT_KDNN_ERROR(
      sk::forward(Space(), rect, R),
      "sinkhorn::forward: X must be a batch of square matrices [B, n, n], got [2, 4, 5]");
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, wrong_n),
                    "sinkhorn::forward: R has extent(1)=5, expected 4 (same as X)");
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, wrong_b), "R has extent(0)=3, expected 2 (same as X)");
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, X), "output R overlaps input X");
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, R, {0}), "iters=0, expected a value in [1, ");
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, R, {10, -1.0}), "tol=-1, expected a finite value >= 0");
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, R, {10, std::nan("")}), "tol=nan");
  sk::ForwardOptions f;
  f.eps = -1e-3;
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, R, f), "eps=-0.001, expected a value in [0, 1]");
  f.eps = std::nan("");
  EXPECT_KDNN_ERROR(sk::backward_unrolled(Space(), X, G, dX, f),
                    "eps=nan, expected a value in [0, 1]");
  Batch<float> X0("X0", 2, 0, 0), R0("R0", 2, 0, 0);
  EXPECT_KDNN_ERROR(sk::forward(Space(), X0, R0),
                    "sinkhorn::forward: X has shape [2, 0, 0], expected n >= 1");
  EXPECT_KDNN_ERROR(sk::backward(Space(), X0, X0, R0),
                    "sinkhorn::backward: R has shape [2, 0, 0], expected n >= 1");
  // A report written over an operand would corrupt it.
  Kokkos::View<double*, Space::memory_space> over_x(reinterpret_cast<double*>(X.data()), 2);
  Report aliased;
  aliased.marginal_error = over_x;
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, R, {}, aliased),
                    "output report.marginal_error overlaps input X");
  Report aliased_it;
  aliased_it.iterations =
      Kokkos::View<int*, Space::memory_space>(reinterpret_cast<int*>(R.data()), 2);
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, {}, aliased_it),
                    "output report.iterations overlaps input R");
  Report aliased_res;
  aliased_res.residual =
      Kokkos::View<double*, Space::memory_space>(reinterpret_cast<double*>(dX.data()) + 3, 2);
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, {}, aliased_res),
                    "output report.residual overlaps input dX");
  Report self = Report::allocate(2);
  self.residual = self.marginal_error;
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, {}, self),
                    "report.marginal_error overlaps input report.residual");
  Report bad{Kokkos::View<int*, Space::memory_space>("it", 3), {}};
  EXPECT_KDNN_ERROR(sk::forward(Space(), X, R, {}, bad),
                    "report.iterations has extent(0)=3, expected 2 (batch size)");
  Report bad_err;
  bad_err.residual = Kokkos::View<double*, Space::memory_space>("e", 1);
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, {}, bad_err),
                    "report.residual has extent(0)=1, expected 2");

  EXPECT_KDNN_ERROR(sk::backward(Space(), R, wrong_n, dX),
                    "sinkhorn::backward: G has extent(1)=5, expected 4 (same as R)");
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, wrong_b),
                    "sinkhorn::backward: dX has extent(0)=3, expected 2 (same as R)");
  EXPECT_KDNN_ERROR(sk::backward(Space(), rect, G, dX),
                    "sinkhorn::backward: R must be a batch of square matrices");
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, G), "output dX overlaps input G");
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, R), "output dX overlaps input R");
  sk::BackwardOptions o;
  o.rtol = 1.5;
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, o), "rtol=1.5, expected a value in [0, 1)");
  o = {};
  o.max_iters = -2;
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, o), "max_iters=-2, expected >= 0");
  o = {};
  o.launch.tile = -1;
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, o), "launch.tile=-1, expected >= 0");
  o = {};
  o.launch.vector_length = 3;
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, o),
                    "launch.vector_length=3, expected a power of two");
  o = {};
  o.launch.team_size = 100000;
  EXPECT_KDNN_ERROR(sk::backward(Space(), R, G, dX, o),
                    "launch.team_size=100000, expected at most");

  EXPECT_KDNN_ERROR(sk::backward_unrolled(Space(), X, wrong_n, dX),
                    "sinkhorn::backward_unrolled: G has extent(1)=5, expected 4 (same as X)");
  EXPECT_KDNN_ERROR(sk::backward_unrolled(Space(), X, G, X), "output dX overlaps input X");
  EXPECT_KDNN_ERROR(sk::backward_unrolled(Space(), X, G, dX, {10, 1e-6}), "tol=1e-06, expected 0");
  EXPECT_KDNN_ERROR(sk::backward_unrolled(Space(), X, G, dX, {-3}), "iters=-3");
}

TEST(Sinkhorn, TooLargeForScratchIsAClearError) {
  // The limit of a default launch: level 1's on a host, the team workspace's
  // budget on a GPU.
  const char* what = nullptr;
  const std::size_t limit =
      kdnn::impl::scratch_limit<Space>(kdnn::impl::is_gpu_launch<Space>(kdnn::Launch{}), what);
  // Smallest power-of-two n whose working set exceeds it.
  sk::impl::CGBackwardKernel<Space, double> cg;
  cg.n = 1;
  while (cg.matrix_bytes() <= limit) cg.n *= 2;
  const int n = cg.n;
  Batch<double> R1(Kokkos::view_alloc(Kokkos::WithoutInitializing, "R1"), 1, n, n);
  Batch<double> G1(Kokkos::view_alloc(Kokkos::WithoutInitializing, "G1"), 1, n, n);
  Batch<double> dX1(Kokkos::view_alloc(Kokkos::WithoutInitializing, "dX1"), 1, n, n);
  EXPECT_KDNN_ERROR(sk::backward(Space(), R1, G1, dX1),
                    "bytes of team scratch per matrix, above the");
  EXPECT_KDNN_ERROR(sk::backward(Space(), R1, G1, dX1), "n=" + std::to_string(n));
  EXPECT_KDNN_ERROR(sk::forward(Space(), R1, dX1), "bytes of team scratch per matrix, above the");
  // The unrolled backward keeps 2n sums per iteration: a huge iteration
  // count is refused the same way.
  Batch<double> X4("X4", 1, 4, 4), G4("G4", 1, 4, 4), dX4("dX4", 1, 4, 4);
  sk::impl::UnrolledBackwardKernel<Space, double> unrolled;
  unrolled.n = 4;
  unrolled.iters = 2;
  while (unrolled.matrix_bytes() <= limit) unrolled.iters *= 2;
  const int iters = unrolled.iters;
  EXPECT_KDNN_ERROR(sk::backward_unrolled(Space(), X4, G4, dX4, {iters}),
                    "sinkhorn::backward_unrolled: n=4 needs");
  // check_backward_unrolled refuses it the same way before anything runs
  // (an autograd forward asks it first), and passes what the backward runs.
  EXPECT_KDNN_ERROR(sk::check_backward_unrolled(Space(), X4, {iters}),
                    "sinkhorn::backward_unrolled: n=4 needs");
  EXPECT_NO_THROW(sk::check_backward_unrolled(Space(), X4, {iters / 2}));
  EXPECT_NO_THROW(sk::backward_unrolled(Space(), X4, G4, dX4, {iters / 2}));
  EXPECT_KDNN_ERROR(sk::check_backward_unrolled(Space(), X4, {10, 1e-6}), "tol=1e-06, expected 0");
  EXPECT_NO_THROW(sk::check_backward_unrolled(Space(), Batch<double>("X0", 0, 4, 4), {iters}));
}

}  // namespace
