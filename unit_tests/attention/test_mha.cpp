// Multi-head attention layer: forward against the double-loop reference,
// every gradient against central differences of it (double) and float
// against double, over S != Sk, E_o != E, D != Dv, each bias on and off,
// windows, lengths, causal, fully masked rows, residual, dropout; SET vs
// ADD; empty batches; bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/attention/mha.hpp"
#include "mha_reference.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;

/// One layer's tensors on the device, and the three calls on them.
template <class T>
struct DeviceLayer {
  MhaCase c;
  at::MhaOptions opts;
  at::AttentionMask<Space> mask;
  at::MhaParams<T, Space> w, dw;
  DeviceView<T***> q, k, v, residual, out, dq, dk, dv, dresidual, dout;
  DeviceView<T*> reserve, workspace;

  DeviceLayer(const MhaCase& cs, const MhaData& d) : c(cs) {
    opts.heads = c.H;
    opts.sm_scaler = c.scaler;
    opts.dropout = {c.p, c.seed, c.offset};
    mask.causal = c.causal;
    const auto ints = [](const std::vector<int>& x) {
      DeviceView<int*> v("mask", x.size());
      auto h = Kokkos::create_mirror_view(v);
      for (std::size_t i = 0; i < x.size(); ++i) h(i) = x[i];
      Kokkos::deep_copy(v, h);
      return v;
    };
    if (!c.lo.empty()) mask.lo_win = ints(c.lo);
    if (!c.hi.empty()) mask.hi_win = ints(c.hi);
    if (!c.seq_q.empty()) mask.seq_q = ints(c.seq_q);
    if (!c.seq_k.empty()) mask.seq_k = ints(c.seq_k);
    q = to_device<T***>(d.q, c.B, c.S, c.Eq);
    k = to_device<T***>(d.k, c.B, c.Sk, c.Ek);
    v = to_device<T***>(d.v, c.B, c.Sk, c.Ev);
    if (c.residual) residual = to_device<T***>(d.residual, c.B, c.S, c.Eo);
    dout = to_device<T***>(d.dout, c.B, c.S, c.Eo);
    w.w_q = to_device<T**>(d.wq, c.H * c.D, c.Eq);
    w.w_k = to_device<T**>(d.wk, c.H * c.D, c.Ek);
    w.w_v = to_device<T**>(d.wv, c.H * c.Dv, c.Ev);
    w.w_o = to_device<T**>(d.wo, c.Eo, c.H * c.Dv);
    dw.w_q = DeviceView<T**>("dw_q", c.H * c.D, c.Eq);
    dw.w_k = DeviceView<T**>("dw_k", c.H * c.D, c.Ek);
    dw.w_v = DeviceView<T**>("dw_v", c.H * c.Dv, c.Ev);
    dw.w_o = DeviceView<T**>("dw_o", c.Eo, c.H * c.Dv);
    if (c.bias_q)
      w.b_q = to_device<T*>(d.bq, c.H * c.D), dw.b_q = DeviceView<T*>("db_q", c.H * c.D);
    if (c.bias_k)
      w.b_k = to_device<T*>(d.bk, c.H * c.D), dw.b_k = DeviceView<T*>("db_k", c.H * c.D);
    if (c.bias_v)
      w.b_v = to_device<T*>(d.bv, c.H * c.Dv), dw.b_v = DeviceView<T*>("db_v", c.H * c.Dv);
    if (c.bias_o) w.b_o = to_device<T*>(d.bo, c.Eo), dw.b_o = DeviceView<T*>("db_o", c.Eo);
    out = DeviceView<T***>("out", c.B, c.S, c.Eo);
    dq = DeviceView<T***>("dq", c.B, c.S, c.Eq);
    dk = DeviceView<T***>("dk", c.B, c.Sk, c.Ek);
    dv = DeviceView<T***>("dv", c.B, c.Sk, c.Ev);
    if (c.residual) dresidual = DeviceView<T***>("dresidual", c.B, c.S, c.Eo);
    const auto sizes = at::mha_buffer_sizes(shape());
    reserve = DeviceView<T*>("reserve", sizes.reserve);
    workspace = DeviceView<T*>("workspace", sizes.workspace);
  }

  at::MhaShape shape() const {
    at::MhaShape s;
    s.batch = c.B, s.seq_q = c.S, s.seq_k = c.Sk;
    s.q_size = c.Eq, s.k_size = c.Ek, s.v_size = c.Ev;
    s.heads = c.H, s.head_dim = c.D, s.v_head_dim = c.Dv, s.o_size = c.Eo;
    return s;
  }

  void forward() {
    at::mha_forward(Space(), opts, mask, w, q, k, v, residual, out, reserve, workspace);
  }
  void backward(at::WgradMode mode = at::WgradMode::set) {
    at::mha_backward_data(Space(), opts, mask, w, dout, dq, dk, dv, dresidual, reserve, workspace);
    at::mha_backward_weights(Space(), opts, w, q, k, v, dw, mode, reserve);
  }

  /// Every gradient, by the MhaData member it is the gradient of.
  std::vector<std::pair<std::vector<double> MhaData::*, std::vector<double>>> gradients() const {
    std::vector<std::pair<std::vector<double> MhaData::*, std::vector<double>>> g = {
        {&MhaData::q, to_host(dq)},      {&MhaData::k, to_host(dk)},
        {&MhaData::v, to_host(dv)},      {&MhaData::wq, to_host(dw.w_q)},
        {&MhaData::wk, to_host(dw.w_k)}, {&MhaData::wv, to_host(dw.w_v)},
        {&MhaData::wo, to_host(dw.w_o)}};
    if (c.bias_q) g.push_back({&MhaData::bq, to_host(dw.b_q)});
    if (c.bias_k) g.push_back({&MhaData::bk, to_host(dw.b_k)});
    if (c.bias_v) g.push_back({&MhaData::bv, to_host(dw.b_v)});
    if (c.bias_o) g.push_back({&MhaData::bo, to_host(dw.b_o)});
    if (c.residual) g.push_back({&MhaData::residual, to_host(dresidual)});
    return g;
  }
};

const char* name_of(std::vector<double> MhaData::*x) {
  if (x == &MhaData::q) return "dq";
  if (x == &MhaData::k) return "dk";
  if (x == &MhaData::v) return "dv";
  if (x == &MhaData::wq) return "dw_q";
  if (x == &MhaData::wk) return "dw_k";
  if (x == &MhaData::wv) return "dw_v";
  if (x == &MhaData::wo) return "dw_o";
  if (x == &MhaData::bq) return "db_q";
  if (x == &MhaData::bk) return "db_k";
  if (x == &MhaData::bv) return "db_v";
  if (x == &MhaData::bo) return "db_o";
  return "dresidual";
}

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
  c = MhaCase();
  c.name = "everything: causal, windows, lengths, residual, dropout";
  c.B = 2, c.S = 5, c.Sk = 6, c.H = 3, c.D = 2, c.Dv = 3;
  c.causal = true;
  c.lo = {0, 0, 1, 2, 4};
  c.hi = {3, 6, 6, 4, 6};
  c.seq_q = {5, 3};
  c.seq_k = {6, 4};
  c.residual = true;
  c.p = 0.2, c.seed = 99;
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
    DeviceLayer<T> layer(c, d);
    layer.forward();
    const auto expected = reference_mha_forward(c, d);
    const auto actual = to_host(layer.out);
    if (sizeof(T) == 8) {
      EXPECT_LT(rel_error(actual, expected), 1e-12) << c.name;
    } else {
      EXPECT_ALLCLOSE(actual, expected, 1e-4, 1e-5) << c.name;
      EXPECT_LT(rel_error(actual, expected), 1e-6) << c.name;
    }
  }
}

TEST(MhaDouble, EveryGradientMatchesFiniteDifferences) {
  for (const MhaCase& c : cases()) {
    const MhaData d = MhaData::random(c, 200);
    DeviceLayer<double> layer(c, d);
    layer.forward();
    layer.backward();
    for (const auto& [member, grad] : layer.gradients()) {
      const auto fd = reference_gradient(c, d, member);
      EXPECT_ALLCLOSE(grad, fd, 1e-6, 1e-8) << c.name << ": " << name_of(member);
    }
  }
}

TEST(MhaFloat, GradientsMatchTheDoubleLayer) {
  for (const MhaCase& c : cases()) {
    const MhaData d = MhaData::random(c, 300);
    DeviceLayer<double> ref(c, d);
    DeviceLayer<float> layer(c, d);
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

// Softmax is shift invariant per row and b_k shifts row i's scores by s·Q_i·b_k,
// so the loss does not depend on b_k: its gradient is round-off.
TYPED_TEST(Mha, KeyBiasGetsNoGradient) {
  using T = TypeParam;
  for (const MhaCase& c : cases()) {
    if (!c.bias_k) continue;
    DeviceLayer<T> layer(c, MhaData::random(c, 350));
    layer.forward(), layer.backward();
    for (double g : to_host(layer.dw.b_k)) EXPECT_LT(std::abs(g), sizeof(T) == 8 ? 1e-13 : 1e-5);
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
  DeviceLayer<double> layer(c, d);
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

TYPED_TEST(Mha, AddModeAddsToTheWeightGradients) {
  using T = TypeParam;
  const MhaCase c = cases()[0];
  const MhaData d = MhaData::random(c, 500);
  DeviceLayer<T> layer(c, d);
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

TYPED_TEST(Mha, DropoutIsIdenticalAcrossRunsAndKeepsAboutOneMinusP) {
  using T = TypeParam;
  MhaCase c = cases()[6];
  const MhaData d = MhaData::random(c, 600);
  DeviceLayer<T> a(c, d), b(c, d);
  a.forward(), b.forward();
  a.backward(), b.backward();
  EXPECT_EQ(to_host(a.out), to_host(b.out));
  EXPECT_EQ(to_host(a.dq), to_host(b.dq));
  EXPECT_EQ(to_host(a.dw.w_k), to_host(b.dw.w_k));
  c.offset += 1;  // another offset, another mask
  DeviceLayer<T> other(c, d);
  other.forward();
  EXPECT_NE(to_host(a.out), to_host(other.out));
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
  MhaCase c;
  c.B = 0;
  const MhaData d0 = MhaData::random(c, 700);
  DeviceLayer<T> empty(c, d0);
  empty.forward();
  empty.backward();
  EXPECT_EQ(empty.out.size(), 0u);
  for (double x : to_host(empty.dw.w_q)) EXPECT_EQ(x, 0.0);
  c = MhaCase();
  c.Sk = 0;  // every row fully masked: the output is b_o
  const MhaData d = MhaData::random(c, 701);
  DeviceLayer<T> layer(c, d);
  layer.forward();
  layer.backward();
  const auto out = to_host(layer.out);
  for (std::size_t r = 0; r < out.size(); ++r) EXPECT_EQ(out[r], T(d.bo[r % c.Eo]));
  for (double x : to_host(layer.dq)) EXPECT_EQ(x, 0.0);
  for (double x : to_host(layer.dw.b_o)) EXPECT_TRUE(std::isfinite(x));
}

TEST(MhaErrors, BadInputIsAKdnnErrorNamingTheArgument) {
  using T = double;
  const MhaCase c = cases()[0];
  const MhaData d = MhaData::random(c, 800);
  DeviceLayer<T> base(c, d);
  const auto forward = [](DeviceLayer<T>& l) { l.forward(); };
  {
    DeviceLayer<T> l = base;
    l.opts.heads = 4;  // H·D = 6 rows
    EXPECT_KDNN_ERROR(forward(l),
                      "weights.w_q has extent(0)=6, expected a positive multiple of opts.heads=4");
    l.opts.heads = 0;
    EXPECT_KDNN_ERROR(forward(l), "opts.heads=0, expected at least 1");
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

TEST(MhaErrors, NothingIsWrittenWhenACheckFails) {
  using T = double;
  const MhaCase c = cases()[0];
  DeviceLayer<T> l(c, MhaData::random(c, 900));
  Kokkos::deep_copy(l.out, 5.0);
  l.w.b_o = DeviceView<T*>("b_o", c.Eo + 1);
  EXPECT_KDNN_ERROR(l.forward(), "weights.b_o has extent(0)=5");
  for (double x : to_host(l.out)) EXPECT_EQ(x, 5.0);
  for (double x : to_host(l.reserve)) EXPECT_EQ(x, 0.0);
}

}  // namespace
