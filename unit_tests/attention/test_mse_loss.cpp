// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// MSE loss: value and gradient against double loops and finite differences;
// empty tensors, NaN and bad shapes.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/attention/mse_loss.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;

template <class T>
class MseLoss : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(MseLoss, Types);

double reference_loss(const std::vector<double>& o, const std::vector<double>& t) {
  double s = 0;
  for (std::size_t k = 0; k < o.size(); ++k) s += (o[k] - t[k]) * (o[k] - t[k]);
  return s / double(o.size());
}

TYPED_TEST(MseLoss, ValueAndGradientMatchDoubleLoops) {
  using T = TypeParam;
  const int B = 3, S = 5, E = 7, N = B * S * E;
  const auto o = normal(N, 1), t = normal(N, 2);
  const auto O = to_device<T***>(o, B, S, E), Tg = to_device<T***>(t, B, S, E);
  const double loss = at::mse_loss(Space(), O, Tg);
  // float inputs are rounded before the (double) sum: compare with the
  // reference on the rounded values.
  std::vector<double> o_t = to_host(O), t_t = to_host(Tg);
  EXPECT_NEAR(loss, reference_loss(o_t, t_t), 1e-13 * reference_loss(o_t, t_t));

  DeviceView<T***> dO("dO", B, S, E);
  at::mse_loss_backward(Space(), O, Tg, dO, 0.5);
  std::vector<double> expected(N);
  for (int k = 0; k < N; ++k) expected[k] = 0.5 * 2 * (o_t[k] - t_t[k]) / N;
  EXPECT_ALLCLOSE(to_host(dO), expected, sizeof(T) == 8 ? 1e-15 : 1e-6, 0);
}

TEST(MseLoss, GradientMatchesFiniteDifferences) {
  const int B = 2, S = 3, E = 4, N = B * S * E;
  auto o = normal(N, 3);
  const auto t = normal(N, 4);
  const auto Tg = to_device<double***>(t, B, S, E);
  DeviceView<double***> dO("dO", B, S, E);
  at::mse_loss_backward(Space(), to_device<double***>(o, B, S, E), Tg, dO);
  const auto grad = to_host(dO);
  const double h = 1e-6;
  for (int k = 0; k < N; k += 5) {
    auto plus = o, minus = o;
    plus[k] += h;
    minus[k] -= h;
    const double fd = (at::mse_loss(Space(), to_device<double***>(plus, B, S, E), Tg) -
                       at::mse_loss(Space(), to_device<double***>(minus, B, S, E), Tg)) /
                      (2 * h);
    EXPECT_NEAR(grad[k], fd, 1e-8) << "element " << k;
  }
}

TEST(MseLoss, EmptyTensorGivesNaNAndNoGradient) {
  DeviceView<float***> O("O", 0, 4, 3), Tg("T", 0, 4, 3), dO("dO", 0, 4, 3);
  EXPECT_TRUE(std::isnan(at::mse_loss(Space(), O, Tg)));
  at::mse_loss_backward(Space(), O, Tg, dO);  // nothing to write, no error
}

TEST(MseLoss, NaNPropagates) {
  auto o = normal(12, 5);
  o[7] = NAN;
  const auto O = to_device<double***>(o, 1, 3, 4),
             Tg = to_device<double***>(normal(12, 6), 1, 3, 4);
  EXPECT_TRUE(std::isnan(at::mse_loss(Space(), O, Tg)));
}

TEST(MseLoss, BadShapesAndScaleAreErrors) {
  DeviceView<float***> O("O", 2, 3, 4), Tg("T", 2, 3, 5), dO("dO", 2, 3, 4);
  EXPECT_KDNN_ERROR(at::mse_loss(Space(), O, Tg), "target has extent(2)=5, expected 4");
  DeviceView<float***> T2("T", 2, 3, 4), bad("dO", 2, 4, 4);
  EXPECT_KDNN_ERROR(at::mse_loss_backward(Space(), O, T2, bad), "d_output has extent(1)=4");
  EXPECT_KDNN_ERROR(at::mse_loss_backward(Space(), O, T2, dO, INFINITY), "scale=inf");
}

}  // namespace
