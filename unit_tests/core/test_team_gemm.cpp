// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The team GEMM of core/impl/team_gemm.hpp on the default execution space:
// C = A·B and C += A·B against a double loop, with A row-major and k-major
// (the same sums in the same order, so bitwise equal), for inner sizes that
// are and are not multiples of anything, including 0 and 1; and the
// GemmShape variants, which skip what a triangular factor or a lower-
// triangular output cannot use, against the full product.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kdnn/core/impl/team_gemm.hpp"
#include "views.hpp"

namespace {

using kdnn_test::DeviceView;
using kdnn_test::Space;

/// One team computes C = A·B (+ C with accumulate); A is read through `a`.
template <class T>
struct GemmOnTeam {
  int M, N, K, lda;
  bool k_major, accumulate;
  DeviceView<T*> a, b, c;
  kdnn::impl::GemmShape shape = kdnn::impl::GemmShape::full;
  KOKKOS_INLINE_FUNCTION void operator()(
      const typename Kokkos::TeamPolicy<Space>::member_type& team) const {
    using GemmA = kdnn::impl::GemmA<T>;
    const GemmA operand = k_major ? GemmA::k_major(a.data(), lda) : GemmA::rows(a.data(), lda);
    kdnn::impl::team_gemm<Space>(team, M, N, K, operand, b.data(), N, c.data(), N, accumulate,
                                 shape);
  }
};

template <class T>
std::vector<T> run_gemm(int M, int N, int K, bool k_major, bool accumulate,
                        const std::vector<double>& A, const std::vector<double>& B,
                        const std::vector<double>& C0,
                        kdnn::impl::GemmShape shape = kdnn::impl::GemmShape::full) {
  // A(i, k) stored with a leading dimension one past the minimum, so that
  // the layouts are not interchangeable by accident.
  const int lda = (k_major ? M : K) + 1;
  std::vector<double> stored(std::size_t(k_major ? K : M) * lda + 1, 0.0);
  for (int i = 0; i < M; ++i)
    for (int k = 0; k < K; ++k)
      stored[k_major ? std::size_t(k) * lda + i : std::size_t(i) * lda + k] = A[i * K + k];
  GemmOnTeam<T> f{
      M,
      N,
      K,
      lda,
      k_major,
      accumulate,
      kdnn_test::to_device<T*>(stored, stored.size()),
      kdnn_test::to_device<T*>(B.empty() ? std::vector<double>{0.0} : B, B.empty() ? 1 : B.size()),
      kdnn_test::to_device<T*>(C0, C0.size()),
      shape};
  Kokkos::parallel_for("test_team_gemm", Kokkos::TeamPolicy<Space>(1, Kokkos::AUTO), f);
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), f.c);
  return std::vector<T>(host.data(), host.data() + host.size());
}

template <class T>
void expect_gemm(int M, int N, int K, bool accumulate, unsigned seed) {
  const auto A = kdnn_test::normal(std::size_t(M) * K, seed);
  const auto B = kdnn_test::normal(std::size_t(K) * N, seed + 1);
  const auto C0 = kdnn_test::normal(std::size_t(M) * N, seed + 2);
  // The inputs rounded to T, so that the reference sees what the kernel sees.
  const auto round = [](double x) { return double(T(x)); };
  const auto rows = run_gemm<T>(M, N, K, false, accumulate, A, B, C0);
  const auto cols = run_gemm<T>(M, N, K, true, accumulate, A, B, C0);
  const double eps = std::is_same_v<T, float> ? 1.2e-7 : 2.3e-16;
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double sum = accumulate ? round(C0[i * N + j]) : 0.0, magnitude = std::abs(sum);
      for (int k = 0; k < K; ++k) {
        const double term = round(A[i * K + k]) * round(B[k * N + j]);
        sum += term;
        magnitude += std::abs(term);
      }
      const auto at = std::size_t(i) * N + j;
      EXPECT_NEAR(double(rows[at]), sum, (K + 2) * eps * magnitude + 1e-300)
          << "M=" << M << " N=" << N << " K=" << K << " (" << i << ", " << j << ")";
      EXPECT_EQ(rows[at], cols[at])
          << "row-major and k-major A differ at (" << i << ", " << j << "), K=" << K;
    }
  }
}

template <class T>
void expect_all_sizes() {
  using Tile = kdnn::impl::GemmTile<Space, T>;
  const int a = Tile::align;
  unsigned seed = 11;
  for (int K : {0, 1, 5, 33, 64})
    for (bool accumulate : {false, true}) {
      expect_gemm<T>(a, a, K, accumulate, seed += 3);
      expect_gemm<T>(3 * a, 2 * a, K, accumulate, seed += 3);
    }
}

TEST(TeamGemm, FloatMatchesDoubleLoopInBothLayouts) { expect_all_sizes<float>(); }
TEST(TeamGemm, DoubleMatchesDoubleLoopInBothLayouts) { expect_all_sizes<double>(); }

/// Each GemmShape on operands with the zeros it assumes equals the full
/// product (the skipped terms are exact zeros); lower_out on the entries
/// j ≤ i it promises.
template <class T>
void expect_shapes() {
  using kdnn::impl::GemmShape;
  const int n = 3 * kdnn::impl::GemmTile<Space, T>::align;
  const auto zero_unless = [&](std::vector<double> v, auto keep) {
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < n; ++c)
        if (!keep(r, c)) v[r * n + c] = 0;
    return v;
  };
  const auto A = kdnn_test::normal(std::size_t(n) * n, 5);
  const auto B = kdnn_test::normal(std::size_t(n) * n, 6);
  const std::vector<double> C0(std::size_t(n) * n, 0.0);
  const auto lower = [](int r, int c) { return c <= r; };
  const auto upper = [](int r, int c) { return c >= r; };
  for (bool k_major : {false, true}) {
    SCOPED_TRACE(k_major ? "k-major A" : "row-major A");
    const auto al = zero_unless(A, lower), au = zero_unless(A, upper), bl = zero_unless(B, lower);
    EXPECT_EQ((run_gemm<T>(n, n, n, k_major, false, al, B, C0, GemmShape::a_lower)),
              (run_gemm<T>(n, n, n, k_major, false, al, B, C0)));
    EXPECT_EQ((run_gemm<T>(n, n, n, k_major, false, au, B, C0, GemmShape::a_upper)),
              (run_gemm<T>(n, n, n, k_major, false, au, B, C0)));
    // B(k, j) = 0 for k < j: B lower triangular (row k, column j).
    EXPECT_EQ((run_gemm<T>(n, n, n, k_major, false, A, bl, C0, GemmShape::b_lower)),
              (run_gemm<T>(n, n, n, k_major, false, A, bl, C0)));
    const auto part = run_gemm<T>(n, n, n, k_major, false, A, B, C0, GemmShape::lower_out);
    const auto full = run_gemm<T>(n, n, n, k_major, false, A, B, C0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j) EXPECT_EQ(part[i * n + j], full[i * n + j]) << i << ", " << j;
  }
}

TEST(TeamGemm, ShapesSkipOnlyWhatCannotContribute) {
  expect_shapes<float>();
  expect_shapes<double>();
}

TEST(TeamGemm, PadIsAWholeNumberOfTiles) {
  using Tile = kdnn::impl::GemmTile<Space, float>;
  EXPECT_EQ(Tile::align % Tile::rows, 0);
  EXPECT_EQ(Tile::align % Tile::cols, 0);
  EXPECT_EQ(Tile::pad(1), Tile::align);
  EXPECT_EQ(Tile::pad(Tile::align), Tile::align);
  EXPECT_EQ(Tile::pad(Tile::align + 1), 2 * Tile::align);
}

}  // namespace
