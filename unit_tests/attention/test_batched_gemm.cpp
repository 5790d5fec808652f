// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Strided batched GEMM: every (op_a, op_b, op_c) with α and β ≠ 0 against
// double loops, the backward against finite differences, BLAS edge cases
// (β = 0 over NaN, an empty inner dimension) and bad input.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/attention/batched_gemm.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;
using at::Op;

template <class T>
class BatchedGemm : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(BatchedGemm, Types);

/// A [B, H, rows, cols] tensor on the host.
struct Host4 {
  int B, H, rows, cols;
  std::vector<double> v;
  double at(int b, int h, int r, int c) const {
    return v[((std::size_t(b) * H + h) * rows + r) * cols + c];
  }
  /// Element (r, c) of op(matrix (b, h)).
  double op(bool trans, int b, int h, int r, int c) const {
    return trans ? at(b, h, c, r) : at(b, h, r, c);
  }
};

struct Case {
  bool ta, tb, tc;
  std::string name() const {
    return std::string("op_a=") + (ta ? "T" : "N") + " op_b=" + (tb ? "T" : "N") +
           " op_c=" + (tc ? "T" : "N");
  }
};
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int k = 0; k < 8; ++k) cases.push_back({bool(k & 1), bool(k & 2), bool(k & 4)});
  return cases;
}

constexpr int kB = 2, kH = 3, kM = 4, kN = 5, kK = 3;

/// A, B, C for op_a(A) M×K, op_b(B) K×N, C (M×N, or N×M with op_c).
struct Problem {
  Host4 A, Bm, C;
};
Problem make_problem(const Case& c, unsigned seed) {
  Host4 A{kB, kH, c.ta ? kK : kM, c.ta ? kM : kK, {}};
  Host4 B{kB, kH, c.tb ? kN : kK, c.tb ? kK : kN, {}};
  Host4 C{kB, kH, c.tc ? kN : kM, c.tc ? kM : kN, {}};
  A.v = normal(std::size_t(kB) * kH * kM * kK, seed);
  B.v = normal(std::size_t(kB) * kH * kK * kN, seed + 1);
  C.v = normal(std::size_t(kB) * kH * kM * kN, seed + 2);
  return {A, B, C};
}

std::vector<double> reference(const Case& c, double alpha, const Problem& p, double beta) {
  std::vector<double> out = p.C.v;
  for (int b = 0; b < kB; ++b)
    for (int h = 0; h < kH; ++h)
      for (int i = 0; i < kM; ++i)
        for (int j = 0; j < kN; ++j) {
          double s = 0;
          for (int k = 0; k < kK; ++k) s += p.A.op(c.ta, b, h, i, k) * p.Bm.op(c.tb, b, h, k, j);
          const int r = c.tc ? j : i, col = c.tc ? i : j;
          double& o = out[((std::size_t(b) * kH + h) * p.C.rows + r) * p.C.cols + col];
          o = beta * o + alpha * s;
        }
  return out;
}

template <class T>
DeviceView<T****> device(const Host4& h) {
  return to_device<T****>(h.v, h.B, h.H, h.rows, h.cols);
}

Op op(bool t) { return t ? Op::transpose : Op::none; }

TYPED_TEST(BatchedGemm, EveryTransposeMatchesDoubleLoops) {
  using T = TypeParam;
  for (const Case& c : all_cases()) {
    const auto p = make_problem(c, 7);
    auto C = device<T>(p.C);
    at::batched_gemm(Space(), op(c.ta), op(c.tb), op(c.tc), T(0.75), device<T>(p.A),
                     device<T>(p.Bm), T(-0.5), C);
    EXPECT_LT(rel_error(to_host(C), reference(c, 0.75, p, -0.5)), sizeof(T) == 8 ? 1e-14 : 1e-6)
        << c.name();
  }
}

TEST(BatchedGemm, BetaZeroIgnoresNaNInC) {
  const Case c{false, true, false};
  auto p = make_problem(c, 9);
  auto reference_c = reference(c, 2.0, p, 0.0);
  p.C.v.assign(p.C.v.size(), NAN);
  auto C = device<float>(p.C);
  at::batched_gemm(Space(), Op::none, Op::transpose, Op::none, 2.0f, device<float>(p.A),
                   device<float>(p.Bm), 0.0f, C);
  EXPECT_LT(rel_error(to_host(C), reference_c), 1e-6);
}

TEST(BatchedGemm, EmptyInnerDimensionScalesC) {
  DeviceView<double****> A("A", 1, 2, 3, 0), B("B", 1, 2, 0, 4);
  const auto c0 = normal(24, 3);
  auto C = to_device<double****>(c0, 1, 2, 3, 4);
  at::batched_gemm(Space(), Op::none, Op::none, Op::none, 1.0, A, B, 3.0, C);
  std::vector<double> expected(c0);
  for (auto& v : expected) v *= 3;
  EXPECT_EQ(to_host(C), expected);
  auto Cn = to_device<double****>(std::vector<double>(24, NAN), 1, 2, 3, 4);
  at::batched_gemm(Space(), Op::none, Op::none, Op::none, 1.0, A, B, 0.0, Cn);
  EXPECT_EQ(to_host(Cn), std::vector<double>(24, 0.0));
}

TEST(BatchedGemm, BackwardMatchesFiniteDifferencesForEveryTranspose) {
  // L = Σ G ∘ C_out; dA, dB and dC_in = β G from the backward vs central
  // differences of L.
  const double alpha = 1.25, beta = 0.5, h = 1e-6;
  for (const Case& c : all_cases()) {
    const auto p = make_problem(c, 11);
    const Host4 G{p.C.B, p.C.H, p.C.rows, p.C.cols, normal(p.C.v.size(), 12)};
    auto loss = [&](const Problem& q) {
      auto C = device<double>(q.C);
      at::batched_gemm(Space(), op(c.ta), op(c.tb), op(c.tc), alpha, device<double>(q.A),
                       device<double>(q.Bm), beta, C);
      const auto out = to_host(C);
      double s = 0;
      for (std::size_t k = 0; k < out.size(); ++k) s += G.v[k] * out[k];
      return s;
    };
    auto dA = device<double>(p.A), dB = device<double>(p.Bm), dC = device<double>(p.C);
    at::batched_gemm_backward(Space(), op(c.ta), op(c.tb), op(c.tc), alpha, device<double>(p.A),
                              device<double>(p.Bm), beta, device<double>(G), dA, dB, dC);
    auto check = [&](Host4 Problem::*member, const std::vector<double>& grad, const char* name) {
      for (std::size_t k = 0; k < grad.size(); k += 3) {
        Problem plus = p, minus = p;
        (plus.*member).v[k] += h;
        (minus.*member).v[k] -= h;
        EXPECT_NEAR(grad[k], (loss(plus) - loss(minus)) / (2 * h), 1e-7)
            << c.name() << " " << name << "[" << k << "]";
      }
    };
    check(&Problem::A, to_host(dA), "dA");
    check(&Problem::Bm, to_host(dB), "dB");
    check(&Problem::C, to_host(dC), "dC_in");
  }
}

TEST(BatchedGemm, BackwardSkipsOutputsNotGiven) {
  const Case c{false, false, false};
  const auto p = make_problem(c, 13);
  auto dB = device<float>(p.Bm);
  at::batched_gemm_backward(Space(), Op::none, Op::none, Op::none, 1.0f, device<float>(p.A),
                            device<float>(p.Bm), 0.0f, device<float>(p.C), DeviceView<float****>(),
                            dB, DeviceView<float****>());
  std::vector<double> expected(p.Bm.v.size(), 0);  // dB = Aᵀ dC
  for (int b = 0; b < kB; ++b)
    for (int hh = 0; hh < kH; ++hh)
      for (int k = 0; k < kK; ++k)
        for (int j = 0; j < kN; ++j) {
          double s = 0;
          for (int i = 0; i < kM; ++i) s += p.A.at(b, hh, i, k) * p.C.at(b, hh, i, j);
          expected[((std::size_t(b) * kH + hh) * kK + k) * kN + j] = s;
        }
  EXPECT_LT(rel_error(to_host(dB), expected), 1e-6);
}

TEST(BatchedGemm, BadInputIsAnError) {
  DeviceView<float****> A("A", 2, 3, 4, 5), B("B", 2, 3, 5, 6), C("C", 2, 3, 4, 6);
  EXPECT_KDNN_ERROR(
      at::batched_gemm(Space(), Op::transpose, Op::none, Op::none, 1.0f, A, B, 0.0f, C),
      "inner dimensions differ: op_a(A) is 5x4, op_b(B) is 5x6, expected op_b(B) to have 4 rows");
  DeviceView<float****> Ct("C", 2, 3, 4, 6);
  EXPECT_KDNN_ERROR(
      at::batched_gemm(Space(), Op::none, Op::none, Op::transpose, 1.0f, A, B, 0.0f, Ct),
      "C has extent(2)=4, expected 6");
  DeviceView<float****> B_heads("B", 2, 2, 5, 6);
  EXPECT_KDNN_ERROR(
      at::batched_gemm(Space(), Op::none, Op::none, Op::none, 1.0f, A, B_heads, 0.0f, C),
      "B has extent(1)=2, expected 3 (A's heads)");
  EXPECT_KDNN_ERROR(at::batched_gemm(Space(), Op::none, Op::none, Op::none, NAN, A, B, 0.0f, C),
                    "alpha=nan, expected a finite value");
  EXPECT_KDNN_ERROR(at::batched_gemm(Space(), Op(3), Op::none, Op::none, 1.0f, A, B, 0.0f, C),
                    "op_a=3, expected Op::none or Op::transpose");
  DeviceView<float****> sq("sq", 2, 3, 4, 4);
  EXPECT_KDNN_ERROR(at::batched_gemm(Space(), Op::none, Op::none, Op::none, 1.0f, sq, sq, 0.0f, sq),
                    "output C overlaps input A");
  DeviceView<float****> dA_bad("dA", 2, 3, 5, 4);
  EXPECT_KDNN_ERROR(
      at::batched_gemm_backward(Space(), Op::none, Op::none, Op::none, 1.0f, A, B, 0.0f, C, dA_bad,
                                DeviceView<float****>(), DeviceView<float****>()),
      "dA has extent(2)=5, expected 4 (same as A)");
  DeviceView<float****> dsq("dsq", 2, 3, 4, 4);
  EXPECT_KDNN_ERROR(at::batched_gemm_backward(Space(), Op::none, Op::none, Op::none, 1.0f, sq, sq,
                                              0.0f, sq, dsq, dsq, DeviceView<float****>()),
                    "outputs dA and dB overlap");
}

}  // namespace
