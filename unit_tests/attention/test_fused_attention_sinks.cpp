// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Attention sinks (one logit per query head joining every row's softmax
// denominator): the forward against a float64 reference that appends the
// sink to each row, in every form, with causal and padding masks, GQA and a
// batch entry without keys; the gradients (dq, dk, dv, dsinks) against
// central differences in float64; a sink of −inf bitwise the same as none;
// the packed form against the dense relation; the checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "central_differences.hpp"
#include "expect_error.hpp"
#include "fused_case.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/fused_attention_varlen.hpp"
#include "random.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Sizes of a case: B, H, Hkv, S, Sk, D, Dv.
struct Shape {
  int B, H, Hkv, S, Sk, D, Dv;
  std::size_t nq() const { return std::size_t(B) * H * S; }
  std::size_t nk() const { return std::size_t(B) * Hkv * Sk; }
};

/// The forward's (and backward's) outputs on the host.
struct Outputs {
  std::vector<double> o, lse, dq, dk, dv, dsinks;
};

/// Runs the forward (and, with g given, the backward) on host inputs.
template <class T>
Outputs run(const Shape& s, const std::vector<double>& q, const std::vector<double>& k,
            const std::vector<double>& v, const std::vector<double>& g,
            const std::vector<double>& sinks, const at::FusedAttentionOptions& opts,
            const at::AttentionMask<Space>& mask) {
  const auto dq_ = to_device<T****>(q, s.B, s.H, s.S, s.D);
  const auto dk_ = to_device<T****>(k, s.B, s.Hkv, s.Sk, s.D);
  const auto dv_ = to_device<T****>(v, s.B, s.Hkv, s.Sk, s.Dv);
  DeviceView<T****> o("o", s.B, s.H, s.S, s.Dv);
  DeviceView<T***> lse("lse", s.B, s.H, s.S);
  DeviceView<T*> sink_view;
  if (!sinks.empty()) sink_view = to_device<T*>(sinks, sinks.size());
  at::fused_attention_forward(
      Space(), at::FusedAttentionForward<T, Space>{dq_, dk_, dv_, o, lse, mask, sink_view}, opts);
  Outputs out{to_host(o), to_host(lse)};
  if (g.empty()) return out;
  DeviceView<T****> gq("dq", s.B, s.H, s.S, s.D), gk("dk", s.B, s.Hkv, s.Sk, s.D),
      gv("dv", s.B, s.Hkv, s.Sk, s.Dv);
  DeviceView<T*> gs;
  if (!sinks.empty()) gs = DeviceView<T*>("dsinks", sinks.size());
  at::fused_attention_backward(Space(),
                               at::FusedAttentionBackward<T, Space>{
                                   dq_, dk_, dv_, o, lse, to_device<T****>(g, s.B, s.H, s.S, s.Dv),
                                   gq, gk, gv, mask, sink_view, gs},
                               opts);
  out.dq = to_host(gq), out.dk = to_host(gk), out.dv = to_host(gv);
  if (!sinks.empty()) out.dsinks = to_host(gs);
  return out;
}

/// O and lse in float64, each row's softmax over its visible keys and the
/// sink of its head: causal (top-left), keys j < seq_k[b], queries
/// i < seq_q[b] (a padded query sees no key).
Outputs reference(const Shape& s, const std::vector<double>& q, const std::vector<double>& k,
                  const std::vector<double>& v, const std::vector<double>& sinks, double scale,
                  const std::vector<int>& seq_q, const std::vector<int>& seq_k) {
  Outputs out{std::vector<double>(s.nq() * s.Dv), std::vector<double>(s.nq())};
  const int group = s.H / s.Hkv;
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.H; ++h) {
      const int g = h / group;
      for (int i = 0; i < s.S; ++i) {
        const std::size_t row = (std::size_t(b) * s.H + h) * s.S + i;
        std::vector<double> score;
        std::vector<int> keys;
        for (int j = 0; i < seq_q[b] && j < std::min(i + 1, seq_k[b]); ++j) {
          double x = 0;
          for (int d = 0; d < s.D; ++d) {
            x += q[row * s.D + d] * k[((std::size_t(b) * s.Hkv + g) * s.Sk + j) * s.D + d];
          }
          score.push_back(scale * x);
          keys.push_back(j);
        }
        double m = sinks[h];
        for (const double x : score) m = std::max(m, x);
        if (m == -kInf) {
          out.lse[row] = -kInf;  // no key and no sink: O's row stays 0
          continue;
        }
        double den = std::exp(sinks[h] - m);
        for (const double x : score) den += std::exp(x - m);
        out.lse[row] = m + std::log(den);
        for (std::size_t c = 0; c < keys.size(); ++c) {
          const double p = std::exp(score[c] - m) / den;
          for (int d = 0; d < s.Dv; ++d) {
            out.o[row * s.Dv + d] +=
                p * v[((std::size_t(b) * s.Hkv + g) * s.Sk + keys[c]) * s.Dv + d];
          }
        }
      }
    }
  }
  return out;
}

template <class T>
class FusedAttentionSinks : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(FusedAttentionSinks, Scalars);

TYPED_TEST(FusedAttentionSinks, EveryFormMatchesAFloat64ReferenceThatAppendsTheSink) {
  using T = TypeParam;
  // Entry 1 has no keys (its rows see only the sink) and padded queries.
  const Shape s{2, 4, 2, 37, 45, 32, 16};
  const std::vector<int> seq_q{37, 20}, seq_k{45, 0};
  const auto q = normal(s.nq() * s.D, 11), k = normal(s.nk() * s.D, 12),
             v = normal(s.nk() * s.Dv, 13);
  const std::vector<double> sinks{0.5, -1.0, 2.0, -kInf};
  at::AttentionMask<Space> mask;
  mask.causal = true;
  mask.seq_q = ints(seq_q), mask.seq_k = ints(seq_k);
  at::FusedAttentionOptions opts;
  opts.scale = 1 / std::sqrt(double(s.D));
  const Outputs ref = reference(s, q, k, v, sinks, opts.scale, seq_q, seq_k);
  const double tol = sizeof(T) == 4 ? 2e-5 : 1e-12;
  for (const auto form : fused_forms()) {
    SCOPED_TRACE("form " + std::to_string(int(form)));
    opts.launch.form = form;
    const Outputs got = run<T>(s, q, k, v, {}, sinks, opts, mask);
    for (std::size_t x = 0; x < ref.o.size(); ++x) {
      ASSERT_NEAR(got.o[x], ref.o[x], tol * (1 + std::abs(ref.o[x]))) << "o[" << x << "]";
    }
    for (std::size_t x = 0; x < ref.lse.size(); ++x) {
      if (ref.lse[x] == -kInf) {
        ASSERT_EQ(got.lse[x], -kInf) << "lse[" << x << "]";
      } else {
        ASSERT_NEAR(got.lse[x], ref.lse[x], tol * (1 + std::abs(ref.lse[x]))) << "lse[" << x << "]";
      }
    }
  }
}

TYPED_TEST(FusedAttentionSinks, MinusInfinityIsBitwiseNoSink) {
  using T = TypeParam;
  const Shape s{2, 4, 2, 33, 40, 16, 8};
  const auto q = normal(s.nq() * s.D, 21), k = normal(s.nk() * s.D, 22),
             v = normal(s.nk() * s.Dv, 23), g = normal(s.nq() * s.Dv, 24);
  at::AttentionMask<Space> mask;
  mask.causal = true;
  at::FusedAttentionOptions opts;
  opts.scale = 0.3;
  opts.softcap = 2.0;
  opts.dropout = {0.2, 5, 1};
  for (const auto form : fused_forms()) {
    SCOPED_TRACE("form " + std::to_string(int(form)));
    opts.launch.form = form;
    const Outputs none = run<T>(s, q, k, v, g, {}, opts, mask);
    const Outputs inf = run<T>(s, q, k, v, g, std::vector<double>(s.H, -kInf), opts, mask);
    EXPECT_EQ(inf.o, none.o);
    EXPECT_EQ(inf.lse, none.lse);
    EXPECT_EQ(inf.dq, none.dq);
    EXPECT_EQ(inf.dk, none.dk);
    EXPECT_EQ(inf.dv, none.dv);
    EXPECT_EQ(inf.dsinks, std::vector<double>(s.H, 0.0));
  }
}

TEST(FusedAttentionSinksGradients, MatchCentralDifferencesInDouble) {
  const Shape s{1, 2, 1, 6, 9, 5, 3};
  std::vector<double> q = normal(s.nq() * s.D, 31), k = normal(s.nk() * s.D, 32),
                      v = normal(s.nk() * s.Dv, 33), sinks{0.3, -0.8};
  const auto g = normal(s.nq() * s.Dv, 34);
  at::AttentionMask<Space> mask;
  mask.causal = true;
  at::FusedAttentionOptions opts;
  opts.scale = 0.6;
  opts.dropout = {0.25, 99, 3};
  for (const auto form : fused_forms()) {
    SCOPED_TRACE("form " + std::to_string(int(form)));
    opts.launch.form = form;
    const auto loss = [&] {
      const auto o = run<double>(s, q, k, v, {}, sinks, opts, mask).o;
      double l = 0;
      for (std::size_t x = 0; x < o.size(); ++x) l += g[x] * o[x];
      return l;
    };
    const Outputs grads = run<double>(s, q, k, v, g, sinks, opts, mask);
    const double h = 1e-6, tol = 1e-7;
    expect_gradient("dq", q, loss, h, grads.dq, tol);
    expect_gradient("dk", k, loss, h, grads.dk, tol);
    expect_gradient("dv", v, loss, h, grads.dv, tol);
    expect_gradient("dsinks", sinks, loss, h, grads.dsinks, tol);
    EXPECT_NE(grads.dsinks, std::vector<double>(s.H, 0.0));
  }
}

// The packed form: each sequence's rows as the dense call's with the sink
// (O·e^{lse}/(e^{lse} + e^{sink}), lse ⊕ sink of the call without), and
// dsinks = −Σ_rows e^{sink − lse}·(dO·O), all from the host.
TEST(FusedAttentionSinksPacked, FollowTheCallWithoutSinks) {
  using T = double;
  const int Tq = 19, Tk = 23, H = 2, Hkv = 1, D = 8, Dv = 4;
  const auto cu_q = to_device<int*>(std::vector<double>{0, 7, 7, 19}, 4);
  const auto cu_k = to_device<int*>(std::vector<double>{0, 10, 12, 23}, 4);
  const auto q = to_device<T***>(normal(std::size_t(Tq) * H * D, 41), Tq, H, D);
  const auto k = to_device<T***>(normal(std::size_t(Tk) * Hkv * D, 42), Tk, Hkv, D);
  const auto v = to_device<T***>(normal(std::size_t(Tk) * Hkv * Dv, 43), Tk, Hkv, Dv);
  const auto dout = to_device<T***>(normal(std::size_t(Tq) * H * Dv, 44), Tq, H, Dv);
  const std::vector<double> host_sinks{0.7, -0.4};
  const auto sinks = to_device<T*>(host_sinks, H);
  at::AttentionMask<Space> mask;
  mask.causal = true;
  at::FusedAttentionOptions opts;
  opts.scale = 0.35;
  DeviceView<T***> o0("o0", Tq, H, Dv), o1("o1", Tq, H, Dv), dq("dq", Tq, H, D),
      dk("dk", Tk, Hkv, D), dv("dv", Tk, Hkv, Dv);
  DeviceView<T**> lse0("lse0", H, Tq), lse1("lse1", H, Tq);
  DeviceView<T*> dsinks("dsinks", H);
  const at::PackedSequences<Space> seqs{cu_q, cu_k};
  at::fused_attention_varlen_forward(
      Space(), at::FusedAttentionVarlenForward<T, Space>{q, k, v, o0, lse0, seqs, mask}, opts);
  at::fused_attention_varlen_forward(
      Space(), at::FusedAttentionVarlenForward<T, Space>{q, k, v, o1, lse1, seqs, mask, sinks},
      opts);
  at::fused_attention_varlen_backward(
      Space(),
      at::FusedAttentionVarlenBackward<T, Space>{q, k, v, o1, lse1, dout, dq, dk, dv, seqs, mask,
                                                 sinks, dsinks},
      opts);
  const auto ho0 = to_host(o0), ho1 = to_host(o1), hl0 = to_host(lse0), hl1 = to_host(lse1),
             hg = to_host(dout), hds = to_host(dsinks);
  std::vector<double> expected_dsinks(H, 0.0);
  for (int h = 0; h < H; ++h) {
    for (int i = 0; i < Tq; ++i) {
      const double l0 = hl0[std::size_t(h) * Tq + i], sink = host_sinks[h];
      const double m = std::max(l0, sink);
      const double lse = m + std::log(std::exp(l0 - m) + std::exp(sink - m));
      EXPECT_NEAR(hl1[std::size_t(h) * Tq + i], lse, 1e-13 * (1 + std::abs(lse))) << h << " " << i;
      double delta = 0;
      for (int d = 0; d < Dv; ++d) {
        const std::size_t x = (std::size_t(i) * H + h) * Dv + d;
        const double expected = ho0[x] * std::exp(l0 - lse);  // 0 for a row without keys
        EXPECT_NEAR(ho1[x], expected, 1e-13) << h << " " << i << " " << d;
        delta += hg[x] * ho1[x];
      }
      expected_dsinks[h] -= std::exp(sink - lse) * delta;
    }
    EXPECT_NEAR(hds[h], expected_dsinks[h], 1e-12 * (1 + std::abs(expected_dsinks[h]))) << h;
  }
}

// No rows (B = 0 or S = 0): the sinks' gradient is 0, written over what
// dsinks held.
TEST(FusedAttentionSinksEdges, NoRowsGiveAZeroGradient) {
  for (const Shape s : {Shape{0, 2, 1, 3, 4, 8, 8}, Shape{2, 2, 1, 0, 4, 8, 8}}) {
    SCOPED_TRACE("B=" + std::to_string(s.B) + ", S=" + std::to_string(s.S));
    DeviceView<double****> q("q", s.B, s.H, s.S, s.D), k("k", s.B, s.Hkv, s.Sk, s.D),
        v("v", s.B, s.Hkv, s.Sk, s.Dv), o("o", s.B, s.H, s.S, s.Dv), g("g", s.B, s.H, s.S, s.Dv),
        dq("dq", s.B, s.H, s.S, s.D), dk("dk", s.B, s.Hkv, s.Sk, s.D),
        dv("dv", s.B, s.Hkv, s.Sk, s.Dv);
    DeviceView<double***> lse("lse", s.B, s.H, s.S);
    const auto sinks = to_device<double*>({0.5, -0.5}, 2);
    const auto dsinks = to_device<double*>({std::nan(""), std::nan("")}, 2);
    at::fused_attention_forward(
        Space(), at::FusedAttentionForward<double, Space>{q, k, v, o, lse, {}, sinks});
    at::fused_attention_backward(Space(), at::FusedAttentionBackward<double, Space>{
                                              q, k, v, o, lse, g, dq, dk, dv, {}, sinks, dsinks});
    EXPECT_EQ(to_host(dsinks), std::vector<double>(2, 0.0));
  }
}

TEST(FusedAttentionSinksErrors, ShapesAndOverlapsAreChecked) {
  DeviceView<float****> q("q", 1, 4, 3, 8), k("k", 1, 2, 5, 8), v("v", 1, 2, 5, 8),
      o("o", 1, 4, 3, 8), g("g", 1, 4, 3, 8), dq("dq", 1, 4, 3, 8), dk("dk", 1, 2, 5, 8),
      dv("dv", 1, 2, 5, 8);
  DeviceView<float***> lse("lse", 1, 4, 3);
  DeviceView<float*> short_sinks("sinks", 3), sinks("sinks", 4), dsinks("dsinks", 4);
  using Forward = at::FusedAttentionForward<float, Space>;
  using Backward = at::FusedAttentionBackward<float, Space>;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), Forward{q, k, v, o, lse, {}, short_sinks}),
                    "sinks has extent(0)=3, expected 4 (H, q's extent(1))");
  EXPECT_KDNN_ERROR(at::fused_attention_forward(
                        Space(), Forward{q, k, v, o, lse, {}, DeviceView<float*>(o.data(), 4)}),
                    "output o overlaps input sinks");
  at::fused_attention_forward(Space(), Forward{q, k, v, o, lse, {}, sinks});
  EXPECT_KDNN_ERROR(at::fused_attention_backward(
                        Space(), Backward{q, k, v, o, lse, g, dq, dk, dv, {}, {}, dsinks}),
                    "dsinks given but sinks not");
  EXPECT_KDNN_ERROR(at::fused_attention_backward(
                        Space(), Backward{q, k, v, o, lse, g, dq, dk, dv, {}, sinks, short_sinks}),
                    "dsinks has extent(0)=3, expected 4 (same as sinks)");
  EXPECT_KDNN_ERROR(
      at::fused_attention_backward(
          Space(),
          Backward{q, k, v, o, lse, g, dq, dk, dv, {}, sinks, DeviceView<float*>(dq.data(), 4)}),
      "outputs dq and dsinks overlap");
  at::fused_attention_backward(Space(),
                               Backward{q, k, v, o, lse, g, dq, dk, dv, {}, sinks, dsinks});
}

}  // namespace
