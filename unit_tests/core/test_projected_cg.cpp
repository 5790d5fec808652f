// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Projected CG (core/impl/projected_cg.hpp) on one thread's loops, against
// systems built here: A = P MᵀM P with P the projector onto w⊥, whose null
// space is span{w} (w = 1, and w = [1; −1] as in the block system). CG must
// solve A x = P b to its tolerance with x in w⊥; a right-hand side along w
// alone is already solved (no step, x = 0); the folded norm Σr² − σ²/m,
// which rounding can take below zero, never makes the reported residual NaN,
// not even run to rounding; NaN in b is reported as NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kdnn/core/impl/projected_cg.hpp"
#include "random.hpp"

namespace {

namespace ki = kdnn::impl;

constexpr int M = 8;

double w_of(int k, int split) { return k < split ? 1.0 : -1.0; }

/// A = P MᵀM P, P = I − w wᵀ / M, for a random M×M matrix.
std::vector<double> singular_system(int split, unsigned seed) {
  const auto m = kdnn_test::uniform(M * M, -1.0, 1.0, seed);
  std::vector<double> mtm(M * M, 0.0), p(M * M), pa(M * M, 0.0), a(M * M, 0.0);
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < M; ++j) {
      for (int k = 0; k < M; ++k) mtm[i * M + j] += m[k * M + i] * m[k * M + j];
      p[i * M + j] = (i == j ? 1.0 : 0.0) - w_of(i, split) * w_of(j, split) / M;
    }
  }
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < M; ++j) {
      for (int k = 0; k < M; ++k) pa[i * M + j] += p[i * M + k] * mtm[k * M + j];
    }
  }
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < M; ++j) {
      for (int k = 0; k < M; ++k) a[i * M + j] += pa[i * M + k] * p[k * M + j];
    }
  }
  return a;
}

struct Solve {
  ki::CGResult result;
  std::vector<double> x;
};

/// out = A·in for a dense M×M A (a host and device function, as
/// projected_cg is).
template <class T>
struct DenseProduct {
  const double* a;
  KOKKOS_INLINE_FUNCTION void operator()(const T* in, T* out) const {
    for (int i = 0; i < M; ++i) {
      T s = 0;
      for (int j = 0; j < M; ++j) s += T(a[i * M + j]) * in[j];
      out[i] = s;
    }
  }
};

template <class T>
Solve solve(const std::vector<double>& a, const std::vector<double>& b, int split, double rtol) {
  T x[M], r[M], p[M], ap[M];
  for (int k = 0; k < M; ++k) r[k] = T(b[k]);
  const DenseProduct<T> apply{a.data()};
  Solve out;
  out.result = ki::projected_cg(ki::ThreadLoops<M>{}, split, rtol, 100, x, r, p, ap, apply);
  out.x.assign(x, x + M);
  return out;
}

TEST(ProjectedCG, SolvesTheSystemOnTheComplementOfItsNullSpace) {
  unsigned seed = 1;
  for (int split : {M, M / 2}) {
    SCOPED_TRACE("split=" + std::to_string(split));
    const auto a = singular_system(split, seed++);
    auto b = kdnn_test::uniform(M, -1.0, 1.0, seed++);
    for (int k = 0; k < M; ++k) b[k] += 5.0 * w_of(k, split);  // a large part along w
    double along = 0;
    for (int k = 0; k < M; ++k) along += w_of(k, split) * b[k] / M;
    const auto s = solve<double>(a, b, split, 1e-12);
    EXPECT_GT(s.result.iterations, 0);
    EXPECT_LE(s.result.relative_residual, 1e-12);
    double residual = 0, norm = 0, x_along = 0;
    for (int i = 0; i < M; ++i) {
      double ax = 0;
      for (int j = 0; j < M; ++j) ax += a[i * M + j] * s.x[j];
      const double pb = b[i] - along * w_of(i, split);
      residual += (ax - pb) * (ax - pb);
      norm += pb * pb;
      x_along += w_of(i, split) * s.x[i];
    }
    EXPECT_LE(std::sqrt(residual), 1e-9 * std::sqrt(norm));
    EXPECT_LE(std::fabs(x_along), 1e-12);
  }
}

template <class T>
void check_null_space_rhs() {
  for (int split : {M, M / 2}) {
    const auto a = singular_system(split, 7);
    std::vector<double> b(M);
    for (int k = 0; k < M; ++k) b[k] = 3.0 * w_of(k, split);
    const auto s = solve<T>(a, b, split, 1e-6);
    EXPECT_EQ(s.result.iterations, 0);
    EXPECT_EQ(s.result.relative_residual, 0.0);
    for (int k = 0; k < M; ++k) EXPECT_EQ(s.x[k], 0.0);
    // Not exactly along w in T: what is left is rounding, and the folded
    // norm of it (which can round below zero) must stay a number.
    for (double c : {0.1, -1.0 / 3.0, 1e-30}) {
      for (int k = 0; k < M; ++k) b[k] = c * w_of(k, split);
      const auto t = solve<T>(a, b, split, 1e-6);
      EXPECT_FALSE(std::isnan(t.result.relative_residual)) << "c=" << c;
      for (int k = 0; k < M; ++k) EXPECT_TRUE(std::isfinite(t.x[k])) << "c=" << c;
    }
  }
}

TEST(ProjectedCG, RightHandSideAlongTheNullSpaceIsSolvedByZero) {
  check_null_space_rhs<float>();
  check_null_space_rhs<double>();
}

// With no tolerance CG runs until the residual is rounding and p·Ap is no
// longer positive: the norm it reports is never NaN on the way.
TEST(ProjectedCG, RunToRoundingStaysANumber) {
  unsigned seed = 20;
  for (int split : {M, M / 2}) {
    for (int trial = 0; trial < 20; ++trial) {
      const auto a = singular_system(split, seed++);
      const auto b = kdnn_test::uniform(M, -1.0, 1.0, seed++);
      const auto f = solve<float>(a, b, split, 0.0);
      const auto d = solve<double>(a, b, split, 0.0);
      EXPECT_FALSE(std::isnan(f.result.relative_residual));
      EXPECT_FALSE(std::isnan(d.result.relative_residual));
    }
  }
}

TEST(ProjectedCG, NaNInTheRightHandSideIsReported) {
  const auto a = singular_system(M, 9);
  auto b = kdnn_test::uniform(M, -1.0, 1.0, 10);
  b[3] = std::nan("");
  const auto s = solve<double>(a, b, M, 1e-6);
  EXPECT_TRUE(std::isnan(s.result.relative_residual));
}

}  // namespace
