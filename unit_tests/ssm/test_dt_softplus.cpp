// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// dt softplus: forward and backward against double loops around the
// threshold (u = 20) and the clamp, finite differences, empty tensors and bad
// arguments; with dt in bfloat16 or float16 (dt_bias, dt_out and their
// gradients in float), dt_out within float's error and d(dt) rounded once.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "allclose.hpp"
#include "conv_reference.hpp"
#include "expect_error.hpp"
#include "kdnn/ssm/dt_softplus.hpp"
#include "rounded_once.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
using ssm_ref::Vec;
namespace ssm = kdnn::ssm;

template <class T>
class DtSoftplus : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(DtSoftplus, Types);

struct DtRun {
  Vec out, ddt, ddt_bias;
};

/// dt and ddt in T; dt_bias, dt_out and their gradients in compute_t<T>.
template <class T>
DtRun run(int B, int L, int H, const Vec& dt, const Vec& bias, const Vec& g,
          ssm::DtSoftplusOptions o) {
  using C = kdnn::compute_t<T>;
  const auto dtv = to_device<T***>(dt, B, L, H);
  const auto bv = to_device<C*>(bias, H);
  const auto gv = to_device<C***>(g, B, L, H);
  DeviceView<C***> out("out", B, L, H);
  DeviceView<T***> ddt("ddt", B, L, H);
  DeviceView<C*> ddt_bias("ddt_bias", H);
  Kokkos::deep_copy(ddt_bias, C(7));  // overwritten
  ssm::dt_softplus_forward(Space(), dtv, bv, out, o);
  ssm::dt_softplus_backward(Space(), dtv, bv, gv, ddt, ddt_bias, o);
  return {to_host(out), to_host(ddt), to_host(ddt_bias)};
}

TYPED_TEST(DtSoftplus, MatchesDoubleLoopsAroundThresholdAndClamp) {
  using T = TypeParam;
  const double tol = sizeof(T) == 4 ? 2e-6 : 1e-13;
  const double inf = std::numeric_limits<double>::infinity();
  // B·L = 600 rows: three blocks of the backward's bias sum.
  const int B = 3, L = 200, H = 5;
  Vec dt = uniform(std::size_t(B) * L * H, -25, 25, 3);
  dt[0] = 20 - 0.5;  // with bias 0.5: exactly at the threshold
  const Vec bias = {0.5, -1, 2, 0, 1};
  const Vec g = normal(dt.size(), 4);
  for (auto [lo, hi] : {std::pair{0.0, inf}, std::pair{0.01, 3.0}}) {
    SCOPED_TRACE(::testing::Message() << "clamp [" << lo << ", " << hi << "]");
    const auto ref = ssm_ref::dt_softplus(dt, bias, g, lo, hi);
    const auto got = run<T>(B, L, H, dt, bias, g, {lo, hi});
    EXPECT_ALLCLOSE(got.out, ref.out, tol, tol);
    EXPECT_ALLCLOSE(got.ddt, ref.ddt, tol, tol);
    EXPECT_ALLCLOSE(got.ddt_bias, ref.ddt_bias, tol, tol * 30);
  }
}

template <class T>
class DtSoftplus16 : public ::testing::Test {};
using DtSoftplus16Types = ::testing::Types<kdnn::bfloat16, kdnn::float16>;
TYPED_TEST_SUITE(DtSoftplus16, DtSoftplus16Types);

TYPED_TEST(DtSoftplus16, ComputesInFloatAndRoundsTheGradientOnce) {
  using T = TypeParam;
  const double inf = std::numeric_limits<double>::infinity();
  const int B = 3, L = 200, H = 5;
  // dt as a 16-bit activation holds it (float16: within ±65504); the bias
  // and the incoming gradient are float.
  Vec dt = quantized<T>(uniform(std::size_t(B) * L * H, -25, 25, 3));
  Vec bias = {0.5, -1, 2, 0, 1};
  Vec g = normal(dt.size(), 4);
  for (double& e : g) e = double(float(e));
  for (auto [lo, hi] : {std::pair{0.0, inf}, std::pair{0.01, 3.0}}) {
    SCOPED_TRACE(::testing::Message() << "clamp [" << lo << ", " << hi << "]");
    const auto ref = ssm_ref::dt_softplus(dt, bias, g, lo, hi);
    const auto got = run<T>(B, L, H, dt, bias, g, {lo, hi});
    EXPECT_ALLCLOSE(got.out, ref.out, 2e-6, 2e-6);
    expect_rounded_once<T>(got.ddt, ref.ddt, 2e-6, "ddt");
    EXPECT_ALLCLOSE(got.ddt_bias, ref.ddt_bias, 2e-6, 6e-5);  // of the unrounded ddt
  }
}

TEST(DtSoftplusAccuracy, Float32BiasGradientIsSummedInDouble) {
  // dt_bias's gradient sums B·L = 131072 rows per head. With dt + bias > 20
  // the slope is exactly 1, so every term is exactly its float g and the
  // only rounding left, summing in double, is the total's to float (half an
  // ulp, 6e-8 relative). Blocks of rows summed in float lose ~1e-6.
  const int B = 8, L = 16384, H = 3;
  Vec dt = uniform(std::size_t(B) * L * H, 20.5, 30, 11);
  Vec bias = {0.25, 0.5, 1};
  Vec g = normal(dt.size(), 12);
  for (Vec* v : {&dt, &bias, &g}) {
    for (double& e : *v) e = double(float(e));  // what the float run reads
  }
  const double inf = std::numeric_limits<double>::infinity();
  const auto ref = ssm_ref::dt_softplus(dt, bias, g, 0.0, inf);
  const auto got = run<float>(B, L, H, dt, bias, g, {0.0, inf});
  for (int h = 0; h < H; ++h) {
    EXPECT_NEAR(got.ddt_bias[h], ref.ddt_bias[h], 6e-8 * std::abs(ref.ddt_bias[h])) << h;
  }
}

TEST(DtSoftplusGradient, MatchesFiniteDifferences) {
  const int B = 2, L = 7, H = 3;
  const Vec dt = uniform(std::size_t(B) * L * H, -5, 5, 11), bias = {0.3, -0.2, 1.1};
  const Vec g = normal(dt.size(), 12);
  const ssm::DtSoftplusOptions o{0.05, 4.0};
  const auto got = run<double>(B, L, H, dt, bias, g, o);
  const auto loss = [&](const Vec& d, const Vec& b) {
    const auto r = ssm_ref::dt_softplus(d, b, {}, o.dt_min, o.dt_max);
    double l = 0;
    for (std::size_t i = 0; i < d.size(); ++i) l += r.out[i] * g[i];
    return l;
  };
  const double eps = 1e-6;
  for (std::size_t i = 0; i < dt.size(); i += 5) {
    Vec p = dt, m = dt;
    p[i] += eps;
    m[i] -= eps;
    EXPECT_NEAR(got.ddt[i], (loss(p, bias) - loss(m, bias)) / (2 * eps), 1e-7) << "dt " << i;
  }
  for (int h = 0; h < H; ++h) {
    Vec p = bias, m = bias;
    p[h] += eps;
    m[h] -= eps;
    EXPECT_NEAR(got.ddt_bias[h], (loss(dt, p) - loss(dt, m)) / (2 * eps), 1e-7) << "bias " << h;
  }
}

TEST(DtSoftplusEdges, EmptyRowsGiveZeroBiasGradient) {
  const auto got = run<double>(0, 4, 3, {}, {1, 2, 3}, {}, {});
  EXPECT_EQ(got.ddt_bias, Vec(3, 0.0));
}

TEST(DtSoftplusErrors, BadArgumentsNameTheArgument) {
  DeviceView<double***> dt("dt", 2, 3, 4), out("out", 2, 3, 4);
  DeviceView<double*> bias("bias", 3);
  EXPECT_KDNN_ERROR(ssm::dt_softplus_forward(Space(), dt, bias, out),
                    "ssm::dt_softplus_forward: dt_bias has extent(0)=3, expected 4");
  DeviceView<double*> bias4("bias", 4);
  EXPECT_KDNN_ERROR(ssm::dt_softplus_forward(Space(), dt, bias4, out, {1.0, 0.5}),
                    "opts.dt_min=1, opts.dt_max=0.5, expected dt_min <= dt_max");
  EXPECT_KDNN_ERROR(ssm::dt_softplus_forward(Space(), dt, bias4, dt),
                    "output dt_out overlaps input dt");
  DeviceView<double***> ddt("ddt", 2, 3, 3);
  DeviceView<double*> dbias("dbias", 4);
  EXPECT_KDNN_ERROR(ssm::dt_softplus_backward(Space(), dt, bias4, out, ddt, dbias),
                    "ssm::dt_softplus_backward: ddt has extent(2)=3, expected 4 (same as dt)");
}

}  // namespace
