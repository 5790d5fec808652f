// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Multi-head attention layer, each test on both attention algorithms (fused
// and unfused): forward against the double-loop reference, every gradient
// against central differences of it (double) and float against double, over
// S != Sk, E_o != E, D != Dv, grouped- and multi-query attention, each bias
// on and off, windows, lengths, causal, fully masked rows, residual, dropout;
// SET vs ADD; empty batches. Then the two algorithms against each other with dropout,
// and the fused buffers' sizes (no S·Sk term). Bad input: test_mha_errors.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "allclose.hpp"
#include "allocation_counter.hpp"
#include "kdnn/attention/mha.hpp"
#include "mha_cases.hpp"
#include "mha_layer.hpp"
#include "mha_reference.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;

template <class T>
class Mha : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Mha, Types);

TYPED_TEST(Mha, ForwardMatchesTheDoubleReference) {
  using T = TypeParam;
  for (const MhaCase& c : mha_cases()) {
    const MhaData d = MhaData::random(c, 100);
    const auto expected = reference_mha_forward(c, d);
    for (const auto algo : kAlgos) {
      SCOPED_TRACE(name_of(algo));
      DeviceLayer<T> layer(c, d, algo);
      layer.forward();
      const auto actual = to_host(layer.out);
      if (sizeof(T) == 8) {
        EXPECT_LT(rel_error(actual, expected), 1e-12) << c.name;
      } else {
        EXPECT_ALLCLOSE(actual, expected, 1e-4, 1e-5) << c.name;
        EXPECT_LT(rel_error(actual, expected), 1e-6) << c.name;
      }
    }
  }
}

TEST(MhaDouble, EveryGradientMatchesFiniteDifferences) {
  for (const MhaCase& c : mha_cases()) {
    const MhaData d = MhaData::random(c, 200);
    DeviceLayer<double> fused(c, d, at::AttentionAlgo::fused);
    DeviceLayer<double> unfused(c, d, at::AttentionAlgo::unfused);
    fused.forward(), fused.backward();
    unfused.forward(), unfused.backward();
    const auto grads = fused.gradients(), unfused_grads = unfused.gradients();
    for (std::size_t g = 0; g < grads.size(); ++g) {
      const auto member = grads[g].first;
      const auto fd = reference_gradient(c, d, member);  // once for both algorithms
      EXPECT_ALLCLOSE(grads[g].second, fd, 1e-6, 1e-8) << c.name << ": fused " << name_of(member);
      EXPECT_ALLCLOSE(unfused_grads[g].second, fd, 1e-6, 1e-8)
          << c.name << ": unfused " << name_of(member);
    }
  }
}

TEST(MhaFloat, GradientsMatchTheDoubleLayer) {
  for (const MhaCase& c : mha_cases()) {
    const MhaData d = MhaData::random(c, 300);
    for (const auto algo : kAlgos) {
      SCOPED_TRACE(name_of(algo));
      DeviceLayer<double> ref(c, d, algo);
      DeviceLayer<float> layer(c, d, algo);
      ref.forward(), ref.backward();
      layer.forward(), layer.backward();
      const auto expected = ref.gradients();
      const auto actual = layer.gradients();
      for (std::size_t g = 0; g < actual.size(); ++g) {
        EXPECT_ALLCLOSE(actual[g].second, expected[g].second, 1e-4, 1e-5)
            << c.name << ": " << name_of(actual[g].first);
        if (actual[g].first == &MhaData::bk) continue;  // zero: see KeyBiasGetsNoGradient
        EXPECT_LT(rel_error(actual[g].second, expected[g].second), 1e-5)
            << c.name << ": " << name_of(actual[g].first);
      }
    }
  }
}

// Softmax is shift invariant per row and b_k shifts row i's scores by s·Q_i·b_k,
// so the loss does not depend on b_k: its gradient is round-off.
TYPED_TEST(Mha, KeyBiasGetsNoGradient) {
  using T = TypeParam;
  for (const MhaCase& c : mha_cases()) {
    if (!c.bias_k) continue;
    for (const auto algo : kAlgos) {
      DeviceLayer<T> layer(c, MhaData::random(c, 350), algo);
      layer.forward(), layer.backward();
      for (double g : to_host(layer.dw.b_k)) {
        EXPECT_LT(std::abs(g), sizeof(T) == 8 ? 1e-13 : 1e-5) << c.name << ", " << name_of(algo);
      }
    }
  }
}

TEST(MhaDouble, MaskedRowsGiveTheOutputBiasAndPaddedRowsZero) {
  MhaCase c;
  c.B = 2, c.S = 3, c.Sk = 4;
  c.lo = {0, 2, 1};
  c.hi = {4, 2, 3};  // query 1 sees no key
  c.seq_q = {3, 2};  // entry 1's query 2 is padding
  c.residual = true;
  const MhaData d = MhaData::random(c, 400);
  for (const auto algo : kAlgos) {
    SCOPED_TRACE(name_of(algo));
    DeviceLayer<double> layer(c, d, algo);
    layer.forward();
    layer.backward();
    const auto out = to_host(layer.out);
    for (int b = 0; b < c.B; ++b)
      for (int o = 0; o < c.Eo; ++o) {
        const std::size_t row1 = (std::size_t(b) * c.S + 1) * c.Eo + o;
        EXPECT_DOUBLE_EQ(out[row1], d.bo[o] + d.residual[row1]) << "b=" << b;
      }
    for (int o = 0; o < c.Eo; ++o) EXPECT_EQ(out[(1 * c.S + 2) * c.Eo + o], 0.0);
    const auto dq = to_host(layer.dq), dres = to_host(layer.dresidual);
    for (int e = 0; e < c.Eq; ++e) {
      EXPECT_EQ(dq[(0 * c.S + 1) * c.Eq + e], 0.0);  // fully masked: no gradient
      EXPECT_EQ(dq[(1 * c.S + 2) * c.Eq + e], 0.0);  // padded query
    }
    for (int o = 0; o < c.Eo; ++o) EXPECT_EQ(dres[(1 * c.S + 2) * c.Eo + o], 0.0);
    for (double x : out) EXPECT_TRUE(std::isfinite(x));
  }
}

TYPED_TEST(Mha, AddModeAddsToTheWeightGradients) {
  using T = TypeParam;
  const MhaCase c = mha_cases()[0];
  const MhaData d = MhaData::random(c, 500);
  for (const auto algo : kAlgos) {
    SCOPED_TRACE(name_of(algo));
    DeviceLayer<T> layer(c, d, algo);
    layer.forward();
    layer.backward(at::WgradMode::set);
    const auto once = layer.gradients();
    layer.backward(at::WgradMode::add);
    const auto twice = layer.gradients();
    for (std::size_t g = 3; g < once.size(); ++g) {  // the weights and biases
      std::vector<double> doubled = once[g].second;
      for (double& x : doubled) x *= 2;
      EXPECT_ALLCLOSE(twice[g].second, doubled, 1e-6, 1e-6) << name_of(once[g].first);
    }
  }
}

TYPED_TEST(Mha, DropoutIsIdenticalAcrossRunsAndKeepsAboutOneMinusP) {
  using T = TypeParam;
  const MhaCase dropout = mha_cases()[6];
  const MhaData d = MhaData::random(dropout, 600);
  for (const auto algo : kAlgos) {
    SCOPED_TRACE(name_of(algo));
    MhaCase c = dropout;
    DeviceLayer<T> a(c, d, algo), b(c, d, algo);
    a.forward(), b.forward();
    a.backward(), b.backward();
    EXPECT_EQ(to_host(a.out), to_host(b.out));
    EXPECT_EQ(to_host(a.dq), to_host(b.dq));
    EXPECT_EQ(to_host(a.dw.w_k), to_host(b.dw.w_k));
    c.offset += 1;  // another offset, another mask
    DeviceLayer<T> other(c, d, algo);
    other.forward();
    EXPECT_NE(to_host(a.out), to_host(other.out));
  }
  // The keep rate over a large probability tensor, within 4 sigma.
  MhaCase big;
  big.B = 4, big.S = 64, big.Sk = 96, big.p = 0.25, big.seed = 31;
  std::size_t kept = 0, total = 0;
  for (int b = 0; b < big.B; ++b)
    for (int h = 0; h < big.H; ++h)
      for (int i = 0; i < big.S; ++i)
        for (int j = 0; j < big.Sk; ++j, ++total) kept += reference_keep(big, b, h, i, j);
  const double sigma = std::sqrt(total * big.p * (1 - big.p));
  EXPECT_NEAR(double(kept), total * (1 - big.p), 4 * sigma);
}

TYPED_TEST(Mha, EmptyBatchAndNoKeysAreFine) {
  using T = TypeParam;
  for (const auto algo : kAlgos) {
    SCOPED_TRACE(name_of(algo));
    MhaCase c;
    c.B = 0;
    const MhaData d0 = MhaData::random(c, 700);
    DeviceLayer<T> empty(c, d0, algo);
    empty.forward();
    empty.backward();
    EXPECT_EQ(empty.out.size(), 0u);
    for (double x : to_host(empty.dw.w_q)) EXPECT_EQ(x, 0.0);
    c = MhaCase();
    c.Sk = 0;  // every row fully masked: the output is b_o
    const MhaData d = MhaData::random(c, 701);
    DeviceLayer<T> layer(c, d, algo);
    layer.forward();
    layer.backward();
    const auto out = to_host(layer.out);
    for (std::size_t r = 0; r < out.size(); ++r) EXPECT_EQ(out[r], T(d.bo[r % c.Eo]));
    for (double x : to_host(layer.dq)) EXPECT_EQ(x, 0.0);
    for (double x : to_host(layer.dw.b_o)) EXPECT_TRUE(std::isfinite(x));
  }
}

// Same inputs, same dropout (seed, offset): the same mask on both paths, so
// the fused and the unfused layers agree to rounding, output and gradients;
// the last case spans several query blocks and key tiles of the fused kernel.
TYPED_TEST(Mha, FusedAndUnfusedAgreeWithDropout) {
  using T = TypeParam;
  MhaCase tiles;
  tiles.name = "several blocks: S = 70, Sk = 90, dropout 0.25";
  tiles.B = 2, tiles.S = 70, tiles.Sk = 90, tiles.H = 2, tiles.D = 8, tiles.Dv = 6;
  tiles.Eq = 12, tiles.Ek = 10, tiles.Ev = 9, tiles.Eo = 7;
  tiles.p = 0.25, tiles.seed = 77, tiles.offset = 12;
  tiles.causal = true;
  for (const MhaCase& c : {mha_cases()[6], mha_case_with_everything(), tiles}) {
    ASSERT_GT(c.p, 0.0);
    const MhaData d = MhaData::random(c, 1000);
    DeviceLayer<T> fused(c, d, at::AttentionAlgo::fused);
    DeviceLayer<T> unfused(c, d, at::AttentionAlgo::unfused);
    fused.forward(), fused.backward();
    unfused.forward(), unfused.backward();
    auto actual = fused.gradients(), expected = unfused.gradients();
    actual.push_back({nullptr, to_host(fused.out)});
    expected.push_back({nullptr, to_host(unfused.out)});
    for (std::size_t g = 0; g < actual.size(); ++g) {
      const char* what = actual[g].first ? name_of(actual[g].first) : "out";
      if (actual[g].first == &MhaData::bk) {  // zero but for round-off: KeyBiasGetsNoGradient
        EXPECT_ALLCLOSE(actual[g].second, expected[g].second, 0.0, sizeof(T) == 8 ? 1e-13 : 1e-5)
            << c.name << ": " << what;
      } else if (sizeof(T) == 8) {
        EXPECT_LT(rel_error(actual[g].second, expected[g].second), 1e-12) << c.name << ": " << what;
      } else {
        EXPECT_ALLCLOSE(actual[g].second, expected[g].second, 1e-4, 1e-5) << c.name << ": " << what;
        EXPECT_LT(rel_error(actual[g].second, expected[g].second), 1e-5) << c.name << ": " << what;
      }
    }
  }
}

// The fused layer stores no [B, H, S, Sk] tensor: with S = Sk its buffers
// grow linearly (the unfused ones quadratically, by three such tensors).
TEST(MhaBuffers, FusedSizesHaveNoSTimesSkTerm) {
  const std::size_t B = 2, H = 4;
  const auto total = [&](at::AttentionAlgo algo, std::size_t n) {
    at::MhaShape s{B, n, n, 128, 96, 80, H, 32, 24, 112};
    s.algo = algo;
    const at::MhaBufferSizes sizes = at::mha_buffer_sizes(s);
    return sizes.reserve + sizes.workspace;
  };
  EXPECT_EQ(at::MhaShape().algo, at::AttentionAlgo::fused);
  EXPECT_EQ(at::MhaOptions().algo, at::AttentionAlgo::fused);
  const std::size_t n = 2048, scores = B * H * n * n;
  const std::size_t fused = total(at::AttentionAlgo::fused, n);
  EXPECT_LT(fused, scores / 4);
  EXPECT_EQ(total(at::AttentionAlgo::fused, 2 * n), 2 * fused);
  EXPECT_EQ(total(at::AttentionAlgo::fused, 4 * n), 4 * fused);
  const std::size_t unfused = total(at::AttentionAlgo::unfused, n);
  EXPECT_GT(unfused, 3 * scores);
  EXPECT_EQ(total(at::AttentionAlgo::unfused, 2 * n) - 2 * unfused, 6 * scores);
}

// The three calls allocate nothing beyond the caller's reserve and workspace
// (a backend's team scratch, kept between launches, and a GPU form's few
// counters aside), grouped-query attention included: on the fused path the
// query heads' shares of dK and dV, summed over each group after the
// kernels, are in the workspace.
TEST(MhaBuffers, CallsAllocateNothingBeyondTheBuffers) {
  MhaCase c;
  c.B = 2, c.S = 24, c.Sk = 64, c.H = 4, c.D = 16, c.Dv = 16;
  c.Eq = c.Ek = c.Ev = c.Eo = 8;
  c.causal = true;
  c.p = 0.1;
  for (const int kv_heads : {0, 2, 1}) {
    c.Hkv = kv_heads;
    for (const auto algo : kAlgos) {
      DeviceLayer<double> layer(c, MhaData::random(c, 900), algo);
      layer.forward(), layer.backward();  // warm-up: the backends' scratch pools
      Space().fence();
      AllocationCounter counter;
      layer.forward(), layer.backward();
      Space().fence();
      EXPECT_LE(AllocationCounter::peak, 4096)
          << "Hkv=" << c.kv() << ", " << name_of(algo) << ": " << AllocationCounter::labels;
    }
  }
}

}  // namespace
