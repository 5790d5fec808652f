// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Sinkhorn forward against independent double references (plain loops,
// reverse mode through stored iterates), the order and eps of
// TransformerEngine and TileKernels, results that do not depend on the
// launch shape, edge cases, and another execution space. The backwards:
// test_sinkhorn_backward.cpp; validation errors: test_sinkhorn_validation.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kdnn/core/impl/backend_traits.hpp"
#include "sinkhorn_problems.hpp"
#include "sinkhorn_test_util.hpp"

namespace {

using namespace kdnn_test;
namespace sk = kdnn::sinkhorn;

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

}  // namespace
