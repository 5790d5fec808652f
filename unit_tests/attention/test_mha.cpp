// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Multi-head attention layer, each test on both attention algorithms (fused
// and unfused): forward against the double-loop reference, every gradient
// against central differences of it (double) and float against double, over
// S != Sk, E_o != E, D != Dv, grouped- and multi-query attention, each bias
// on and off, windows, lengths, causal, fully masked rows, residual, dropout;
// SET vs ADD; empty batches; bad input. Then the two algorithms against each other with dropout,
// and the fused buffers' sizes (no S·Sk term).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "allclose.hpp"
#include "allocation_counter.hpp"
#include "expect_error.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/mha.hpp"
#include "mha_layer.hpp"
#include "mha_reference.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;

/// The layers every accuracy test runs: each feature on its own and mixed.
std::vector<MhaCase> cases() {
  std::vector<MhaCase> all;
  MhaCase c;
  c.name = "plain (S != Sk, E_o != E, D != Dv, all biases)";
  all.push_back(c);
  c.name = "no biases";
  c.bias_q = c.bias_k = c.bias_v = c.bias_o = false;
  all.push_back(c);
  c = MhaCase();
  c.name = "only the key and output biases, one head, scaler 0.3";
  c.bias_q = c.bias_v = false;
  c.H = 1, c.D = 4, c.Dv = 5;
  c.scaler = 0.3;
  all.push_back(c);
  c = MhaCase();
  c.name = "causal with residual";
  c.S = c.Sk = 5;
  c.causal = true;
  c.residual = true;
  all.push_back(c);
  c = MhaCase();
  c.name = "windows, one row fully masked (lo == hi)";
  c.S = 4, c.Sk = 5;
  c.lo = {0, 1, 3, 2};
  c.hi = {2, 4, 3, 5};
  all.push_back(c);
  c = MhaCase();
  c.name = "sequence lengths: a padded query, an entry with no keys, residual";
  c.B = 3, c.S = 4, c.Sk = 3;
  c.seq_q = {4, 2, 3};
  c.seq_k = {3, 1, 0};
  c.residual = true;
  all.push_back(c);
  c = MhaCase();
  c.name = "dropout 0.3";
  c.p = 0.3, c.seed = 1234, c.offset = 5;
  all.push_back(c);
  c = mha_case_with_everything();
  c.name = "everything: causal, windows, lengths, residual, dropout";
  all.push_back(c);
  c = mha_case_with_everything();
  c.name = "grouped-query (H = 4, Hkv = 2) with everything";
  c.H = 4, c.Hkv = 2;
  all.push_back(c);
  c = MhaCase();
  c.name = "multi-query (H = 3, Hkv = 1), dropout 0.25";
  c.H = 3, c.Hkv = 1;
  c.p = 0.25, c.seed = 77;
  all.push_back(c);
  return all;
}

template <class T>
class Mha : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Mha, Types);

TYPED_TEST(Mha, ForwardMatchesTheDoubleReference) {
  using T = TypeParam;
  for (const MhaCase& c : cases()) {
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
  for (const MhaCase& c : cases()) {
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
  for (const MhaCase& c : cases()) {
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
  for (const MhaCase& c : cases()) {
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
  const MhaCase c = cases()[0];
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
  const MhaCase dropout = cases()[6];
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

TEST(MhaErrors, BadInputIsAKdnnErrorNamingTheArgument) {
  using T = double;
  const MhaCase c = cases()[0];
  const MhaData d = MhaData::random(c, 800);
  for (const auto algo : kAlgos) {
    SCOPED_TRACE(name_of(algo));
    DeviceLayer<T> base(c, d, algo);
    const auto forward = [](DeviceLayer<T>& l) { l.forward(); };
    {
      DeviceLayer<T> l = base;
      l.opts.heads = 4;  // H·D = 6 rows
      EXPECT_KDNN_ERROR(
          forward(l), "weights.w_q has extent(0)=6, expected a positive multiple of opts.heads=4");
      l.opts.heads = 0;
      EXPECT_KDNN_ERROR(forward(l), "opts.heads=0, expected at least 1");
    }
    {  // grouped-query attention: Hkv divides H, w_k and w_v have Hkv heads
      DeviceLayer<T> l = base;  // H = 2, D = 3, Dv = 2
      l.opts.kv_heads = 3;
      EXPECT_KDNN_ERROR(forward(l),
                        "opts.kv_heads=3, expected a divisor of opts.heads=2 (or 0: opts.heads)");
      l.opts.kv_heads = -1;
      EXPECT_KDNN_ERROR(forward(l), "opts.kv_heads=-1, expected a divisor of opts.heads=2");
      l.opts.kv_heads = 1;  // w_v [H·Dv = 4, E_v] reads as Hkv·Dv with Dv = 4, w_k as D = 3
      EXPECT_KDNN_ERROR(forward(l),
                        "weights.w_k has extent(0)=6, expected 3 (Hkv·D, D from "
                        "weights.w_q)");
      l.w.w_k = DeviceView<T**>("w_k", c.D, c.Ek);
      EXPECT_KDNN_ERROR(forward(l),
                        "weights.w_o has extent(1)=4, expected 8 (H·Dv, Dv from "
                        "weights.w_v)");
      l.w.w_v = DeviceView<T**>("w_v", c.Dv, c.Ev);
      EXPECT_KDNN_ERROR(forward(l), "weights.b_k has extent(0)=6, expected 3 (Hkv·D)");
      at::MhaShape shape = base.shape();
      shape.kv_heads = 3;
      EXPECT_KDNN_ERROR(at::mha_buffer_sizes(shape),
                        "attention::mha_buffer_sizes: shape.kv_heads=3, expected a divisor of "
                        "shape.heads=2");
    }
    {
      DeviceLayer<T> l = base;
      l.q = DeviceView<T***>("q", c.B, c.S, c.Eq + 1);
      EXPECT_KDNN_ERROR(forward(l), "q has extent(2)=6, expected 5 (E_q, weights.w_q's extent(1))");
      l = base;
      l.v = DeviceView<T***>("v", c.B, c.Sk + 1, c.Ev);
      EXPECT_KDNN_ERROR(forward(l), "v has extent(1)=5, expected 4 (the key length of k)");
      l = base;
      l.w.w_o = DeviceView<T**>("w_o", c.Eo, c.H * c.Dv + 1);
      EXPECT_KDNN_ERROR(forward(l), "weights.w_o has extent(1)=5, expected 4");
      l = base;
      l.w.b_v = DeviceView<T*>("b_v", 3);
      EXPECT_KDNN_ERROR(forward(l), "weights.b_v has extent(0)=3, expected 4 (H·Dv)");
      l = base;
      l.residual = DeviceView<T***>("residual", c.B, c.S + 1, c.Eo);
      EXPECT_KDNN_ERROR(forward(l), "residual has extent(1)=4, expected 3 (same as out)");
    }
    {
      DeviceLayer<T> l = base;
      DeviceView<int*> seq_q("seq_q", c.B);
      Kokkos::deep_copy(seq_q, c.S + 1);
      l.mask.seq_q = seq_q;
      EXPECT_KDNN_ERROR(forward(l), "mask.seq_q[0]=4, expected a value in [0, 3]");
      l = base;
      DeviceView<int*> lo("lo", c.S), hi("hi", c.S);
      Kokkos::deep_copy(lo, 3);
      Kokkos::deep_copy(hi, 2);
      l.mask.lo_win = lo, l.mask.hi_win = hi;
      EXPECT_KDNN_ERROR(forward(l), "mask.lo_win[0]=3 > mask.hi_win[0]=2");
    }
    {
      DeviceLayer<T> l = base;
      l.opts.dropout.p = 1;
      EXPECT_KDNN_ERROR(forward(l), "opts.dropout.p=1, expected a value in [0, 1)");
      l.opts.dropout.p = -0.1;
      EXPECT_KDNN_ERROR(forward(l), "opts.dropout.p=-0.1");
      l = base;
      l.opts.sm_scaler = NAN;
      EXPECT_KDNN_ERROR(forward(l), "opts.sm_scaler=nan, expected a finite value");
    }
    {
      DeviceLayer<T> l = base;
      l.reserve = DeviceView<T*>("reserve", l.reserve.size() - 1);
      EXPECT_KDNN_ERROR(forward(l), "reserve has extent(0)=");
      l = base;
      l.workspace = DeviceView<T*>(base.workspace.data(), base.workspace.size() - 1);
      EXPECT_KDNN_ERROR(forward(l), "workspace has extent(0)=");
    }
    {
      DeviceLayer<T> l = base;
      l.residual = DeviceView<T***>("residual", c.B, c.S, c.Eo);
      l.out = DeviceView<T***>(l.residual.data(), c.B, c.S, c.Eo);
      EXPECT_KDNN_ERROR(forward(l), "output out overlaps input residual");
      l = base;
      l.out = DeviceView<T***>(reinterpret_cast<T*>(l.workspace.data()), c.B, c.S, c.Eo);
      EXPECT_KDNN_ERROR(forward(l), "outputs out and workspace overlap");
    }
    {
      DeviceLayer<T> l = base;
      l.forward();
      l.dq = DeviceView<T***>(l.dout.data(), c.B, c.S, c.Eq);
      EXPECT_KDNN_ERROR(l.backward(), "output dq overlaps input dout");
      l = base;
      l.forward();
      l.dw.w_q = DeviceView<T**>(l.w.w_q.data(), c.H * c.D, c.Eq);
      EXPECT_KDNN_ERROR(l.backward(), "output grads.w_q overlaps input weights.w_q");
      l = base;
      l.forward();
      l.dw.b_o = DeviceView<T*>("db_o", c.Eo);
      l.w.b_o = {};
      EXPECT_KDNN_ERROR(l.backward(), "grads.b_o given but weights.b_o is not");
      l = base;
      l.forward();
      EXPECT_KDNN_ERROR(l.backward(at::WgradMode(7)),
                        "mode=7, expected WgradMode::set or WgradMode::add");
    }
  }
  {
    DeviceLayer<T> l = DeviceLayer<T>(c, d);
    l.opts.algo = at::AttentionAlgo(7);
    EXPECT_KDNN_ERROR(l.forward(),
                      "attention::mha_forward: opts.algo=7, expected AttentionAlgo::fused or "
                      "AttentionAlgo::unfused");
    EXPECT_KDNN_ERROR(l.backward(), "attention::mha_backward_data: opts.algo=7");
    EXPECT_KDNN_ERROR(at::mha_buffer_sizes(l.shape()), "attention::mha_buffer_sizes: shape.algo=7");
    // Buffers sized for the fused layer are too small for the unfused one.
    l.opts.algo = at::AttentionAlgo::unfused;
    EXPECT_KDNN_ERROR(l.forward(), "reserve has extent(0)=");
  }
}

// A scale that is a finite double but not a finite float (the type the
// layer computes in) is an error, not NaN outputs.
TEST(MhaErrors, ScaleNotFiniteInFloatIsAKdnnError) {
  MhaCase c = cases()[0];
  c.bias_q = c.bias_k = false;
  MhaData d = MhaData::random(c, 801);
  for (double& x : d.q) x *= 0.01;  // (1e38·Q)·K stays within float's range
  for (double& x : d.k) x *= 0.01;
  for (const auto algo : kAlgos) {
    SCOPED_TRACE(name_of(algo));
    DeviceLayer<float> l(c, d, algo);
    for (const double scale : {1e39, -1e39}) {
      l.opts.sm_scaler = scale;
      EXPECT_KDNN_ERROR(l.forward(),
                        "e+39, expected a value finite in float (|opts.sm_scaler| <= "
                        "3.40282e+38)");
    }
    l.opts.sm_scaler = 1e38;  // finite in float: fine for these moderate scores
    l.forward();
    const auto o = to_host(l.out);
    EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](double x) { return std::isfinite(x); }));
  }
}

/// Profiling regions named `name` pushed while counting (Kokkos' tools
/// callbacks).
struct RegionCounter {
  static inline std::string name;
  static inline int count = 0;
  static void push(const char* region) { count += name == region; }
  explicit RegionCounter(std::string region) {
    name = std::move(region);
    count = 0;
    Kokkos::Tools::Experimental::set_push_region_callback(&push);
  }
  ~RegionCounter() { Kokkos::Tools::Experimental::set_push_region_callback(nullptr); }
};

// The mask's vectors are checked on the host once per layer call (on a GPU
// each check is a copy to the host that waits for the device), not again by
// the attention the layer runs inside.
TEST(MhaMask, CheckedOncePerLayerCall) {
  MhaCase c = mha_case_with_everything();
  const MhaData d = MhaData::random(c, 810);
  for (const auto algo : kAlgos) {
    SCOPED_TRACE(name_of(algo));
    DeviceLayer<double> l(c, d, algo);
    l.forward();
    l.backward();
    Space().fence();
    RegionCounter checks("kdnn::attention::check_mask");
    l.forward();
    EXPECT_EQ(RegionCounter::count, 1) << "forward";
    l.backward();
    EXPECT_EQ(RegionCounter::count, 2) << "forward and backward";
  }
}

TEST(MhaErrors, NothingIsWrittenWhenACheckFails) {
  using T = double;
  const MhaCase c = cases()[0];
  for (const auto algo : kAlgos) {
    SCOPED_TRACE(name_of(algo));
    DeviceLayer<T> l(c, MhaData::random(c, 900), algo);
    Kokkos::deep_copy(l.out, 5.0);
    l.w.b_o = DeviceView<T*>("b_o", c.Eo + 1);
    EXPECT_KDNN_ERROR(l.forward(), "weights.b_o has extent(0)=5");
    for (double x : to_host(l.out)) EXPECT_EQ(x, 5.0);
    for (double x : to_host(l.reserve)) EXPECT_EQ(x, 0.0);
  }
}

/// Whether fused attention refuses heads of D = Dv on this backend (its
/// team scratch per block grows with D), in its forward or its backward.
bool fused_attention_refuses(int D, bool backward) {
  using T = double;
  DeviceView<T****> q("q", 1, 1, 1, D), k("k", 1, 1, 1, D), v("v", 1, 1, 1, D), o("o", 1, 1, 1, D),
      g("g", 1, 1, 1, D), dq("dq", 1, 1, 1, D), dk("dk", 1, 1, 1, D), dv("dv", 1, 1, 1, D);
  DeviceView<T***> lse("lse", 1, 1, 1);
  try {
    if (backward) {
      at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv);
    } else {
      at::fused_attention_forward(Space(), q, k, v, o, lse);
    }
    Kokkos::fence();
  } catch (const kdnn::Error&) {
    return true;
  }
  return false;
}

/// The smallest D = Dv that fused attention refuses, or 0 if none up to 2^20.
int smallest_refused_head_size(bool backward) {
  int accepted = 0, refused = 64;
  while (!fused_attention_refuses(refused, backward)) {
    if (refused >= (1 << 20)) return 0;
    accepted = refused, refused *= 2;
  }
  while (refused - accepted > 1) {
    const int mid = accepted + (refused - accepted) / 2;
    (fused_attention_refuses(mid, backward) ? refused : accepted) = mid;
  }
  return refused;
}

// Past the team scratch limit the fused path refuses the heads; the layer
// finds that out before it launches anything (nothing written), and the
// unfused path still computes them.
TEST(MhaErrors, FusedScratchLimitIsCheckedBeforeAnythingIsWritten) {
  using T = double;
  for (const bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "backward" : "forward");
    const int D = smallest_refused_head_size(backward);
    if (D == 0) GTEST_SKIP() << "no head size up to 2^20 exceeds this backend's team scratch";
    if (backward && fused_attention_refuses(D, false)) continue;  // the forward case again
    MhaCase c;
    c.B = 1, c.S = 2, c.Sk = 3, c.Eq = c.Ek = c.Ev = c.Eo = 2, c.H = 1, c.D = c.Dv = D;
    c.residual = true;
    const MhaData d = MhaData::random(c, 950);
    DeviceLayer<T> l(c, d);
    for (const auto& x : {l.out, l.dq, l.dk, l.dv, l.dresidual}) Kokkos::deep_copy(x, 5.0);
    if (!backward) {
      EXPECT_KDNN_ERROR(l.forward(), "attention::mha_forward: blocks of");
      for (double x : to_host(l.out)) EXPECT_EQ(x, 5.0);
      for (double x : to_host(l.reserve)) EXPECT_EQ(x, 0.0);
    } else {
      l.forward();
      const auto reserve = to_host(l.reserve);
      EXPECT_KDNN_ERROR(l.backward(), "attention::mha_backward_data: blocks of");
      for (const auto& x : {l.dq, l.dk, l.dv, l.dresidual}) {
        for (double y : to_host(x)) EXPECT_EQ(y, 5.0);
      }
      EXPECT_EQ(to_host(l.reserve), reserve);
    }
    DeviceLayer<T> unfused(c, d, at::AttentionAlgo::unfused);
    unfused.forward(), unfused.backward();
    EXPECT_LT(rel_error(to_host(unfused.out), reference_mha_forward(c, d)), 1e-12);
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
  for (const MhaCase& c : {cases()[6], mha_case_with_everything(), tiles}) {
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
