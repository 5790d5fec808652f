// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Linear layer: forward and backward against double loops and finite
// differences, with and without bias, SET and ADD, empty batches, bad input.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/attention/linear.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;

template <class T>
class Linear : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Linear, Types);

template <class T>
double linear_tol() {
  return sizeof(T) == 8 ? 1e-13 : 1e-5;
}

struct Problem {
  int B, S, in, out;
  std::vector<double> x, W, b, dy;
  int rows() const { return B * S; }
};

Problem make_problem(int B, int S, int in, int out, unsigned seed) {
  return {B,
          S,
          in,
          out,
          normal(std::size_t(B) * S * in, seed),
          normal(std::size_t(out) * in, seed + 1),
          normal(out, seed + 2),
          normal(std::size_t(B) * S * out, seed + 3)};
}

/// y = x Wᵀ (+ b), in double.
std::vector<double> ref_forward(const Problem& p, bool bias) {
  std::vector<double> y(std::size_t(p.rows()) * p.out);
  for (int r = 0; r < p.rows(); ++r)
    for (int o = 0; o < p.out; ++o) {
      double s = bias ? p.b[o] : 0;
      for (int i = 0; i < p.in; ++i) s += p.x[r * p.in + i] * p.W[o * p.in + i];
      y[r * p.out + o] = s;
    }
  return y;
}

TYPED_TEST(Linear, ForwardMatchesDoubleLoops) {
  using T = TypeParam;
  for (bool bias : {false, true}) {
    const auto p = make_problem(2, 5, 7, 3, 10);
    DeviceView<T***> y("y", p.B, p.S, p.out);
    DeviceView<T*> b = bias ? to_device<T*>(p.b, p.out) : DeviceView<T*>();
    at::linear_forward(Space(), to_device<T***>(p.x, p.B, p.S, p.in),
                       to_device<T**>(p.W, p.out, p.in), b, y);
    EXPECT_LT(rel_error(to_host(y), ref_forward(p, bias)), linear_tol<T>()) << "bias=" << bias;
  }
}

TYPED_TEST(Linear, BackwardMatchesDoubleLoopsInBothModes) {
  using T = TypeParam;
  const auto p = make_problem(3, 4, 6, 5, 20);
  const auto x = to_device<T***>(p.x, p.B, p.S, p.in);
  const auto W = to_device<T**>(p.W, p.out, p.in);
  const auto dy = to_device<T***>(p.dy, p.B, p.S, p.out);
  std::vector<double> dx(p.x.size(), 0), dW(p.W.size(), 0), db(p.out, 0);
  for (int r = 0; r < p.rows(); ++r)
    for (int o = 0; o < p.out; ++o) {
      const double g = p.dy[r * p.out + o];
      db[o] += g;
      for (int i = 0; i < p.in; ++i) {
        dx[r * p.in + i] += g * p.W[o * p.in + i];
        dW[o * p.in + i] += g * p.x[r * p.in + i];
      }
    }
  // SET overwrites, even NaN; ADD adds to what is there.
  std::vector<double> nan_W(p.W.size(), NAN), nan_b(p.out, NAN);
  auto dX = to_device<T***>(std::vector<double>(p.x.size(), NAN), p.B, p.S, p.in);
  auto dWv = to_device<T**>(nan_W, p.out, p.in);
  auto dbv = to_device<T*>(nan_b, p.out);
  at::linear_backward(Space(), x, W, dy, dX, dWv, dbv, at::WgradMode::set);
  EXPECT_LT(rel_error(to_host(dX), dx), linear_tol<T>());
  EXPECT_LT(rel_error(to_host(dWv), dW), linear_tol<T>());
  EXPECT_LT(rel_error(to_host(dbv), db), linear_tol<T>());

  const auto W0 = normal(p.W.size(), 30), b0 = normal(p.out, 31);
  dWv = to_device<T**>(W0, p.out, p.in);
  dbv = to_device<T*>(b0, p.out);
  at::linear_backward(Space(), x, W, dy, DeviceView<T***>(), dWv, dbv, at::WgradMode::add);
  for (std::size_t k = 0; k < dW.size(); ++k) dW[k] += W0[k];
  for (int o = 0; o < p.out; ++o) db[o] += b0[o];
  EXPECT_LT(rel_error(to_host(dWv), dW), linear_tol<T>());
  EXPECT_LT(rel_error(to_host(dbv), db), linear_tol<T>());
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  // L = Σ dy ∘ y(x, W, b); dL/dθ from the backward vs central differences.
  const auto p = make_problem(2, 3, 4, 3, 40);
  auto loss = [&](const std::vector<double>& x, const std::vector<double>& W,
                  const std::vector<double>& b) {
    DeviceView<double***> y("y", p.B, p.S, p.out);
    at::linear_forward(Space(), to_device<double***>(x, p.B, p.S, p.in),
                       to_device<double**>(W, p.out, p.in), to_device<double*>(b, p.out), y);
    const auto yh = to_host(y);
    double s = 0;
    for (std::size_t k = 0; k < yh.size(); ++k) s += p.dy[k] * yh[k];
    return s;
  };
  DeviceView<double***> dx("dx", p.B, p.S, p.in);
  DeviceView<double**> dW("dW", p.out, p.in);
  DeviceView<double*> db("db", p.out);
  at::linear_backward(Space(), to_device<double***>(p.x, p.B, p.S, p.in),
                      to_device<double**>(p.W, p.out, p.in),
                      to_device<double***>(p.dy, p.B, p.S, p.out), dx, dW, db);
  const double h = 1e-6;
  auto check = [&](std::vector<double> Problem::*member, const std::vector<double>& grad,
                   const char* name) {
    for (std::size_t k = 0; k < grad.size(); ++k) {
      Problem plus = p, minus = p;
      (plus.*member)[k] += h;
      (minus.*member)[k] -= h;
      const double fd = (loss(plus.x, plus.W, plus.b) - loss(minus.x, minus.W, minus.b)) / (2 * h);
      EXPECT_NEAR(grad[k], fd, 1e-7) << name << "[" << k << "]";
    }
  };
  check(&Problem::x, to_host(dx), "dx");
  check(&Problem::W, to_host(dW), "dW");
  check(&Problem::b, to_host(db), "db");
}

TEST(Linear, EmptyBatchGivesZeroWeightGradients) {
  const auto W = to_device<float**>(normal(6, 1), 2, 3);
  DeviceView<float***> x("x", 0, 4, 3), y("y", 0, 4, 2), dy("dy", 0, 4, 2), dx("dx", 0, 4, 3);
  at::linear_forward(Space(), x, W, DeviceView<float*>(), y);
  auto dW = to_device<float**>(std::vector<double>(6, NAN), 2, 3);
  auto db = to_device<float*>(std::vector<double>(2, NAN), 2);
  at::linear_backward(Space(), x, W, dy, dx, dW, db, at::WgradMode::set);
  EXPECT_EQ(to_host(dW), std::vector<double>(6, 0.0));
  EXPECT_EQ(to_host(db), std::vector<double>(2, 0.0));
}

TEST(Linear, BadInputIsAnError) {
  DeviceView<float***> x("x", 2, 3, 4), y("y", 2, 3, 5), dy("dy", 2, 3, 5), dx("dx", 2, 3, 4);
  DeviceView<float**> W("W", 5, 4), W_bad("W", 5, 3), dW("dW", 5, 4);
  DeviceView<float*> b("b", 5), b_bad("b", 4), db("db", 5);
  EXPECT_KDNN_ERROR(at::linear_forward(Space(), x, W_bad, b, y),
                    "x has extent(2)=4, expected 3 (W's extent(1), the input features)");
  EXPECT_KDNN_ERROR(at::linear_forward(Space(), x, W, b_bad, y), "b has extent(0)=4, expected 5");
  DeviceView<float***> y_bad("y", 2, 4, 5);
  EXPECT_KDNN_ERROR(at::linear_forward(Space(), x, W, b, y_bad), "y has extent(1)=4, expected 3");
  DeviceView<float***> xy("xy", 2, 3, 4);
  DeviceView<float**> W_sq("W", 4, 4);
  EXPECT_KDNN_ERROR(at::linear_forward(Space(), xy, W_sq, DeviceView<float*>(), xy),
                    "output y overlaps input x");
  EXPECT_KDNN_ERROR(at::linear_backward(Space(), x, W, dy, dx, dW, db, at::WgradMode(7)),
                    "mode=7, expected WgradMode::set or WgradMode::add");
  EXPECT_KDNN_ERROR(at::linear_backward(Space(), x, W, dy, dx, dW, b_bad), "db has extent(0)=4");
  EXPECT_KDNN_ERROR(at::linear_backward(Space(), x, W, dy, dx, W, db),
                    "output dW overlaps input W");
  DeviceView<float***> dy_bad("dy", 2, 3, 4);
  EXPECT_KDNN_ERROR(at::linear_backward(Space(), x, W, dy_bad, dx, dW, db),
                    "dy has extent(2)=4, expected 5");
}

}  // namespace
