// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The causal conv1d's decoding step (causal_conv1d_update): against a double
// loop of its definition (states longer than K − 1, several new steps,
// K = 1, no bias, no SiLU), step by step against the whole sequence's
// forward and final state, B = 0 and Lnew = 0, bad arguments; in float,
// double, bfloat16 and float16 (whose outputs are the exact values rounded
// once, and whose states are copied bitwise).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/ssm/causal_conv1d.hpp"
#include "kdnn/ssm/causal_conv1d_update.hpp"
#include "rounded_once.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace ssm = kdnn::ssm;

struct UpdateCase {
  int B, C, L, W, K;
  bool bias, silu;
};

/// y [B, C, L] and the new state [B, C, W] by the definition, in double.
std::pair<std::vector<double>, std::vector<double>> reference(const UpdateCase& u,
                                                              const std::vector<double>& x,
                                                              const std::vector<double>& state,
                                                              const std::vector<double>& w,
                                                              const std::vector<double>& bias) {
  std::vector<double> y(std::size_t(u.B) * u.C * u.L), next(state.size());
  for (int b = 0; b < u.B; ++b)
    for (int c = 0; c < u.C; ++c) {
      std::vector<double> xbar;  // the state, then the new steps
      for (int s = 0; s < u.W; ++s) xbar.push_back(state[(std::size_t(b) * u.C + c) * u.W + s]);
      for (int t = 0; t < u.L; ++t) xbar.push_back(x[(std::size_t(b) * u.C + c) * u.L + t]);
      for (int t = 0; t < u.L; ++t) {
        double z = u.bias ? bias[c] : 0.0;
        for (int k = 0; k < u.K; ++k)
          z += w[std::size_t(c) * u.K + k] * xbar[u.W + t - u.K + 1 + k];
        y[(std::size_t(b) * u.C + c) * u.L + t] = u.silu ? z / (1 + std::exp(-z)) : z;
      }
      for (int s = 0; s < u.W; ++s) next[(std::size_t(b) * u.C + c) * u.W + s] = xbar[s + u.L];
    }
  return {y, next};
}

template <class T>
class ConvUpdate : public ::testing::Test {};
using ConvUpdateTypes = ::testing::Types<float, double, kdnn::bfloat16, kdnn::float16>;
TYPED_TEST_SUITE(ConvUpdate, ConvUpdateTypes);

TYPED_TEST(ConvUpdate, MatchesItsDefinition) {
  using T = TypeParam;
  using Param = kdnn::compute_t<T>;  // the parameters' type
  const double tol = sizeof(T) == 8 ? 1e-13 : 1e-5;
  const std::vector<UpdateCase> cases = {
      {2, 5, 1, 3, 4, true, true},    // one step, W = K − 1 (mamba's decoding)
      {3, 4, 1, 6, 4, true, false},   // a longer state keeps older inputs
      {2, 7, 3, 2, 3, false, true},   // several steps at once
      {1, 3, 5, 0, 1, true, true},    // K = 1: no state
      {2, 70, 2, 4, 2, false, false}  // W > K − 1, more channels
  };
  unsigned seed = 3;
  for (const UpdateCase& u : cases) {
    SCOPED_TRACE("B=" + std::to_string(u.B) + " C=" + std::to_string(u.C) + " L=" +
                 std::to_string(u.L) + " W=" + std::to_string(u.W) + " K=" + std::to_string(u.K));
    const auto x = quantized<T>(normal(std::size_t(u.B) * u.C * u.L, seed++));
    const auto state = quantized<T>(normal(std::size_t(u.B) * u.C * u.W, seed++));
    const auto w = quantized<Param>(normal(std::size_t(u.C) * u.K, seed++));
    const auto bias = quantized<Param>(normal(u.C, seed++));
    ssm::ConvUpdate<T, Space> args;
    args.x = to_device<T***>(x, u.B, u.C, u.L);
    const auto st = to_device<T***>(state, u.B, u.C, u.W);
    args.conv_state = st;
    args.w = to_device<Param**>(w, u.C, u.K);
    if (u.bias) args.bias = to_device<Param*>(bias, u.C);
    const DeviceView<T***> y("y", u.B, u.C, u.L);
    args.y = y;
    args.silu = u.silu;
    ssm::causal_conv1d_update(Space(), args);
    const auto [y_ref, state_ref] = reference(u, x, state, w, bias);
    expect_close_as_stored<T>(to_host(y), y_ref, tol, "y");
    EXPECT_EQ(to_host(st), state_ref);  // copies of the inputs
  }
}

// Decoding a sequence one step at a time from a zero state gives the whole
// sequence's forward, and its final state (transposed: [B, K−1, C] there).
TYPED_TEST(ConvUpdate, StepByStepIsTheWholeSequence) {
  using T = TypeParam;
  using Param = kdnn::compute_t<T>;  // the parameters' type
  const double tol = sizeof(T) == 8 ? 1e-13 : 1e-5;
  const int B = 2, L = 9, C = 6, K = 4;
  const auto xs = quantized<T>(normal(std::size_t(B) * L * C, 41));
  const auto w = quantized<Param>(normal(std::size_t(C) * K, 42));
  const auto bias = quantized<Param>(normal(C, 43));
  ssm::ConvForward<T, Space> whole;
  whole.x = to_device<T***>(xs, B, L, C);
  whole.w = to_device<Param**>(w, C, K);
  whole.bias = to_device<Param*>(bias, C);
  const DeviceView<T***> y_whole("y", B, L, C), final_whole("final", B, K - 1, C);
  whole.y = y_whole;
  whole.final_state = final_whole;
  ssm::causal_conv1d_forward(Space(), whole);

  ssm::ConvUpdate<T, Space> step;
  const DeviceView<T***> state("conv_state", B, C, K - 1), y("y", B, C, 1);
  step.conv_state = state;
  step.w = whole.w;
  step.bias = whole.bias;
  step.y = y;
  const auto y_all = to_host(y_whole);
  for (int t = 0; t < L; ++t) {
    std::vector<double> xt(std::size_t(B) * C), expected(xt.size());
    for (int b = 0; b < B; ++b)
      for (int c = 0; c < C; ++c) {
        xt[std::size_t(b) * C + c] = xs[(std::size_t(b) * L + t) * C + c];
        expected[std::size_t(b) * C + c] = y_all[(std::size_t(b) * L + t) * C + c];
      }
    step.x = to_device<T***>(xt, B, C, 1);
    ssm::causal_conv1d_update(Space(), step);
    if constexpr (kdnn::is_float16_storage_v<T>) {  // two roundings of one value
      EXPECT_LE(rounding_error_in_ulps<T>(to_host(y), expected, tol, "y"), 1.0) << "step " << t;
    } else {
      EXPECT_ALLCLOSE(to_host(y), expected, tol, tol) << "step " << t;
    }
  }
  const auto fin = to_host(final_whole), st = to_host(state);
  for (int b = 0; b < B; ++b)
    for (int s = 0; s < K - 1; ++s)
      for (int c = 0; c < C; ++c) {
        EXPECT_EQ(st[(std::size_t(b) * C + c) * (K - 1) + s],
                  fin[(std::size_t(b) * (K - 1) + s) * C + c]);
      }
}

// The serving options, against the peer's formulation: state rows chosen by
// conv_state_indices (rows not chosen stay as they were), and a circular state
// read at slots p − K + 1 … p − 1 and written at p … p + Lnew − 1 (mod W,
// in order), p = cache_seqlens[b]; each alone and both together.
TYPED_TEST(ConvUpdate, StateIndicesAndACircularStateAreThePeers) {
  using T = TypeParam;
  using Param = kdnn::compute_t<T>;  // the parameters' type
  const double tol = sizeof(T) == 8 ? 1e-13 : 1e-5;
  struct ServingCase {
    int B, C, L, W, K, Bs;
    std::vector<int> rows, positions;  // conv_state_indices, cache_seqlens (empty: none)
  };
  const std::vector<ServingCase> cases = {
      {3, 4, 1, 5, 4, 6, {4, 0, 2}, {0, 7, 3}},  // both; one step
      {3, 4, 2, 3, 4, 5, {1, 4, 0}, {}},         // rows only
      {2, 5, 3, 3, 3, 2, {}, {2, 10}},           // circular, several steps
      {2, 3, 7, 4, 2, 2, {}, {1, 5}},            // Lnew > W: the later steps stay
      {1, 3, 2, 0, 1, 1, {}, {3}},               // K = 1, W = 0: no state
  };
  unsigned seed = 61;
  for (const ServingCase& u : cases) {
    SCOPED_TRACE("L=" + std::to_string(u.L) + " W=" + std::to_string(u.W) +
                 " K=" + std::to_string(u.K));
    const auto x = quantized<T>(normal(std::size_t(u.B) * u.C * u.L, seed++));
    const auto state = quantized<T>(normal(std::size_t(u.Bs) * u.C * u.W, seed++));
    const auto w = quantized<Param>(normal(std::size_t(u.C) * u.K, seed++));
    const auto bias = quantized<Param>(normal(u.C, seed++));
    std::vector<double> y_ref(x.size()), state_ref = state;
    for (int b = 0; b < u.B; ++b)
      for (int c = 0; c < u.C; ++c) {
        const int r = u.rows.empty() ? b : u.rows[b];
        double* row = state_ref.data() + (std::size_t(r) * u.C + c) * u.W;
        std::vector<double> xnew;  // the K − 1 steps before x, then x
        if (u.positions.empty()) {
          for (int m = u.W - (u.K - 1); m < u.W; ++m) xnew.push_back(row[m]);
        } else {
          for (int m = 0; m < u.K - 1; ++m)
            xnew.push_back(row[((u.positions[b] - (u.K - 1) + m) % u.W + u.W) % u.W]);
        }
        for (int t = 0; t < u.L; ++t) xnew.push_back(x[(std::size_t(b) * u.C + c) * u.L + t]);
        for (int t = 0; t < u.L; ++t) {
          double z = bias[c];
          for (int k = 0; k < u.K; ++k) z += w[std::size_t(c) * u.K + k] * xnew[t + k];
          y_ref[(std::size_t(b) * u.C + c) * u.L + t] = z / (1 + std::exp(-z));
        }
        if (u.positions.empty()) {
          std::vector<double> all(row, row + u.W);
          for (int t = 0; t < u.L; ++t) all.push_back(xnew[u.K - 1 + t]);
          std::copy(all.end() - u.W, all.end(), row);
        } else {
          for (int t = 0; t < u.L && u.W > 0; ++t)
            row[(u.positions[b] + t) % u.W] = xnew[u.K - 1 + t];
        }
      }
    ssm::ConvUpdate<T, Space> args;
    args.x = to_device<T***>(x, u.B, u.C, u.L);
    const auto st = to_device<T***>(state, u.Bs, u.C, u.W);
    args.conv_state = st;
    args.w = to_device<Param**>(w, u.C, u.K);
    args.bias = to_device<Param*>(bias, u.C);
    const DeviceView<T***> y("y", u.B, u.C, u.L);
    args.y = y;
    const auto ints = [](const std::vector<int>& v) {
      return v.empty() ? DeviceView<int*>()
                       : to_device<int*>(std::vector<double>(v.begin(), v.end()), v.size());
    };
    args.conv_state_indices = ints(u.rows);
    args.cache_seqlens = ints(u.positions);
    ssm::causal_conv1d_update(Space(), args);
    expect_close_as_stored<T>(to_host(y), y_ref, tol, "y");
    EXPECT_EQ(to_host(st), state_ref);  // copies of the inputs
  }
}

TEST(ConvUpdate, EmptyAndBadArguments) {
  const DeviceView<double***> x("x", 2, 3, 1), y("y", 2, 3, 1), state("conv_state", 2, 3, 3);
  const DeviceView<double**> w("w", 3, 4);
  Kokkos::deep_copy(state, 1.0);
  ssm::ConvUpdate<double, Space> a;
  a.x = x, a.conv_state = state, a.w = w, a.y = y;
  // No new step: the state stays.
  a.x = DeviceView<double***>("x0", 2, 3, 0);
  a.y = DeviceView<double***>("y0", 2, 3, 0);
  ssm::causal_conv1d_update(Space(), a);
  for (double v : to_host(state)) EXPECT_EQ(v, 1.0);
  a.x = x, a.y = y;
  // No batch entry: nothing to do.
  ssm::ConvUpdate<double, Space> empty = a;
  empty.x = DeviceView<double***>("x", 0, 3, 1);
  empty.y = DeviceView<double***>("y", 0, 3, 1);
  empty.conv_state = DeviceView<double***>("conv_state", 0, 3, 3);
  ssm::causal_conv1d_update(Space(), empty);

  ssm::ConvUpdate<double, Space> bad = a;
  bad.conv_state = DeviceView<double***>("conv_state", 2, 3, 2);
  EXPECT_KDNN_ERROR(ssm::causal_conv1d_update(Space(), bad),
                    "ssm::causal_conv1d_update: conv_state has extent(2)=2, expected W >= K-1=3");
  bad = a;
  bad.w = DeviceView<double**>("w", 4, 4);
  EXPECT_KDNN_ERROR(ssm::causal_conv1d_update(Space(), bad),
                    "w has extent(0)=4, expected 3 (C, x's extent(1))");
  bad = a;
  bad.y = DeviceView<double***>(state.data(), 2, 3, 1);
  EXPECT_KDNN_ERROR(ssm::causal_conv1d_update(Space(), bad), "outputs y and conv_state overlap");
  bad = a;
  bad.y = DeviceView<double***>(x.data(), 2, 3, 1);
  EXPECT_KDNN_ERROR(ssm::causal_conv1d_update(Space(), bad), "output y overlaps input x");
  // The serving vectors: rows in range and distinct, positions >= 0; the
  // state is left as it was.
  const auto ints = [](const std::vector<double>& v) { return to_device<int*>(v, v.size()); };
  bad = a;
  bad.conv_state_indices = ints({1, 2});
  EXPECT_KDNN_ERROR(
      ssm::causal_conv1d_update(Space(), bad),
      "conv_state_indices[1]=2, expected a state row in [0, 2) (conv_state's extent(0))");
  bad.conv_state_indices = ints({1, 1});
  EXPECT_KDNN_ERROR(
      ssm::causal_conv1d_update(Space(), bad),
      "conv_state_indices[1]=1 is also conv_state_indices[0], expected distinct rows");
  bad.conv_state_indices = ints({-1, 0});
  EXPECT_KDNN_ERROR(ssm::causal_conv1d_update(Space(), bad), "conv_state_indices[0]=-1, expected");
  bad.conv_state_indices = ints({0});
  EXPECT_KDNN_ERROR(ssm::causal_conv1d_update(Space(), bad),
                    "conv_state_indices has extent(0)=1, expected 2 (B, x's extent(0))");
  bad = a;
  bad.cache_seqlens = ints({0, -3});
  EXPECT_KDNN_ERROR(ssm::causal_conv1d_update(Space(), bad),
                    "cache_seqlens[1]=-3, expected a position >= 0");
  for (double v : to_host(state)) EXPECT_EQ(v, 1.0);
}

}  // namespace
