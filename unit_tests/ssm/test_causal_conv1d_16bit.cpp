// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The causal conv1d (+ SiLU) with bfloat16 and float16 activations, float
// parameters, computed in float: each output and activation gradient is the
// double reference on the 16-bit inputs rounded once (at most half a unit of the type off, beyond
// the float computation's error), in both forms (the host's tiles, the GPU's register windows); a
// plain copy round-trips bitwise; the final state copies its inputs bitwise; float16 overflows to
// infinity as PyTorch's float16 does; a NaN reaches exactly the outputs whose window holds it; n =
// 1 and an empty batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "allclose.hpp"
#include "conv_reference.hpp"
#include "conv_runs.hpp"
#include "kdnn/ssm/causal_conv1d.hpp"
#include "rounded_once.hpp"
#include "views.hpp"

namespace {
namespace conv16_test {  // one name for this file's helpers (unity builds)

using namespace kdnn_test;
using namespace kdnn_test::conv_runs;

/// The float computation's error allowance, as the float tests' (relative
/// to 1 + |value|).
constexpr double kFloatTol = 2e-5;

/// `a` as a T operator sees it: the activations rounded to T, w and bias to
/// float.
template <class T>
ConvCase quantized_case(ConvCase a) {
  for (Vec* v : {&a.x, &a.init, &a.dy, &a.dfinal}) *v = quantized<T>(*v);
  for (Vec* v : {&a.w, &a.bias}) *v = quantized<float>(*v);
  return a;
}

template <class T>
class CausalConv1d16 : public ::testing::Test {};
using Types16 = ::testing::Types<kdnn::bfloat16, kdnn::float16>;
TYPED_TEST_SUITE(CausalConv1d16, Types16);

const ConvShape kShapes16[] = {{2, 37, 5, 4},   {2, 70, 300, 2}, {3, 3, 4, 7},
                               {1, 130, 65, 3}, {1, 1, 1, 1},    {1, 2, 3, 4}};
const kdnn::KernelForm kForms16[] = {kdnn::KernelForm::host, kdnn::KernelForm::gpu};

TYPED_TEST(CausalConv1d16, ForwardIsTheExactResultRoundedOnce) {
  using T = TypeParam;
  unsigned seed = 40;
  for (const ConvShape& s : kShapes16) {
    for (bool silu : {true, false}) {
      const ConvCase a = quantized_case<T>(make_conv_case(s, kAll, silu, seed += 10));
      const auto expected = ssm_ref::conv_forward(a);
      for (const auto form : kForms16) {
        SCOPED_TRACE(::testing::Message()
                     << "B=" << s.B << " L=" << s.L << " C=" << s.C << " K=" << s.K
                     << " silu=" << silu << (form == kdnn::KernelForm::gpu ? " gpu" : " host"));
        const auto actual = run_conv_forward<T>(a, form);
        expect_rounded_once<T>(actual.y, expected.y, kFloatTol, "y");
        EXPECT_EQ(actual.final_state, expected.final_state);  // copies of 16-bit inputs
      }
    }
  }
}

TYPED_TEST(CausalConv1d16, BackwardIsTheExactResultRoundedOnce) {
  using T = TypeParam;
  unsigned seed = 400;
  for (const ConvShape& s : kShapes16) {
    for (bool silu : {true, false}) {
      const ConvCase a = quantized_case<T>(make_conv_case(s, kAll, silu, seed += 10));
      const auto expected = ssm_ref::conv_backward(a);
      for (const auto form : kForms16) {
        SCOPED_TRACE(::testing::Message()
                     << "B=" << s.B << " L=" << s.L << " C=" << s.C << " K=" << s.K
                     << " silu=" << silu << (form == kdnn::KernelForm::gpu ? " gpu" : " host"));
        const auto actual = run_conv_backward<T>(a, true, true, form);
        // dw and dbias sum B·L float terms of size ~1.
        const double sum_tol = kFloatTol * std::sqrt(double(s.B * s.L) + 1);
        expect_rounded_once<T>(actual.dx, expected.dx, kFloatTol, "dx");
        expect_rounded_once<T>(actual.dinit, expected.dinit, kFloatTol, "dinitial_state");
        EXPECT_ALLCLOSE(actual.dw, expected.dw, kFloatTol, sum_tol);  // float
        EXPECT_ALLCLOSE(actual.dbias, expected.dbias, kFloatTol, sum_tol);
      }
    }
  }
}

/// K = 1, w = 1, no bias, no SiLU: y = x, each value representable in T, so
/// y must hold x's bits (−0, subnormals and the largest values included).
TYPED_TEST(CausalConv1d16, ACopyRoundTripsBitwise) {
  using T = TypeParam;
  std::vector<T> bits;
  for (unsigned h = 0; h < 0x10000u; h += 7) {
    const T v{std::uint16_t(h)};
    if (std::isfinite(as_double(v))) bits.push_back(v);
  }
  const int C = 4, L = int(bits.size() / C);
  DeviceView<T***> x("x", 1, L, C), y("y", 1, L, C);
  const auto xh = Kokkos::create_mirror_view(x);
  std::memcpy(xh.data(), bits.data(), sizeof(T) * x.size());
  Kokkos::deep_copy(x, xh);
  for (const auto form : kForms16) {
    ssm::ConvForward<T, Space> args;
    args.x = x;
    args.w = to_device<float**>(Vec(C, 1.0), C, 1);
    args.y = y;
    ssm::causal_conv1d_forward(Space(), args, conv_options(false, form));
    const auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
    EXPECT_EQ(std::memcmp(yh.data(), xh.data(), sizeof(T) * y.size()), 0);
  }
}

// float16's largest finite value is 65504: 300·300 overflows to +inf (as
// PyTorch's float16 conv gives), −300·300 to −inf; SiLU(−inf) is NaN in
// float as in PyTorch (−inf · σ(−inf) = −inf · 0).
TEST(CausalConv1d16Edges, Float16OverflowsToInfinity) {
  using T = kdnn::float16;
  ConvCase a;
  a.s = {1, 3, 2, 1};
  a.silu = false;
  a.x = {300, -300, 1, 2, 300, 300};
  a.w = {300, 300};
  a.dy = Vec(6, 0.0);
  for (const auto form : kForms16) {
    const auto y = run_conv_forward<T>(a, form).y;
    const double inf = std::numeric_limits<double>::infinity();
    EXPECT_EQ(y, (Vec{inf, -inf, 300, 600, inf, inf}));
  }
}

TYPED_TEST(CausalConv1d16, ANanReachesTheOutputsWhoseWindowHoldsIt) {
  using T = TypeParam;
  ConvCase a = quantized_case<T>(make_conv_case({1, 12, 3, 4}, kAll, true, 7));
  const int t = 5, c = 1;
  a.x[std::size_t(t) * 3 + c] = std::numeric_limits<double>::quiet_NaN();
  for (const auto form : kForms16) {
    const auto y = run_conv_forward<T>(a, form).y;
    for (int s = 0; s < 12; ++s) {
      for (int ch = 0; ch < 3; ++ch) {
        const bool reached = ch == c && s >= t && s < t + 4;
        EXPECT_EQ(std::isnan(y[std::size_t(s) * 3 + ch]), reached)
            << "y[0, " << s << ", " << ch << "]";
      }
    }
  }
}

TYPED_TEST(CausalConv1d16, EmptyBatchGivesZeroParameterGradients) {
  using T = TypeParam;
  const ConvCase a = make_conv_case({0, 5, 3, 4}, kBias, true, 3);
  for (const auto form : kForms16) {
    EXPECT_TRUE(run_conv_forward<T>(a, form).y.empty());
    const auto g = run_conv_backward<T>(a, true, false, form);
    EXPECT_EQ(g.dw, Vec(12, 0.0));
    EXPECT_EQ(g.dbias, Vec(3, 0.0));
  }
}

}  // namespace conv16_test
}  // namespace
