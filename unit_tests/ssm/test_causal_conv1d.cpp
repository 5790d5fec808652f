// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Causal depthwise conv1d (+ SiLU): forward and backward against double
// loops (conv_reference.hpp), the reference backward against finite
// differences, kdnn's double backward against finite differences of kdnn's
// forward; K = 1, 2, 3, 4, 7, several tiles of steps and channels, L < K−1,
// L = 0, B = 0; both forms (the host's tiles and the GPU's register
// windows, K ∈ {2, 3, 4}) on every backend; bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "allclose.hpp"
#include "contraction.hpp"
#include "conv_reference.hpp"
#include "conv_runs.hpp"
#include "expect_error.hpp"
#include "kdnn/ssm/causal_conv1d.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
using namespace kdnn_test::conv_runs;
using ssm_ref::ConvCase;
using ssm_ref::ConvShape;
using ssm_ref::Vec;
namespace ssm = kdnn::ssm;

template <class T>
constexpr double conv_tol() {
  return sizeof(T) == 4 ? 2e-5 : 1e-12;
}

template <class T>
class CausalConv1d : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CausalConv1d, Types);

/// (B, L, C, K) covering one and several tiles of 64 steps and of the
/// channel tile (256 on a host, 64 on a GPU), several runs of steps of the
/// register form, L < K−1 and L = 0.
const ConvShape kShapes[] = {{2, 37, 5, 4},   {1, 150, 3, 1}, {2, 70, 300, 2}, {3, 3, 4, 7},
                             {1, 130, 65, 7}, {2, 0, 3, 4},   {1, 1, 1, 1},    {2, 5, 2, 7},
                             {2, 200, 33, 3}, {1, 2, 3, 3},   {1, 1, 2, 4}};
const kdnn::KernelForm kForms[] = {kdnn::KernelForm::host, kdnn::KernelForm::gpu};

const char* form_name(kdnn::KernelForm form) {
  return form == kdnn::KernelForm::gpu ? "gpu" : "host";
}

TYPED_TEST(CausalConv1d, ForwardMatchesDoubleLoops) {
  using T = TypeParam;
  unsigned seed = 10;
  for (const ConvShape& s : kShapes) {
    for (unsigned given : {0u, unsigned(kAll)}) {
      for (bool silu : {true, false}) {
        const ConvCase a = make_conv_case(s, given, silu, seed += 10);
        const auto expected = ssm_ref::conv_forward(a);
        for (const auto form : kForms) {
          SCOPED_TRACE(::testing::Message()
                       << "B=" << s.B << " L=" << s.L << " C=" << s.C << " K=" << s.K
                       << " given=" << given << " silu=" << silu << " " << form_name(form));
          const auto actual = run_conv_forward<T>(a, form);
          EXPECT_ALLCLOSE(actual.y, expected.y, conv_tol<T>(), conv_tol<T>());
          Vec copied;  // the final state copies inputs: exact in T
          for (double v : expected.final_state) copied.push_back(double(T(v)));
          EXPECT_ALLCLOSE(actual.final_state, copied, 0, 0);
        }
      }
    }
  }
}

TYPED_TEST(CausalConv1d, BackwardMatchesDoubleLoops) {
  using T = TypeParam;
  unsigned seed = 500;
  for (const ConvShape& s : kShapes) {
    for (unsigned given : {0u, unsigned(kBias), unsigned(kAll)}) {
      for (bool silu : {true, false}) {
        const ConvCase a = make_conv_case(s, given, silu, seed += 10);
        const auto expected = ssm_ref::conv_backward(a);
        for (const auto form : kForms) {
          SCOPED_TRACE(::testing::Message()
                       << "B=" << s.B << " L=" << s.L << " C=" << s.C << " K=" << s.K
                       << " given=" << given << " silu=" << silu << " " << form_name(form));
          const auto actual = run_conv_backward<T>(a, true, true, form);
          // dw and dbias sum over B·L terms of size ~1.
          const double sum_tol = conv_tol<T>() * std::sqrt(double(s.B * s.L) + 1);
          EXPECT_ALLCLOSE(actual.dx, expected.dx, conv_tol<T>(), conv_tol<T>());
          EXPECT_ALLCLOSE(actual.dw, expected.dw, conv_tol<T>(), sum_tol);
          EXPECT_ALLCLOSE(actual.dbias, expected.dbias, conv_tol<T>(), sum_tol);
          EXPECT_ALLCLOSE(actual.dinit, expected.dinit, conv_tol<T>(), conv_tol<T>());
        }
      }
    }
  }
}

// The register form adds the terms of y, dz and dx in the tiled form's
// order, so both give the same bits (where the build does not contract
// a·b + c into FMAs differently in the two: then to a rounding per term).
// dw and dbias are summed over different blocks of steps: to rounding.
TYPED_TEST(CausalConv1d, RegisterFormMatchesTheTiledForm) {
  using T = TypeParam;
  const double exact = kdnn_test::host_contracts() ? 8 * std::numeric_limits<T>::epsilon() : 0;
  unsigned seed = 900;
  for (const ConvShape& s :
       {ConvShape{2, 200, 33, 3}, ConvShape{3, 70, 130, 2}, ConvShape{2, 37, 5, 4}}) {
    for (bool silu : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "K=" << s.K << " silu=" << silu);
      const ConvCase a = make_conv_case(s, kAll, silu, seed += 10);
      const auto host = kdnn::KernelForm::host, gpu = kdnn::KernelForm::gpu;
      EXPECT_ALLCLOSE(run_conv_forward<T>(a, gpu).y, run_conv_forward<T>(a, host).y, exact, exact);
      const auto g = run_conv_backward<T>(a, true, true, gpu),
                 h = run_conv_backward<T>(a, true, true, host);
      EXPECT_ALLCLOSE(g.dx, h.dx, exact, exact);
      EXPECT_ALLCLOSE(g.dinit, h.dinit, exact, exact);
      const double sums = 64 * std::numeric_limits<T>::epsilon() * std::sqrt(double(s.B * s.L));
      EXPECT_ALLCLOSE(g.dw, h.dw, sums, sums);
      EXPECT_ALLCLOSE(g.dbias, h.dbias, sums, sums);
    }
  }
}

TYPED_TEST(CausalConv1d, OptionalGradientsMayBeLeftOut) {
  using T = TypeParam;
  const ConvCase a = make_conv_case({2, 40, 6, 4}, kAll, true, 77);
  const auto all = run_conv_backward<T>(a);
  const auto some = run_conv_backward<T>(a, false, false);
  EXPECT_EQ(some.dx, all.dx);
  EXPECT_EQ(some.dw, all.dw);
}

/// Σ y·dy + Σ final·dfinal: the scalar whose gradient the backward returns.
double loss(const ssm_ref::ConvForwardResult& r, const ConvCase& a) {
  double l = 0;
  for (std::size_t i = 0; i < r.y.size(); ++i) l += r.y[i] * a.dy[i];
  for (std::size_t i = 0; i < a.dfinal.size(); ++i) l += r.final_state[i] * a.dfinal[i];
  return l;
}

/// Central differences of `f(case)` along a random direction of one input
/// (x, w, bias or init), against ⟨gradient, direction⟩.
template <class Forward>
void check_directional(const ConvCase& a, Vec ConvCase::*input, const Vec& gradient,
                       const Forward& forward, double rtol, const char* name) {
  SCOPED_TRACE(name);
  const Vec dir = normal((a.*input).size(), 4242);
  const double eps = 1e-6;
  ConvCase plus = a, minus = a;
  for (std::size_t i = 0; i < dir.size(); ++i) {
    (plus.*input)[i] += eps * dir[i];
    (minus.*input)[i] -= eps * dir[i];
  }
  const double fd = (loss(forward(plus), a) - loss(forward(minus), a)) / (2 * eps);
  double exact = 0;
  for (std::size_t i = 0; i < dir.size(); ++i) exact += gradient[i] * dir[i];
  EXPECT_NEAR(exact, fd, rtol * (std::abs(fd) + 1));
}

TEST(CausalConv1dGradient, ReferenceAndKdnnMatchFiniteDifferences) {
  for (int K : {1, 2, 4, 7}) {
    for (bool silu : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "K=" << K << " silu=" << silu);
      const ConvCase a = make_conv_case({2, 9, 3, K}, kAll, silu, 900 + K);
      const auto ref = ssm_ref::conv_backward(a);
      const auto got = run_conv_backward<double>(a);
      const auto ref_forward = [](const ConvCase& c) { return ssm_ref::conv_forward(c); };
      const auto kdnn_forward = [](const ConvCase& c) { return run_conv_forward<double>(c); };
      check_directional(a, &ConvCase::x, ref.dx, ref_forward, 1e-7, "reference dx");
      check_directional(a, &ConvCase::x, got.dx, kdnn_forward, 1e-7, "kdnn dx");
      check_directional(a, &ConvCase::w, got.dw, kdnn_forward, 1e-7, "kdnn dw");
      check_directional(a, &ConvCase::bias, got.dbias, kdnn_forward, 1e-7, "kdnn dbias");
      if (K > 1) {
        check_directional(a, &ConvCase::init, ref.dinit, ref_forward, 1e-7, "reference dinit");
        check_directional(a, &ConvCase::init, got.dinit, kdnn_forward, 1e-7, "kdnn dinit");
      }
    }
  }
}

TEST(CausalConv1dEdges, EmptyBatchAndSequence) {
  // B = 0: nothing to compute. L = 0: y empty, final = initial state, dw = 0.
  for (const ConvShape& s : {ConvShape{0, 5, 3, 4}, ConvShape{2, 0, 3, 4}}) {
    const ConvCase a = make_conv_case(s, kAll, true, 31);
    const auto f = run_conv_forward<double>(a);
    EXPECT_EQ(f.final_state, ssm_ref::conv_forward(a).final_state);
    const auto g = run_conv_backward<double>(a);
    EXPECT_EQ(g.dw, Vec(std::size_t(s.C) * s.K, 0.0));
    EXPECT_EQ(g.dinit, ssm_ref::conv_backward(a).dinit);  // = dfinal when L = 0
  }
}

TEST(CausalConv1dErrors, BadArgumentsNameTheArgument) {
  const ConvCase a = make_conv_case({2, 6, 3, 4}, kAll, true, 5);
  ConvViews<double> v(a);
  DeviceView<double***> y("y", 2, 6, 3);
  ssm::ConvForward<double, Space> f;
  f.x = v.x;
  f.w = v.w;
  f.y = y;
  const auto run = [&](const ssm::ConvForward<double, Space>& args) {
    ssm::causal_conv1d_forward(Space(), args);
  };
  {
    auto b = f;
    b.w = DeviceView<double**>("w", 4, 4);
    EXPECT_KDNN_ERROR(run(b), "ssm::causal_conv1d_forward: w has extent(0)=4, expected 3");
  }
  {
    auto b = f;
    b.w = DeviceView<double**>("w", 3, 0);
    EXPECT_KDNN_ERROR(run(b), "w has extent(1)=0, expected K >= 1");
  }
  {
    auto b = f;
    b.bias = DeviceView<double*>("bias", 2);
    EXPECT_KDNN_ERROR(run(b), "bias has extent(0)=2, expected 3");
  }
  {
    auto b = f;
    b.initial_state = DeviceView<double***>("init", 2, 4, 3);
    EXPECT_KDNN_ERROR(run(b), "initial_state has extent(1)=4, expected 3 (K-1");
  }
  {
    auto b = f;
    b.final_state = DeviceView<double***>("final", 1, 3, 3);
    EXPECT_KDNN_ERROR(run(b), "final_state has extent(0)=1, expected 2");
  }
  {
    auto b = f;
    b.y = DeviceView<double***>("y", 2, 5, 3);
    EXPECT_KDNN_ERROR(run(b), "y has extent(1)=5, expected 6 (same as x)");
  }
  {
    auto b = f;
    b.y = DeviceView<double***>(const_cast<double*>(v.x.data()), 2, 6, 3);
    EXPECT_KDNN_ERROR(run(b), "output y overlaps input x");
  }
  ssm::ConvBackward<double, Space> g;
  g.x = v.x;
  g.w = v.w;
  g.dy = v.dy;
  g.dx = DeviceView<double***>("dx", 2, 6, 3);
  g.dw = DeviceView<double**>("dw", 3, 3);
  EXPECT_KDNN_ERROR(ssm::causal_conv1d_backward(Space(), g),
                    "ssm::causal_conv1d_backward: dw has extent(1)=3, expected 4 (same as w)");
}

}  // namespace
