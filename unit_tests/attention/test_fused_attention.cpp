// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Fused attention forward: O against the unfused path (masked softmax,
// dropout, batched GEMM) and lse against a double-precision log-sum-exp,
// for every mask, S and Sk not multiples of the block sizes, D from 4 to
// 256, D != Dv, and dropout on and off; the backward against the unfused
// chain and run to run; the memory the fused calls allocate.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "allclose.hpp"
#include "allocation_counter.hpp"
#include "central_differences.hpp"
#include "expect_error.hpp"
#include "fused_case.hpp"
#include "kdnn/attention/batched_gemm.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/impl/fused_attention_impl.hpp"
#include "mha_reference.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;

std::vector<FusedCase> fused_cases() {
  return {
      {"plain, S and Sk not block multiples", 2, 2, 37, 70, 16, 16, false, {}, {}, {}, {}, 0},
      {"D != Dv, causal", 1, 3, 65, 65, 16, 8, true, {}, {}, {}, {}, 0},
      {"lengths: padded queries, an entry without keys",
       3,
       1,
       20,
       33,
       8,
       8,
       false,
       {},
       {},
       {20, 7, 13},
       {33, 0, 9},
       0},
      {"windows with empty rows",
       1,
       2,
       5,
       9,
       4,
       4,
       false,
       {0, 3, 3, 8, 0},
       {9, 3, 7, 9, 1},
       {},
       {},
       0},
      {"dropout 0.2, causal, S > Sk", 2, 2, 40, 24, 16, 12, true, {}, {}, {}, {}, 0.2},
      {"D = 64", 1, 2, 70, 130, 64, 64, false, {}, {}, {}, {}, 0},
      {"D = 128, dropout", 1, 1, 40, 50, 128, 128, false, {}, {}, {}, {}, 0.1},
      {"D = 256, Dv = 128, causal", 1, 1, 33, 40, 256, 128, true, {}, {}, {}, {}, 0},
      // Several blocks each way, so that tiles every query of a block sees
      // whole (no mask applied) mix with masked ones in one head.
      {"causal, several blocks", 1, 2, 150, 150, 16, 16, true, {}, {}, {}, {}, 0},
      {"key lengths, several blocks", 2, 1, 140, 140, 16, 16, false, {}, {}, {}, {140, 100}, 0},
      // Head sizes of the GPU forms (D and Dv each in {32, 64, 128, 256}).
      {"D = 32, causal, several blocks", 1, 2, 150, 140, 32, 32, true, {}, {}, {}, {}, 0},
      {"D = 64, lengths, an entry without keys",
       3,
       1,
       70,
       90,
       64,
       64,
       false,
       {},
       {},
       {70, 5, 33},
       {90, 0, 41},
       0},
      {"D = 128, windows with empty rows, dropout",
       1,
       2,
       9,
       40,
       128,
       128,
       false,
       {0, 5, 10, 39, 0, 20, 40, 3, 0},
       {40, 5, 30, 40, 1, 38, 40, 35, 12},
       {},
       {},
       0.3},
      {"D = 256, causal, S > Sk", 1, 1, 40, 20, 256, 256, true, {}, {}, {}, {}, 0},
      {"D = 32, one query and one key, dropout", 2, 1, 1, 1, 32, 32, false, {}, {}, {}, {}, 0.5},
      // GPU forms with D != Dv: values wider and narrower than the keys.
      {"D = 32, Dv = 128, causal, S > Sk", 1, 2, 70, 45, 32, 128, true, {}, {}, {}, {}, 0},
      {"D = 128, Dv = 64, lengths, dropout",
       2,
       1,
       40,
       50,
       128,
       64,
       false,
       {},
       {},
       {40, 17},
       {50, 23},
       0.2},
      {"D = 64, Dv = 256, several blocks", 1, 1, 100, 70, 64, 256, false, {}, {}, {}, {}, 0},
  };
}

/// Random q, k, v and dO (g) of a case on the device, from seeds seed,
/// seed + 1, seed + 2, seed + 3 (seed advances by 4); k and v with
/// `kv_heads` heads (0: the case's H).
template <class T>
std::array<DeviceView<T****>, 4> random_inputs(const FusedCase& c, unsigned& seed,
                                               int kv_heads = 0) {
  const int Hkv = kv_heads > 0 ? kv_heads : c.H;
  const std::size_t nq = std::size_t(c.B) * c.H * c.S, nk = std::size_t(c.B) * Hkv * c.Sk;
  const auto q = to_device<T****>(normal(nq * c.D, seed), c.B, c.H, c.S, c.D);
  const auto k = to_device<T****>(normal(nk * c.D, seed + 1), c.B, Hkv, c.Sk, c.D);
  const auto v = to_device<T****>(normal(nk * c.Dv, seed + 2), c.B, Hkv, c.Sk, c.Dv);
  const auto g = to_device<T****>(normal(nq * c.Dv, seed + 3), c.B, c.H, c.S, c.Dv);
  seed += 4;
  return {q, k, v, g};
}

/// o, lse, dq, dk and dv of one fused forward and backward.
template <class T>
std::vector<std::vector<double>> fused_outputs(const DeviceView<T****>& q,
                                               const DeviceView<T****>& k,
                                               const DeviceView<T****>& v,
                                               const DeviceView<T****>& g,
                                               const at::FusedAttentionOptions& opts,
                                               const at::AttentionMask<Space>& mask) {
  const int B = int(q.extent(0)), H = int(q.extent(1)), S = int(q.extent(2)), D = int(q.extent(3)),
            Sk = int(k.extent(2)), Dv = int(v.extent(3));
  DeviceView<T****> o("o", B, H, S, Dv), dq("dq", B, H, S, D), dk("dk", B, H, Sk, D),
      dv("dv", B, H, Sk, Dv);
  DeviceView<T***> lse("lse", B, H, S);
  at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
  at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, opts, mask);
  return {to_host(o), to_host(lse), to_host(dq), to_host(dk), to_host(dv)};
}

/// The unfused chain's gradients: P, dropout, dV = Pdᵀ·dO, dPd = dO·Vᵀ, dP,
/// dS, dQ, dK.
template <class T>
void unfused_backward(const DeviceView<T****>& q, const DeviceView<T****>& k,
                      const DeviceView<T****>& v, const DeviceView<T****>& g,
                      const at::FusedAttentionOptions& opts, const at::AttentionMask<Space>& mask,
                      const DeviceView<T****>& dq2, const DeviceView<T****>& dk2,
                      const DeviceView<T****>& dv2) {
  const int B = int(q.extent(0)), H = int(q.extent(1)), S = int(q.extent(2)), Sk = int(k.extent(2));
  const auto shape4 = [&](const char* name) {
    return DeviceView<T****>(std::string(name), B, H, S, Sk);
  };
  auto scores = shape4("scores"), P = shape4("P"), Pd = shape4("Pd"), dPd = shape4("dPd"),
       dP = shape4("dP"), dS = shape4("dS");
  const auto none = at::Op::none, tr = at::Op::transpose;
  at::batched_gemm(Space(), none, tr, none, T(1), q, k, T(0), scores);
  at::softmax_forward(Space(), scores, P, {at::SoftmaxMode::accurate, opts.scale}, mask);
  at::dropout_forward(Space(), P, Pd, opts.dropout);
  at::batched_gemm(Space(), tr, none, none, T(1), Pd, g, T(0), dv2);
  at::batched_gemm(Space(), none, tr, none, T(1), g, v, T(0), dPd);
  at::dropout_backward(Space(), dPd, dP, opts.dropout);
  at::softmax_backward(Space(), P, dP, dS, {at::SoftmaxMode::accurate, opts.scale}, mask);
  at::batched_gemm(Space(), none, none, none, T(1), dS, k, T(0), dq2);
  at::batched_gemm(Space(), tr, none, none, T(1), dS, q, T(0), dk2);
}

template <class T>
class FusedAttention : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(FusedAttention, Types);

// Each form of the forward (KernelForm::host; ::gpu: the GPU form for D and
// Dv in {32, 64, 128, 256}, the host kernel under a GPU launch for other
// sizes; ::tensor_cores: its form for D and Dv in {32, 64, 128}, the GPU
// form's choice for others) against the unfused path.
TYPED_TEST(FusedAttention, ForwardMatchesTheUnfusedPath) {
  using T = TypeParam;
  unsigned seed = 1;
  for (const FusedCase& c : fused_cases()) {
    const auto q =
        to_device<T****>(normal(std::size_t(c.B) * c.H * c.S * c.D, seed++), c.B, c.H, c.S, c.D);
    const auto k =
        to_device<T****>(normal(std::size_t(c.B) * c.H * c.Sk * c.D, seed++), c.B, c.H, c.Sk, c.D);
    const auto v = to_device<T****>(normal(std::size_t(c.B) * c.H * c.Sk * c.Dv, seed++), c.B, c.H,
                                    c.Sk, c.Dv);
    for (const auto form : fused_forms()) {
      SCOPED_TRACE(std::string(c.name) + form_suffix(form));
      const at::AttentionMask<Space> mask = mask_of(c);
      const at::FusedAttentionOptions opts = case_options(c, 77, 5, form);
      DeviceView<T****> o("o", c.B, c.H, c.S, c.Dv);
      DeviceView<T***> lse("lse", c.B, c.H, c.S);
      at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);

      // The unfused path: scores, masked softmax, dropout, P·V.
      DeviceView<T****> scores("scores", c.B, c.H, c.S, c.Sk), P("P", c.B, c.H, c.S, c.Sk),
          Pd("Pd", c.B, c.H, c.S, c.Sk), o2("o2", c.B, c.H, c.S, c.Dv);
      at::batched_gemm(Space(), at::Op::none, at::Op::transpose, at::Op::none, T(1), q, k, T(0),
                       scores);
      at::softmax_forward(Space(), scores, P, {at::SoftmaxMode::accurate, opts.scale}, mask);
      at::dropout_forward(Space(), P, Pd, opts.dropout);
      at::batched_gemm(Space(), at::Op::none, at::Op::none, at::Op::none, T(1), Pd, v, T(0), o2);
      const double tol = sizeof(T) == 8 ? 1e-13 : 1e-5;
      EXPECT_ALLCLOSE(to_host(o), to_host(o2), tol, tol) << c.name;

      // lse: log Σ exp over the visible scaled scores, in double.
      const auto s = to_host(scores);
      const auto l = to_host(lse);
      MhaCase mc;
      mc.causal = c.causal, mc.lo = c.lo, mc.hi = c.hi, mc.seq_q = c.seq_q, mc.seq_k = c.seq_k;
      for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.H; ++h)
          for (int i = 0; i < c.S; ++i) {
            double m = -INFINITY, sum = 0;
            const std::size_t row = ((std::size_t(b) * c.H + h) * c.S + i) * c.Sk;
            for (int j = 0; j < c.Sk; ++j)
              if (reference_visible(mc, b, i, j)) m = std::max(m, opts.scale * s[row + j]);
            for (int j = 0; j < c.Sk; ++j)
              if (reference_visible(mc, b, i, j)) sum += std::exp(opts.scale * s[row + j] - m);
            const double got = l[(std::size_t(b) * c.H + h) * c.S + i];
            if (sum == 0) {
              EXPECT_EQ(got, -INFINITY) << c.name << " row " << i;
            } else {
              EXPECT_NEAR(got, m + std::log(sum), 10 * tol * (1 + std::abs(m))) << c.name;
            }
          }
    }
  }
}

// Grouped-query attention (Hkv < H key/value heads, query head h reading
// head h / (H / Hkv)), in every form: o, lse and dq equal, bitwise, those of
// multi-head attention on k and v with each head repeated for its group, and
// dk and dv the sums of the repeated heads' gradients in head order.
TYPED_TEST(FusedAttention, GroupedKeyValueHeadsAreTheirHeadsRepeated) {
  using T = TypeParam;
  struct Grouped {
    FusedCase c;
    int Hkv;
  };
  const std::vector<Grouped> cases = {
      {{"GQA 4:2, causal, dropout", 2, 4, 37, 50, 16, 16, true, {}, {}, {}, {}, 0.2}, 2},
      {{"MQA 3:1, key lengths", 2, 3, 40, 33, 32, 32, false, {}, {}, {}, {33, 9}, 0}, 1},
      {{"GQA 6:3, D = 64, windows",
        1,
        6,
        5,
        9,
        64,
        64,
        false,
        {0, 3, 3, 8, 0},
        {9, 3, 7, 9, 1},
        {},
        {},
        0},
       3},
      {{"GQA 4:1, D = 128, Dv = 64, several blocks",
        1,
        4,
        100,
        90,
        128,
        64,
        true,
        {},
        {},
        {},
        {},
        0.1},
       1},
  };
  unsigned seed = 11;
  for (const Grouped& g : cases) {
    const FusedCase& c = g.c;
    const int G = c.H / g.Hkv;
    const auto inputs = random_inputs<T>(c, seed, g.Hkv);  // lambdas below take them
    const DeviceView<T****>&q = inputs[0], &k = inputs[1], &v = inputs[2], &dout = inputs[3];
    // k and v with head h / G copied to head h.
    const auto repeated = [&](const DeviceView<T****>& x) {
      DeviceView<T****> r("repeated", c.B, c.H, x.extent(2), x.extent(3));
      for (int h = 0; h < c.H; ++h) {
        Kokkos::deep_copy(Kokkos::subview(r, Kokkos::ALL, h, Kokkos::ALL, Kokkos::ALL),
                          Kokkos::subview(x, Kokkos::ALL, h / G, Kokkos::ALL, Kokkos::ALL));
      }
      return r;
    };
    const auto k_rep = repeated(k), v_rep = repeated(v);
    for (const auto form : fused_forms()) {
      SCOPED_TRACE(std::string(c.name) + form_suffix(form));
      const at::AttentionMask<Space> mask = mask_of(c);
      const at::FusedAttentionOptions opts = case_options(c, 19, 3, form);
      const auto run = [&](const DeviceView<T****>& kk, const DeviceView<T****>& vv) {
        std::array<DeviceView<T****>, 4> out = {
            DeviceView<T****>("o", c.B, c.H, c.S, c.Dv),
            DeviceView<T****>("dq", c.B, c.H, c.S, c.D),
            DeviceView<T****>("dk", kk.extent(0), kk.extent(1), c.Sk, c.D),
            DeviceView<T****>("dv", vv.extent(0), vv.extent(1), c.Sk, c.Dv)};
        DeviceView<T***> lse("lse", c.B, c.H, c.S);
        at::fused_attention_forward(Space(), q, kk, vv, out[0], lse, opts, mask);
        at::fused_attention_backward(Space(), q, kk, vv, out[0], lse, dout, out[1], out[2], out[3],
                                     opts, mask);
        return std::pair(out, to_host(lse));
      };
      const auto [grouped, lse] = run(k, v);
      const auto [heads, lse_heads] = run(k_rep, v_rep);
      EXPECT_EQ(to_host(grouped[0]), to_host(heads[0])) << "o";
      EXPECT_EQ(lse, lse_heads) << "lse";
      EXPECT_EQ(to_host(grouped[1]), to_host(heads[1])) << "dq";
      for (int x : {2, 3}) {
        const auto per_head = to_host(heads[x]);  // [B, H, Sk, ·]
        const std::size_t row = c.Sk * heads[x].extent(3);
        std::vector<double> sums(per_head.size() / G);
        for (std::size_t e = 0; e < sums.size(); ++e) {
          const std::size_t first = e / row * G * row + e % row;
          T sum = T(per_head[first]);
          for (int r = 1; r < G; ++r) sum += T(per_head[first + r * row]);
          sums[e] = sum;
        }
        EXPECT_EQ(to_host(grouped[x]), sums) << (x == 2 ? "dk" : "dv");
      }
    }
  }
}

// A score cap: o and lse of every form against a double loop of
// softmax(cap·tanh(scale·q·k/cap), masked)·v; the gradients of every form
// against the host form's (the host form's against finite differences:
// FusedAttentionGradients).
TYPED_TEST(FusedAttention, SoftcapIsTheSoftmaxOfTheCappedScores) {
  using T = TypeParam;
  const FusedCase c{
      "softcap 2.5, causal, dropout", 2, 2, 20, 37, 32, 32, true, {}, {}, {}, {}, 0.1};
  unsigned seed = 71;
  const auto inputs = random_inputs<T>(c, seed);
  const auto q = to_host(inputs[0]), k = to_host(inputs[1]), v = to_host(inputs[2]);
  const double cap = 2.5, scale = 3 / std::sqrt(double(c.D));  // scores well past the cap
  std::vector<std::vector<double>> host;
  for (const auto form : fused_forms()) {
    SCOPED_TRACE(std::string(c.name) + form_suffix(form));
    at::FusedAttentionOptions opts = case_options(c, 5, 1, form);
    opts.scale = scale;
    opts.softcap = cap;
    opts.dropout.p = 0;  // the reference has no dropout; dropout is in the gradients below
    const auto out = fused_outputs<T>(inputs[0], inputs[1], inputs[2], inputs[3], opts, mask_of(c));
    const double tol = sizeof(T) == 8 ? 1e-12 : 2e-5;
    std::vector<double> o_ref(out[0].size()), lse_ref(out[1].size());
    for (int bh = 0; bh < c.B * c.H; ++bh)
      for (int i = 0; i < c.S; ++i) {
        std::vector<double> p(c.Sk, 0.0);
        double m = -INFINITY;
        for (int j = 0; j <= i && j < c.Sk; ++j) {
          double dot = 0;
          for (int d = 0; d < c.D; ++d)
            dot += q[(std::size_t(bh) * c.S + i) * c.D + d] *
                   k[(std::size_t(bh) * c.Sk + j) * c.D + d];
          p[j] = cap * std::tanh(scale * dot / cap);
          m = std::max(m, p[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i && j < c.Sk; ++j) sum += (p[j] = std::exp(p[j] - m));
        lse_ref[std::size_t(bh) * c.S + i] = m + std::log(sum);
        for (int d = 0; d < c.Dv; ++d) {
          double acc = 0;
          for (int j = 0; j <= i && j < c.Sk; ++j)
            acc += p[j] / sum * v[(std::size_t(bh) * c.Sk + j) * c.Dv + d];
          o_ref[(std::size_t(bh) * c.S + i) * c.Dv + d] = acc;
        }
      }
    EXPECT_ALLCLOSE(out[0], o_ref, tol, tol) << "o";
    EXPECT_ALLCLOSE(out[1], lse_ref, tol, tol) << "lse";
    opts.dropout.p = c.p;
    const auto grads =
        fused_outputs<T>(inputs[0], inputs[1], inputs[2], inputs[3], opts, mask_of(c));
    if (host.empty()) host = grads;
    for (int x = 2; x < 5; ++x) EXPECT_ALLCLOSE(grads[x], host[x], 10 * tol, 10 * tol) << x;
  }
}

/// O [B, H, S, Dv] and lse [B, H, S] in double of the case's inputs (one
/// key/value head per query head) with scale `scale`, cap `cap` (0: none),
/// `bias(b, h, i, j)` added to the capped scores, and the keys j for which
/// `seen(b, i, j)`: −inf and zeros for a query that sees none.
template <class Bias, class Seen>
std::array<std::vector<double>, 2> reference_outputs(
    const FusedCase& c, const std::vector<double>& q, const std::vector<double>& k,
    const std::vector<double>& v, double scale, double cap, const Bias& bias, const Seen& seen) {
  std::vector<double> o(std::size_t(c.B) * c.H * c.S * c.Dv, 0.0),
      lse(std::size_t(c.B) * c.H * c.S, -INFINITY);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.H; ++h) {
      const std::size_t bh = std::size_t(b) * c.H + h;
      for (int i = 0; i < c.S; ++i) {
        std::vector<double> p(c.Sk, 0.0);
        double m = -INFINITY;
        for (int j = 0; j < c.Sk; ++j) {
          if (!seen(b, i, j)) continue;
          double dot = 0;
          for (int d = 0; d < c.D; ++d)
            dot += q[(bh * c.S + i) * c.D + d] * k[(bh * c.Sk + j) * c.D + d];
          const double x = scale * dot;
          p[j] = (cap > 0 ? cap * std::tanh(x / cap) : x) + bias(b, h, i, j);
          m = std::max(m, p[j]);
        }
        if (m == -INFINITY) continue;  // no key
        double sum = 0;
        for (int j = 0; j < c.Sk; ++j) sum += (p[j] = seen(b, i, j) ? std::exp(p[j] - m) : 0.0);
        lse[bh * c.S + i] = m + std::log(sum);
        for (int d = 0; d < c.Dv; ++d) {
          double acc = 0;
          for (int j = 0; j < c.Sk; ++j) acc += p[j] / sum * v[(bh * c.Sk + j) * c.Dv + d];
          o[(bh * c.S + i) * c.Dv + d] = acc;
        }
      }
    }
  return {o, lse};
}

/// Expects `lse` close to `want` where that is finite and −inf where it is.
inline void expect_lse(std::vector<double> lse, std::vector<double> want, double tol) {
  for (std::size_t x = 0; x < lse.size(); ++x) {
    if (want[x] == -INFINITY) {  // a query that sees no key
      EXPECT_EQ(lse[x], -INFINITY) << x;
      lse[x] = want[x] = 0;
    }
  }
  EXPECT_ALLCLOSE(lse, want, tol, tol) << "lse";
}

// ALiBi: O and lse are the softmax of the scores plus
// −slope·|i + Sk_b − S_b − j| (flash-attn's bottom-right alignment, with
// each entry's own lengths), capped first where a cap is set; slopes one
// row for every entry or one per entry. The gradients of every form
// against the host form's (the host form's against finite differences:
// FusedAttentionGradients).
TYPED_TEST(FusedAttention, AlibiAddsTheSlopeTimesTheDistanceToEveryScore) {
  using T = TypeParam;
  struct AlibiCase {
    FusedCase c;
    bool per_entry;  // slopes [B, H], else [1, H]
    double cap;
  };
  const std::vector<AlibiCase> cases = {
      {{"alibi, S < Sk, padded entries", 2, 3, 20, 37, 32, 32, false, {}, {}, {20, 13}, {37, 9}, 0},
       true,
       0.0},
      {{"alibi, causal, S > Sk, softcap, dropout", 1, 2, 41, 30, 32, 32, true, {}, {}, {}, {}, 0.1},
       false,
       1.5},
  };
  unsigned seed = 83;
  for (const auto& a : cases) {
    const FusedCase& c = a.c;
    const auto inputs = random_inputs<T>(c, seed);
    const auto q = to_host(inputs[0]), k = to_host(inputs[1]), v = to_host(inputs[2]);
    const int rows = a.per_entry ? c.B : 1;
    std::vector<double> slopes(std::size_t(rows) * c.H);
    for (std::size_t x = 0; x < slopes.size(); ++x)
      slopes[x] = std::ldexp(1.0, -int(x % 4)) + 0.1 * x;
    auto mask = mask_of(c);
    mask.alibi_slopes = to_device<double**>(slopes, rows, c.H);
    const auto length = [&](const std::vector<int>& given, int b, int all) {
      return given.empty() ? all : given[b];
    };
    const auto want = reference_outputs(
        c, q, k, v, 1 / std::sqrt(double(c.D)), a.cap,
        [&](int b, int h, int i, int j) {
          const double slope = slopes[std::size_t(a.per_entry ? b : 0) * c.H + h];
          return -slope * std::abs(i + length(c.seq_k, b, c.Sk) - length(c.seq_q, b, c.S) - j);
        },
        [&](int b, int i, int j) {
          return i < length(c.seq_q, b, c.S) && j < length(c.seq_k, b, c.Sk) &&
                 (!c.causal || j <= i);
        });
    std::vector<std::vector<double>> host;
    for (const auto form : fused_forms()) {
      SCOPED_TRACE(std::string(c.name) + form_suffix(form));
      at::FusedAttentionOptions opts = case_options(c, 5, 1, form);
      opts.softcap = a.cap;
      opts.dropout.p = 0;  // the reference has no dropout; dropout is in the gradients below
      const auto out = fused_outputs<T>(inputs[0], inputs[1], inputs[2], inputs[3], opts, mask);
      const double tol = sizeof(T) == 8 ? 1e-12 : 2e-5;
      EXPECT_ALLCLOSE(out[0], want[0], tol, tol) << "o";
      expect_lse(out[1], want[1], tol);
      opts.dropout.p = c.p;
      const auto grads = fused_outputs<T>(inputs[0], inputs[1], inputs[2], inputs[3], opts, mask);
      if (form == kdnn::KernelForm::host) host = grads;
      for (int x = 2; x < 5; ++x) EXPECT_ALLCLOSE(grads[x], host[x], 10 * tol, 10 * tol) << x;
    }
  }
}

// A band (mask.band_left, band_right) is the window of keys around each
// query's diagonal key i + Sk_b − S_b (flash-attn's window_size, bottom-right
// aligned): without lengths, bitwise the results of the same keys given as
// per-query windows, in every form, forward and backward; with each entry's
// lengths, its own diagonal, against the double reference.
TYPED_TEST(FusedAttention, BandIsTheWindowAroundEachQuerysBottomRightDiagonal) {
  using T = TypeParam;
  unsigned seed = 89;
  const std::vector<std::pair<int, int>> bands = {{-1, 0}, {5, 3}, {0, -1}, {7, 0}, {-1, -1}};
  for (const auto& [S, Sk] : {std::pair{20, 37}, std::pair{41, 30}}) {
    const FusedCase c{"band", 2, 2, S, Sk, 32, 32, false, {}, {}, {}, {}, 0.1};
    const auto inputs = random_inputs<T>(c, seed);
    for (const auto& band : bands) {
      at::AttentionMask<Space> with_band;
      with_band.band_left = band.first, with_band.band_right = band.second;
      std::vector<double> lo(S), hi(S);
      for (int i = 0; i < S; ++i) {
        const int d = i + Sk - S;
        hi[i] = band.second < 0 ? Sk : std::clamp(d + band.second + 1, 0, Sk);
        lo[i] = band.first < 0 ? 0 : std::clamp(d - band.first, 0, int(hi[i]));
      }
      at::AttentionMask<Space> with_windows;
      with_windows.lo_win = to_device<int*>(lo, S), with_windows.hi_win = to_device<int*>(hi, S);
      for (const auto form : fused_forms()) {
        SCOPED_TRACE(std::to_string(S) + "x" + std::to_string(Sk) + " band (" +
                     std::to_string(band.first) + ", " + std::to_string(band.second) + ")" +
                     form_suffix(form));
        const auto opts = case_options(c, 3, 2, form);
        const auto [a, b] = std::pair{
            fused_outputs<T>(inputs[0], inputs[1], inputs[2], inputs[3], opts, with_band),
            fused_outputs<T>(inputs[0], inputs[1], inputs[2], inputs[3], opts, with_windows)};
        for (int x = 0; x < 5; ++x) EXPECT_EQ(a[x], b[x]) << x;
      }
    }
  }
  const FusedCase c{
      "band, padded entries", 2, 2, 20, 37, 32, 32, false, {}, {}, {20, 13}, {37, 9}, 0};
  const auto inputs = random_inputs<T>(c, seed);
  const auto q = to_host(inputs[0]), k = to_host(inputs[1]), v = to_host(inputs[2]);
  auto mask = mask_of(c);
  mask.band_left = 4, mask.band_right = 0;
  const auto want = reference_outputs(
      c, q, k, v, 1 / std::sqrt(double(c.D)), 0.0, [](int, int, int, int) { return 0.0; },
      [&](int b, int i, int j) {
        const int d = i + c.seq_k[b] - c.seq_q[b];
        return i < c.seq_q[b] && j < c.seq_k[b] && j >= d - 4 && j <= d;
      });
  for (const auto form : fused_forms()) {
    SCOPED_TRACE(std::string(c.name) + form_suffix(form));
    const auto out = fused_outputs<T>(inputs[0], inputs[1], inputs[2], inputs[3],
                                      case_options(c, 1, 1, form), mask);
    const double tol = sizeof(T) == 8 ? 1e-12 : 2e-5;
    EXPECT_ALLCLOSE(out[0], want[0], tol, tol) << "o";
    expect_lse(out[1], want[1], tol);
  }
}

// The slopes' extents and values are checked at the call; the operators
// that add no bias (the softmax, the layer) refuse them. So is a band's
// bound below −1.
TEST(FusedAttentionAlibi, RefusesSlopesOfTheWrongShapeOrSizeAndOperatorsWithoutTheBias) {
  const int B = 2, H = 3, S = 5, Sk = 7, D = 4;
  DeviceView<double****> q("q", B, H, S, D), k("k", B, H, Sk, D), v("v", B, H, Sk, D),
      o("o", B, H, S, D);
  DeviceView<double***> lse("lse", B, H, S);
  const auto with = [&](const std::vector<double>& values, int rows, int cols) {
    at::AttentionMask<Space> mask;
    mask.alibi_slopes = to_device<double**>(values, rows, cols);
    return mask;
  };
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, {}, with({1, 1}, 1, 2)),
                    "mask.alibi_slopes has extents 1x2, expected 1x3 or 2x3");
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, {},
                                                with(std::vector<double>(9, 1), 3, 3)),
                    "mask.alibi_slopes has extents 3x3");
  EXPECT_KDNN_ERROR(
      at::fused_attention_forward(Space(), q, k, v, o, lse, {}, with({1, NAN, 1}, 1, 3)),
      "mask.alibi_slopes(0, 1)=nan, expected a finite slope");
  EXPECT_KDNN_ERROR(
      at::fused_attention_forward(Space(), q, k, v, o, lse, {}, with({1, 1e38, 1}, 1, 3)),
      "mask.alibi_slopes(0, 1)=1e+38, expected a finite slope with |slope|");
  DeviceView<double****> dq("dq", B, H, S, D), dk("dk", B, H, Sk, D), dv("dv", B, H, Sk, D);
  EXPECT_KDNN_ERROR(
      at::fused_attention_backward(Space(), q, k, v, o, lse, o, dq, dk, dv, {}, with({1, 1}, 1, 2)),
      "fused_attention_backward: mask.alibi_slopes has extents 1x2");
  DeviceView<double****> x("x", B, H, S, Sk), y("y", B, H, S, Sk);
  EXPECT_KDNN_ERROR(at::softmax_forward(Space(), x, y, {}, with({1, 1, 1}, 1, 3)),
                    "softmax_forward: mask.alibi_slopes is given (extents 1x3), expected none");
  at::AttentionMask<Space> band;
  band.band_right = -2;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, {}, band),
                    "mask.band_right=-2, expected -1 (no bound) or a key count >= 0");
  // Sizes past the band's int arithmetic (no data: B = 0).
  band.band_right = 0;
  const int big = (1 << 28) + 1;
  DeviceView<double****> bq("bq", 0, 1, big, 4), bk("bk", 0, 1, big, 4), bv("bv", 0, 1, big, 4),
      bo("bo", 0, 1, big, 4);
  DeviceView<double***> blse("blse", 0, 1, big);
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), bq, bk, bv, bo, blse, {}, band),
                    "with S + Sk = 536870914, expected S + Sk <= 2^29");
}

// The GPU forms run where the launch asks for them (always with
// KernelForm::gpu, on a GPU backend with automatic) for D and Dv up to
// their largest compiled head size (the next larger compiled size, the
// extra columns masked); the tensor-core forms where asked for, or
// automatically on a device that has tensor cores, for D and Dv each up to
// 128 (rounded up likewise), the GPU forms' choice for larger sizes. Their
// team scratch
// fits a CUDA team's 48 KiB of level 0 for every pair of them, so on a GPU
// they never take a team workspace.
TEST(FusedAttentionGpuForm, RunsForTheCompiledHeadSizesWithinOnChipScratch) {
  using kdnn::KernelForm;
  const bool gpu = !kdnn::impl::BackendTraits<Space>::is_host;
  const bool tensor_cores = kdnn::impl::has_tensor_cores(Space());
  const auto compiled = [](int d) { return d > 0 && d <= 256; };  // rounded up
  const auto mma = [](int d) { return d > 0 && d <= 128; };       // rounded up
  at::FusedAttentionOptions opts;
  for (int D : {16, 32, 48, 64, 128, 256, 512}) {
    for (int Dv : {8, 32, 64, 96, 128, 256}) {
      const std::string pair = "D=" + std::to_string(D) + ", Dv=" + std::to_string(Dv);
      const bool both = compiled(D) && compiled(Dv);
      const bool both_mma = mma(D) && mma(Dv);
      const KernelForm gpu_or_host = both ? KernelForm::gpu : KernelForm::host;
      const KernelForm backward_double =
          both && D <= 128 && Dv <= 128 ? KernelForm::gpu : KernelForm::host;
      const auto forward = [&] {
        return at::impl::forward_form<Space, float>(Space(), opts, D, Dv);
      };
      const auto backward = [&](auto t) {
        return at::impl::backward_form<Space, decltype(t)>(Space(), opts, D, Dv);
      };
      opts.launch.form = KernelForm::gpu;
      EXPECT_EQ(forward(), gpu_or_host) << pair;
      EXPECT_EQ(backward(0.0f), gpu_or_host) << pair;
      // The backward in double: not where either head is past 128 (off-chip).
      EXPECT_EQ(backward(0.0), backward_double) << pair;
      opts.launch.form = KernelForm::tensor_cores;
      EXPECT_EQ(forward(), both_mma ? KernelForm::tensor_cores : gpu_or_host) << pair;
      EXPECT_EQ(backward(0.0), both_mma ? KernelForm::tensor_cores : backward_double) << pair;
      opts.launch.form = KernelForm::automatic;
      EXPECT_EQ(forward(), both_mma && tensor_cores ? KernelForm::tensor_cores
                           : gpu                    ? gpu_or_host
                                                    : KernelForm::host)
          << pair;
      opts.launch.form = KernelForm::host;
      EXPECT_EQ(forward(), KernelForm::host) << pair;
      EXPECT_EQ(backward(0.0f), KernelForm::host) << pair;
    }
  }
  const std::size_t level0 = 48 * 1024 - kdnn::impl::kScratchAlign;
  const auto check = [&](auto sizes) {
    constexpr int D = decltype(sizes)::values[0], Dv = decltype(sizes)::values[1];
    SCOPED_TRACE("D=" + std::to_string(D) + ", Dv=" + std::to_string(Dv));
    EXPECT_LE((at::impl::FusedForwardGpuKernel<Space, float, D, Dv>::scratch_bytes()), level0);
    EXPECT_LE((at::impl::FusedForwardGpuKernel<Space, double, D, Dv>::scratch_bytes()), level0);
    EXPECT_LE((at::impl::FusedBackwardKVGpuKernel<Space, float, D, Dv>::scratch_bytes()), level0);
    EXPECT_LE((at::impl::FusedBackwardQGpuKernel<Space, float, D, Dv>::scratch_bytes()), level0);
    if constexpr (D != 256 && Dv != 256) {
      EXPECT_LE((at::impl::FusedBackwardKVGpuKernel<Space, double, D, Dv>::scratch_bytes()),
                level0);
      EXPECT_LE((at::impl::FusedBackwardQGpuKernel<Space, double, D, Dv>::scratch_bytes()), level0);
    }
  };
  int pairs = 0;
  for (int D : {32, 64, 128, 256}) {
    for (int Dv : {32, 64, 128, 256}) {
      at::impl::FlashHeadPairs::dispatch(std::array<int, 2>{D, Dv}, kdnn::impl::SizeMatch::exact,
                                         [&](auto sizes) {
                                           EXPECT_EQ(decltype(sizes)::values[0], D);
                                           EXPECT_EQ(decltype(sizes)::values[1], Dv);
                                           check(sizes);
                                           ++pairs;
                                         });
    }
  }
  EXPECT_EQ(pairs, 16);

  // The tensor-core forms, within the 40,936 bytes of level 0 that Kokkos
  // 4.6 lets a CUDA team use.
  int mma_pairs = 0;
  for (int D : {32, 64, 128}) {
    for (int Dv : {32, 64, 128}) {
      at::impl::MmaHeadPairs::dispatch(
          std::array<int, 2>{D, Dv}, kdnn::impl::SizeMatch::exact, [&](auto sizes) {
            constexpr int HD = decltype(sizes)::values[0], HDV = decltype(sizes)::values[1];
            constexpr auto full = kdnn::impl::MmaPrecision::full;
            SCOPED_TRACE("D=" + std::to_string(HD) + ", Dv=" + std::to_string(HDV));
            const auto fits = [](std::size_t bytes) { return bytes <= 40936; };
            EXPECT_TRUE(fits(
                at::impl::FusedForwardMmaKernel<Space, float, HD, HDV, full>::scratch_bytes()));
            EXPECT_TRUE(fits(
                at::impl::FusedForwardMmaKernel<Space, double, HD, HDV, full>::scratch_bytes()));
            EXPECT_TRUE(fits(
                at::impl::FusedBackwardMmaKernel<Space, float, HD, HDV, full>::scratch_bytes()));
            EXPECT_TRUE(fits(
                at::impl::FusedBackwardMmaKernel<Space, double, HD, HDV, full>::scratch_bytes()));
            ++mma_pairs;
          });
    }
  }
  EXPECT_EQ(mma_pairs, 9);
}

// Head sizes between the compiled ones (those of real models: 80, 96, 160,
// 192; D != Dv either way) run the GPU and tensor-core forms at the next
// larger compiled pair (the tensor-core forms up to 128, the GPU forms
// beyond), the extra columns zero in their tiles and never stored: forward
// and backward agree with the host form's, with a causal mask,
// grouped-query heads and dropout, and the columns of o, dq, dk and dv past
// the call's own (the rest of wider tensors) keep their values.
TYPED_TEST(FusedAttention, HeadSizesBetweenCompiledOnesRoundUpOnTheGpuForms) {
  using T = TypeParam;
  using kdnn::KernelForm;
  unsigned seed = 700;
  const int pad = 8;  // extra columns of the wider outputs
  for (const auto& sizes : std::vector<std::pair<int, int>>{
           {80, 80}, {96, 96}, {160, 160}, {192, 192}, {96, 40}, {40, 160}}) {
    const int D = sizes.first, Dv = sizes.second;  // named: lambdas take them
    const std::string pair = "D=" + std::to_string(D) + ", Dv=" + std::to_string(Dv);
    SCOPED_TRACE(pair);
    const FusedCase c{"", 2, 4, 37, 45, D, Dv, true, {}, {}, {}, {}, 0.1};
    const auto in = random_inputs<T>(c, seed, 2);  // two query heads per k/v head
    const DeviceView<T****>&q = in[0], &k = in[1], &v = in[2], &g = in[3];
    const at::AttentionMask<Space> mask = mask_of(c);
    const auto run = [&](KernelForm form) {
      const at::FusedAttentionOptions opts = case_options(c, 11, 3, form);
      // Outputs as the first columns of wider tensors filled with 7.
      const auto wide = [&](const char* name, int rows, int cols) {
        DeviceView<T****> all(std::string(name), c.B, c.H, rows, cols + pad);
        Kokkos::deep_copy(all, T(7));
        return all;
      };
      const auto first = [](const DeviceView<T****>& all, int cols) {
        return Kokkos::subview(all, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL, std::make_pair(0, cols));
      };
      auto o_all = wide("o", c.S, Dv), dq_all = wide("dq", c.S, D);
      DeviceView<T****> dk_all("dk", c.B, 2, c.Sk, D + pad), dv_all("dv", c.B, 2, c.Sk, Dv + pad);
      Kokkos::deep_copy(dk_all, T(7));
      Kokkos::deep_copy(dv_all, T(7));
      DeviceView<T***> lse("lse", c.B, c.H, c.S);
      const auto o = first(o_all, Dv);
      at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
      at::fused_attention_backward(Space(), q, k, v, o, lse, g, first(dq_all, D), first(dk_all, D),
                                   first(dv_all, Dv), opts, mask);
      return std::vector<std::vector<double>>{to_host(o_all), to_host(lse), to_host(dq_all),
                                              to_host(dk_all), to_host(dv_all)};
    };
    const bool wide = std::max(D, Dv) > 128;
    const auto form_of = [&](KernelForm asked) {
      const at::FusedAttentionOptions opts = case_options(c, 11, 3, asked);
      return std::pair{at::impl::forward_form<Space, T>(Space(), opts, D, Dv),
                       at::impl::backward_form<Space, T>(Space(), opts, D, Dv)};
    };
    // The double backward's GPU form stops at 128 (its tiles' scratch).
    const KernelForm gpu_backward = sizeof(T) > 4 && wide ? KernelForm::host : KernelForm::gpu;
    EXPECT_EQ(form_of(KernelForm::gpu), std::pair(KernelForm::gpu, gpu_backward));
    EXPECT_EQ(form_of(KernelForm::tensor_cores),
              wide ? std::pair(KernelForm::gpu, gpu_backward)
                   : std::pair(KernelForm::tensor_cores, KernelForm::tensor_cores));
    const auto host = run(KernelForm::host);
    // The tensor-core forms' float products are 3×TF32: float's accuracy.
    const double tol = sizeof(T) == 8 ? 1e-12 : 2e-5;
    const char* names[] = {"o", "lse", "dq", "dk", "dv"};
    for (const KernelForm form : {KernelForm::gpu, KernelForm::tensor_cores}) {
      SCOPED_TRACE(form_suffix(form));
      const auto got = run(form);
      for (int x = 0; x < 5; ++x) EXPECT_ALLCLOSE(got[x], host[x], tol, tol) << names[x];
      // The columns past the call's: still 7.
      const auto past_untouched = [&](const std::vector<double>& all, int cols, const char* name) {
        const int width = cols + pad;
        for (std::size_t e = 0; e < all.size(); ++e) {
          if (int(e % width) >= cols && all[e] != 7) {
            ADD_FAILURE() << name << " element " << e << " past column " << cols << " is "
                          << all[e];
            return;
          }
        }
      };
      past_untouched(got[0], Dv, "o");
      past_untouched(got[2], D, "dq");
      past_untouched(got[3], D, "dk");
      past_untouched(got[4], Dv, "dv");
    }
  }
}

// Each form (KernelForm::host, ::gpu and ::tensor_cores, each for the head
// sizes it has, the next form down for others), each schedule, against the
// unfused chain and bitwise run to run.
TYPED_TEST(FusedAttention, BackwardMatchesTheUnfusedPathAndIsReproducible) {
  using T = TypeParam;
  unsigned seed = 100;
  for (const FusedCase& c : fused_cases()) {
    const auto [q, k, v, g] = random_inputs<T>(c, seed);
    const at::AttentionMask<Space> mask = mask_of(c);
    at::FusedAttentionOptions opts;
    opts.scale = 0.7 / std::sqrt(double(c.D));
    opts.dropout = {c.p, 1234, 9};
    DeviceView<T****> dq2("dq2", c.B, c.H, c.S, c.D), dk2("dk2", c.B, c.H, c.Sk, c.D),
        dv2("dv2", c.B, c.H, c.Sk, c.Dv);
    unfused_backward(q, k, v, g, opts, mask, dq2, dk2, dv2);
    const double tol = sizeof(T) == 8 ? 1e-12 : 2e-5;
    for (const auto form : fused_forms()) {
      opts.launch.form = form;
      DeviceView<T****> o("o", c.B, c.H, c.S, c.Dv);
      DeviceView<T***> lse("lse", c.B, c.H, c.S);
      at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
      for (const auto schedule :
           {at::FusedBackwardSchedule::automatic, at::FusedBackwardSchedule::per_head,
            at::FusedBackwardSchedule::per_key_block}) {
        const std::string name =
            std::string(c.name) + form_suffix(form) + ", schedule " + std::to_string(int(schedule));
        at::FusedAttentionOptions forced = opts;
        forced.backward = schedule;
        DeviceView<T****> dq("dq", c.B, c.H, c.S, c.D), dk("dk", c.B, c.H, c.Sk, c.D),
            dv("dv", c.B, c.H, c.Sk, c.Dv), dq4("dq4", c.B, c.H, c.S, c.D),
            dk4("dk4", c.B, c.H, c.Sk, c.D), dv4("dv4", c.B, c.H, c.Sk, c.Dv);
        at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, forced, mask);
        at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq4, dk4, dv4, forced, mask);
        EXPECT_ALLCLOSE(to_host(dq), to_host(dq2), tol, tol) << name;
        EXPECT_ALLCLOSE(to_host(dk), to_host(dk2), tol, tol) << name;
        EXPECT_ALLCLOSE(to_host(dv), to_host(dv2), tol, tol) << name;
        EXPECT_EQ(to_host(dq), to_host(dq4)) << name;
        EXPECT_EQ(to_host(dk), to_host(dk4)) << name;
        EXPECT_EQ(to_host(dv), to_host(dv4)) << name;
      }
    }
  }
}

// Scales so large that every softmax row is one-hot (P exactly 1 at the
// row's largest score, 0 elsewhere): the unfused chain's dS is then exactly
// 0 (Σ_j P_ij dP_ij = dP_i,argmax), and the fused backward must agree. It
// did not while it recomputed the scores as scale·(q·k) instead of the
// forward's (scale·q)·k: the two differ by ~eps·|s|, a huge error in the
// exponent (dq, dk off by 140% at 1e15, NaN from 1e18), nor on a GPU,
// whose compiler contracted the forward's and the backward's products into
// FMAs differently (NaN at 1e18; also on a host built with -mfma) until
// both took multiply_add. With dropout too: a one-hot row's dS' is 0 by
// construction (p = 1), not through δ = dO·O, which equals dPd·keep_scale
// only to rounding. q and k are moderate, so scale·q stays finite (also at
// −1e300).
TEST(FusedAttentionHugeScale, BackwardMatchesTheUnfusedPathInDouble) {
  using T = double;
  unsigned seed = 300;
  for (const FusedCase& c : fused_cases()) {
    const auto [q, k, v, g] = random_inputs<T>(c, seed);
    const at::AttentionMask<Space> mask = mask_of(c);
    for (const double scale : {1e12, 1e15, 1e18, -1e300}) {
      at::FusedAttentionOptions opts;
      opts.scale = scale;
      DeviceView<T****> o("o", c.B, c.H, c.S, c.Dv), dq2("dq2", c.B, c.H, c.S, c.D),
          dk2("dk2", c.B, c.H, c.Sk, c.D), dv2("dv2", c.B, c.H, c.Sk, c.Dv);
      DeviceView<T***> lse("lse", c.B, c.H, c.S);
      unfused_backward(q, k, v, g, opts, mask, dq2, dk2, dv2);
      // Every form of the forward: the GPU form's scores are team_gemm's
      // sums (blocks of 16, in order), the tensor-core form's its
      // fragments' (which its backward recomputes as S and as Sᵀ), so the
      // backward's recomputed scores equal them bitwise and one-hot rows
      // have P = 1 exactly.
      for (const auto form : fused_forms()) {
        opts.launch.form = form;
        at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
        for (const auto schedule :
             {at::FusedBackwardSchedule::per_head, at::FusedBackwardSchedule::per_key_block}) {
          std::ostringstream scale_text;
          scale_text << scale;
          const std::string name =
              std::string(c.name) + ", scale " + scale_text.str() + form_suffix(form) +
              (schedule == at::FusedBackwardSchedule::per_head ? ", per_head" : ", per_key_block");
          at::FusedAttentionOptions forced = opts;
          forced.backward = schedule;
          DeviceView<T****> dq("dq", c.B, c.H, c.S, c.D), dk("dk", c.B, c.H, c.Sk, c.D),
              dv("dv", c.B, c.H, c.Sk, c.Dv);
          at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, forced, mask);
          for (const auto& x : {to_host(dq), to_host(dk), to_host(dv)}) {
            EXPECT_TRUE(std::all_of(x.begin(), x.end(), [](double y) { return std::isfinite(y); }))
                << name;
          }
          EXPECT_ALLCLOSE(to_host(dq), to_host(dq2), 1e-12, 1e-12) << name;
          EXPECT_ALLCLOSE(to_host(dk), to_host(dk2), 1e-12, 1e-12) << name;
          EXPECT_ALLCLOSE(to_host(dv), to_host(dv2), 1e-12, 1e-12) << name;
        }
      }
    }
  }
}

// Finite differences in double: L = Σ G∘O through the fused forward against
// the fused backward's dq, dk, dv (causal, dropout, S != Sk, odd sizes).
/// One precision's results for a case's inputs.
struct Float32Run {
  std::vector<double> o, dq, dk, dv;
};

/// C[h] = op(A[h])·op(B[h]) for `heads` matrices, op(A) [M, K] (A stored
/// [K, M] when ta), op(B) [K, N] (B stored [N, K] when tb), in float and
/// summed as a BLAS kernel with vector accumulators sums: product k goes to
/// partial sum k mod 16, and the 16 partial sums are added at the end. A
/// float32 computation in another order than kdnn's, and the same in every
/// build (not whatever BLAS the build's GEMM calls).
std::vector<double> float_bmm(int heads, int M, int N, int K, const std::vector<double>& A, bool ta,
                              const std::vector<double>& B, bool tb) {
  std::vector<double> C(std::size_t(heads) * M * N);
  for (int h = 0; h < heads; ++h) {
    const double* a = A.data() + std::size_t(h) * M * K;
    const double* b = B.data() + std::size_t(h) * K * N;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        float lanes[16] = {};
        for (int k = 0; k < K; ++k) {
          lanes[k % 16] += float(ta ? a[std::size_t(k) * M + i] : a[std::size_t(i) * K + k]) *
                           float(tb ? b[std::size_t(j) * K + k] : b[std::size_t(k) * N + j]);
        }
        float sum = 0;
        for (const float lane : lanes) sum += lane;
        C[(std::size_t(h) * M + i) * N + j] = sum;
      }
  }
  return C;
}

/// The case in T: fused (launched with `form`), or (T = float) the unfused
/// chain with its products by float_bmm and kdnn's softmax and dropout
/// between them.
template <class T>
Float32Run run_case(const FusedCase& c, const std::vector<double>& qv,
                    const std::vector<double>& kv, const std::vector<double>& vv,
                    const std::vector<double>& gv, bool fused,
                    kdnn::KernelForm form = kdnn::KernelForm::automatic) {
  const at::AttentionMask<Space> mask = mask_of(c);
  const at::FusedAttentionOptions opts = case_options(c, 4321, 3, form);
  if (fused) {
    const auto q = to_device<T****>(qv, c.B, c.H, c.S, c.D);
    const auto k = to_device<T****>(kv, c.B, c.H, c.Sk, c.D);
    const auto v = to_device<T****>(vv, c.B, c.H, c.Sk, c.Dv);
    const auto g = to_device<T****>(gv, c.B, c.H, c.S, c.Dv);
    DeviceView<T****> o("o", c.B, c.H, c.S, c.Dv), dq("dq", c.B, c.H, c.S, c.D),
        dk("dk", c.B, c.H, c.Sk, c.D), dv("dv", c.B, c.H, c.Sk, c.Dv);
    DeviceView<T***> lse("lse", c.B, c.H, c.S);
    at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
    at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, opts, mask);
    return {to_host(o), to_host(dq), to_host(dk), to_host(dv)};
  }
  const int BH = c.B * c.H, S = c.S, Sk = c.Sk;
  const auto pairs = [&](const std::vector<double>& x) {
    return to_device<T****>(x, c.B, c.H, S, Sk);
  };
  DeviceView<T****> P("P", c.B, c.H, S, Sk), Pd("Pd", c.B, c.H, S, Sk), dP("dP", c.B, c.H, S, Sk),
      dS("dS", c.B, c.H, S, Sk);
  const at::SoftmaxOptions softmax{at::SoftmaxMode::accurate, opts.scale};
  at::softmax_forward(Space(), pairs(float_bmm(BH, S, Sk, c.D, qv, false, kv, true)), P, softmax,
                      mask);
  at::dropout_forward(Space(), P, Pd, opts.dropout);
  const auto pd = to_host(Pd);
  at::dropout_backward(Space(), pairs(float_bmm(BH, S, Sk, c.Dv, gv, false, vv, true)), dP,
                       opts.dropout);
  at::softmax_backward(Space(), P, dP, dS, softmax, mask);
  const auto ds = to_host(dS);
  return {float_bmm(BH, S, c.Dv, Sk, pd, false, vv, false),
          float_bmm(BH, S, c.D, Sk, ds, false, kv, false),
          float_bmm(BH, Sk, c.D, S, ds, true, qv, false),
          float_bmm(BH, Sk, c.Dv, S, pd, true, gv, false)};
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST(FusedAttentionAccuracy, Float32WithinThreeTimesAReorderedFloat32Reference) {
  // Flash attention's acceptance rule: against float64 results from the same
  // (float-rounded) inputs, the fused float32 error of every output is at
  // most 3 times that of a float32 computation in another order (here the
  // unfused chain: scores, softmax, dropout, products, with its products
  // summed on the host as a BLAS GEMM sums them, so that the reference is
  // the same in every build). While team_gemm summed over k in order the
  // fused error was up to 7.7 times this reference's (dq, D = 224).
  std::vector<FusedCase> cases = fused_cases();
  for (const int D : {32, 64, 96, 128, 160, 224}) {
    cases.push_back({"D sweep, S != Sk", 1, 2, 150, 300, D, D, false, {}, {}, {}, {}, 0});
    cases.push_back({"D sweep, causal, dropout", 1, 1, 200, 130, D, D, true, {}, {}, {}, {}, 0.1});
  }
  unsigned seed = 700;
  for (const FusedCase& c : cases) {
    SCOPED_TRACE(std::string(c.name) + " D=" + std::to_string(c.D));
    const auto rounded = [&](std::size_t n) {
      std::vector<double> x = normal(n, seed++);
      for (double& e : x) e = double(float(e));
      return x;
    };
    const std::size_t nq = std::size_t(c.B) * c.H * c.S, nk = std::size_t(c.B) * c.H * c.Sk;
    const auto q = rounded(nq * c.D), k = rounded(nk * c.D), v = rounded(nk * c.Dv),
               g = rounded(nq * c.Dv);
    const Float32Run truth = run_case<double>(c, q, k, v, g, true);
    const Float32Run reordered = run_case<float>(c, q, k, v, g, false);
    const struct {
      const char* name;
      std::vector<double> Float32Run::*out;
    } outputs[] = {{"o", &Float32Run::o},
                   {"dq", &Float32Run::dq},
                   {"dk", &Float32Run::dk},
                   {"dv", &Float32Run::dv}};
    // Both forms (the GPU forms for D and Dv in {32, 64, 128, 256}).
    for (const auto form : {kdnn::KernelForm::host, kdnn::KernelForm::gpu}) {
      const Float32Run fused = run_case<float>(c, q, k, v, g, true, form);
      for (const auto& out : outputs) {
        const double mine = max_abs_diff(fused.*out.out, truth.*out.out);
        const double other = max_abs_diff(reordered.*out.out, truth.*out.out);
        EXPECT_LE(mine, 3 * other + 1e-7)
            << out.name << (form == kdnn::KernelForm::gpu ? " (GPU launch)" : "") << ": fused "
            << mine << ", reordered " << other;
      }
    }
  }
}

// (softcap, ALiBi's slope): with and without a score cap (0.7: most scores
// on tanh's curve), with and without ALiBi.
class FusedAttentionGradients : public ::testing::TestWithParam<std::pair<double, double>> {};
INSTANTIATE_TEST_SUITE_P(SoftcapAlibi, FusedAttentionGradients,
                         ::testing::Values(std::pair{0.0, 0.0}, std::pair{0.7, 0.0},
                                           std::pair{0.7, 0.3}));

TEST_P(FusedAttentionGradients, MatchCentralDifferencesInDouble) {
  const int B = 1, H = 2, S = 6, Sk = 9, D = 5, Dv = 3;
  std::vector<double> hq = normal(std::size_t(B) * H * S * D, 501),
                      hk = normal(std::size_t(B) * H * Sk * D, 502),
                      hv = normal(std::size_t(B) * H * Sk * Dv, 503),
                      hg = normal(std::size_t(B) * H * S * Dv, 504);
  at::AttentionMask<Space> mask;
  mask.causal = true;
  if (GetParam().second != 0) {
    mask.alibi_slopes = to_device<double**>({GetParam().second, -GetParam().second}, 1, H);
  }
  at::FusedAttentionOptions opts;
  opts.scale = 0.6;
  opts.softcap = GetParam().first;
  opts.dropout = {0.25, 99, 3};
  DeviceView<double****> o("o", B, H, S, Dv);
  DeviceView<double***> lse("lse", B, H, S);
  const auto loss = [&]() {
    at::fused_attention_forward(Space(), to_device<double****>(hq, B, H, S, D),
                                to_device<double****>(hk, B, H, Sk, D),
                                to_device<double****>(hv, B, H, Sk, Dv), o, lse, opts, mask);
    const auto out = to_host(o);
    double l = 0;
    for (std::size_t x = 0; x < out.size(); ++x) l += hg[x] * out[x];
    return l;
  };
  loss();
  DeviceView<double****> dq("dq", B, H, S, D), dk("dk", B, H, Sk, D), dv("dv", B, H, Sk, Dv);
  at::fused_attention_backward(Space(), to_device<double****>(hq, B, H, S, D),
                               to_device<double****>(hk, B, H, Sk, D),
                               to_device<double****>(hv, B, H, Sk, Dv), o, lse,
                               to_device<double****>(hg, B, H, S, Dv), dq, dk, dv, opts, mask);
  const double h = 1e-6, tol = 1e-7;
  expect_gradient("dq", hq, loss, h, to_host(dq), tol);
  expect_gradient("dk", hk, loss, h, to_host(dk), tol);
  expect_gradient("dv", hv, loss, h, to_host(dv), tol);
}

// Every launch the backend accepts gives bitwise the same results: the
// GEMM tiles and the per-row sweeps fix every sum's order, not the team.
TEST(FusedAttentionLaunch, ResultsDoNotDependOnTheLaunchShape) {
  using T = float;
  const int B = 2, H = 2, S = 70, Sk = 45, D = 24, Dv = 16;
  const auto q = to_device<T****>(normal(std::size_t(B) * H * S * D, 601), B, H, S, D);
  const auto k = to_device<T****>(normal(std::size_t(B) * H * Sk * D, 602), B, H, Sk, D);
  const auto v = to_device<T****>(normal(std::size_t(B) * H * Sk * Dv, 603), B, H, Sk, Dv);
  const auto g = to_device<T****>(normal(std::size_t(B) * H * S * Dv, 604), B, H, S, Dv);
  at::AttentionMask<Space> mask;
  mask.causal = true;
  const auto run = [&](const kdnn::Launch& launch, at::FusedBackwardSchedule schedule) {
    at::FusedAttentionOptions opts;
    opts.backward = schedule;
    opts.scale = 0.3;
    opts.dropout = {0.1, 5, 0};
    opts.launch = launch;
    return fused_outputs<T>(q, k, v, g, opts, mask);
  };
  std::vector<kdnn::Launch> launches = {{0, 1, 1}};
  const bool host = kdnn::impl::BackendTraits<Space>::is_host;
  if (!host) launches.push_back({0, 4, 8});
  if (host && Space().concurrency() >= 2) launches.push_back({0, 2, 1});
  for (const auto schedule :
       {at::FusedBackwardSchedule::per_head, at::FusedBackwardSchedule::per_key_block}) {
    const auto reference = run({}, schedule);
    for (const kdnn::Launch& launch : launches) {
      EXPECT_EQ(run(launch, schedule), reference)
          << "team_size=" << launch.team_size << ", vector_length=" << launch.vector_length
          << ", schedule " << int(schedule);
    }
  }
}

// Blocks past on-chip scratch: a GPU launch (forced here) strides a bounded
// league over them in a team workspace (core/impl/team_work.hpp), a host
// launch gives each its team and level-1 scratch; bitwise the same results.
// The backward in double has no GPU form for Dv between 128 and the largest
// GPU head size, so the GPU launch runs the host kernels there (past that
// size a GPU launch is refused: test_fused_attention_head_sizes.cpp).
TEST(FusedAttentionLaunch, GpuLaunchPastLevelZeroMatchesTheDefault) {
  using T = double;
  const int B = 2, H = 3, S = 150, Sk = 130, D = 128, Dv = 200;
  const FusedCase c{"past level 0", B, H, S, Sk, D, Dv, true, {}, {}, {}, {}, 0};
  unsigned seed = 611;
  const auto in = random_inputs<T>(c, seed);  // named below: a lambda takes them
  const auto &q = in[0], &k = in[1], &v = in[2], &g = in[3];
  at::FusedAttentionOptions opts;
  opts.scale = 0.2;
  opts.launch.form = kdnn::KernelForm::gpu;
  ASSERT_EQ((at::impl::backward_form<Space, T>(Space(), opts, D, Dv)), kdnn::KernelForm::host)
      << "no GPU form of the backward may take the case";
  {
    int bq = 0, bk = 0;
    at::impl::fused_block_sizes<Space>(S, Sk, D, Dv, bq, bk);
    const std::size_t bytes = kdnn::impl::layout_bytes([&](kdnn::impl::ScratchCarver& s) {
      at::impl::FusedBackwardKVKernel<Space, T>::carve(s, bq, bk, D, Dv);
    });
    ASSERT_GT(bytes, kdnn::impl::scratch_capacity<Space>(0)) << "the case must be past level 0";
    ASSERT_GT(S, 2 * bq) << "several query blocks per head";
  }
  at::AttentionMask<Space> mask;
  mask.causal = true;
  DeviceView<T****> o("o", B, H, S, Dv);
  DeviceView<T***> lse("lse", B, H, S);
  at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
  const auto gradients = [&](kdnn::KernelForm form, at::FusedBackwardSchedule schedule) {
    at::FusedAttentionOptions with = opts;
    with.launch.form = form;
    with.backward = schedule;
    DeviceView<T****> dq("dq", B, H, S, D), dk("dk", B, H, Sk, D), dv("dv", B, H, Sk, Dv);
    at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, with, mask);
    return std::vector<std::vector<double>>{to_host(dq), to_host(dk), to_host(dv)};
  };
  for (const auto schedule :
       {at::FusedBackwardSchedule::per_head, at::FusedBackwardSchedule::per_key_block}) {
    const auto gpu = gradients(kdnn::KernelForm::gpu, schedule);
    EXPECT_EQ(gpu, gradients(kdnn::KernelForm::host, schedule)) << "schedule " << int(schedule);
    for (const auto& x : gpu) EXPECT_NE(x, std::vector<double>(x.size(), 0.0));
  }
}

// A head dimension whose blocks exceed the backend's team scratch is refused
// with the sizes, before anything runs.
TEST(FusedAttentionErrors, ScratchPastTheLimitIsAClearError) {
  using Kernel = at::impl::FusedForwardKernel<Space, double>;
  const auto bytes = [](int D) {
    int bq = 0, bk = 0;
    at::impl::fused_block_sizes<Space>(1, 1, D, 1, bq, bk);  // S = Sk = 1, as below
    return kdnn::impl::layout_bytes(
        [&](kdnn::impl::ScratchCarver& s) { Kernel::carve(s, bq, bk, D, 1); });
  };
  const char* limit_what = nullptr;  // a GPU's launches: the team workspace's budget
  const std::size_t limit = kdnn::impl::scratch_limit<Space>(
      kdnn::impl::is_gpu_launch<Space>(kdnn::Launch{}), limit_what);
  int D = 64;
  while (bytes(D) <= limit) D *= 2;
  const auto alloc = [](const char* name, int d) {
    return DeviceView<double****>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(name)), 1, 1, 1, d);
  };
  DeviceView<double***> lse("lse", 1, 1, 1);
  // On a GPU backend such a D is past every GPU form, refused as that.
  const bool host = kdnn::impl::BackendTraits<Space>::is_host;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), alloc("q", D), alloc("k", D),
                                                alloc("v", 1), alloc("o", 1), lse),
                    host ? "bytes of team scratch, above the" : "q's head size D=");
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), alloc("q", D), alloc("k", D),
                                                alloc("v", 1), alloc("o", 1), lse),
                    "D=" + std::to_string(D));
}

// The memory claim, measured: beyond its inputs, outputs and the backend's
// team scratch (block-sized, kept between launches) the fused forward +
// backward allocate O(B·H·S) (the row sums δ), the same for every Sk, where
// the unfused path needs [B, H, S, Sk] tensors.
TEST(FusedAttentionMemory, ExtraAllocationsDoNotGrowWithTheKeyLength) {
  using T = float;
  const int B = 2, H = 2, S = 96, D = 16;
  std::vector<std::int64_t> peaks;
  for (int Sk : {64, 1024}) {
    const std::size_t nq = std::size_t(B) * H * S, nk = std::size_t(B) * H * Sk;
    const auto q = to_device<T****>(normal(nq * D, 1), B, H, S, D);
    const auto k = to_device<T****>(normal(nk * D, 2), B, H, Sk, D);
    const auto v = to_device<T****>(normal(nk * D, 3), B, H, Sk, D);
    const auto g = to_device<T****>(normal(nq * D, 4), B, H, S, D);
    DeviceView<T****> o("o", B, H, S, D), dq("dq", B, H, S, D), dk("dk", B, H, Sk, D),
        dv("dv", B, H, Sk, D);
    DeviceView<T***> lse("lse", B, H, S);
    at::AttentionMask<Space> mask;
    mask.causal = true;
    at::FusedAttentionOptions opts;
    opts.dropout = {0.1, 3, 0};
    // Warm-up: backends keep their team-scratch pools between launches.
    at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
    at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, opts, mask);
    Space().fence();
    {
      AllocationCounter counter;
      {  // the counter sees allocations: a control of known size
        DeviceView<T*> control("control", 1000);
      }
      EXPECT_GE(AllocationCounter::peak, std::int64_t(1000 * sizeof(T)));
      AllocationCounter::current = AllocationCounter::peak = 0;
      AllocationCounter::labels.clear();
      at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
      at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, opts, mask);
      Space().fence();
      peaks.push_back(AllocationCounter::peak);
      EXPECT_LE(peaks.back(), std::int64_t(nq * sizeof(T)) + 4096)
          << "Sk=" << Sk << ", allocations " << AllocationCounter::labels;
    }

    // With the row sums in a workspace the caller owns, the backward
    // allocates nothing and gives bitwise the same gradients.
    DeviceView<T***> delta("delta", B, H, S);
    DeviceView<T****> dq2("dq2", B, H, S, D), dk2("dk2", B, H, Sk, D), dv2("dv2", B, H, Sk, D);
    at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq2, dk2, dv2, delta, opts, mask);
    Space().fence();
    {
      AllocationCounter counter;
      at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq2, dk2, dv2, delta, opts, mask);
      Space().fence();
      EXPECT_EQ(AllocationCounter::peak, 0)
          << "Sk=" << Sk << ", allocations " << AllocationCounter::labels;
    }
    EXPECT_EQ(to_host(dq2), to_host(dq)) << "Sk=" << Sk;
    EXPECT_EQ(to_host(dk2), to_host(dk)) << "Sk=" << Sk;
    EXPECT_EQ(to_host(dv2), to_host(dv)) << "Sk=" << Sk;
  }
  EXPECT_EQ(peaks[0], peaks[1]);
}

// check_scores: a scale with which scale·q·k can pass float's range is an
// error naming it (unchecked, such scores are inf and the softmax NaN); what
// fits runs; a non-finite q or k is check_finite's.
TEST(FusedAttentionErrors, ScoresPastTheRangeAreRefusedWhenChecked) {
  DeviceView<float****> q("q", 1, 2, 3, 4), k("k", 1, 2, 5, 4), v("v", 1, 2, 5, 6),
      o("o", 1, 2, 3, 6);
  DeviceView<float***> lse("lse", 1, 2, 3);
  Kokkos::deep_copy(q, 3.0f);  // every score is 36·scale
  Kokkos::deep_copy(k, 3.0f);
  Kokkos::deep_copy(v, 1.0f);
  at::FusedAttentionOptions opts;
  opts.check_scores = true;
  opts.scale = 1e37;  // scores 3.6e38 > FLT_MAX
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "opts.scale=1e+37 with max|q|=3, max|k|=3 and D=4 could take a score past");
  opts.scale = -1e37;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "opts.scale=-1e+37 with max|q|=3");
  opts.scale = 1e30;
  at::fused_attention_forward(Space(), q, k, v, o, lse, opts);
  for (double x : to_host(o)) EXPECT_EQ(x, 1.0);  // every row averages ones

  DeviceView<double****> qd("q", 1, 2, 3, 4), kd("k", 1, 2, 5, 4), vd("v", 1, 2, 5, 6),
      od("o", 1, 2, 3, 6);
  DeviceView<double***> lsed("lse", 1, 2, 3);
  Kokkos::deep_copy(qd, 3.0);
  Kokkos::deep_copy(kd, 3.0);
  opts.scale = 1e37;  // within double's range
  at::fused_attention_forward(Space(), qd, kd, vd, od, lsed, opts);

  // A NaN or an infinity is check_finite's, not check_scores': it propagates
  // unless check_finite refuses it; check_scores still guards the finite
  // values beside it.
  opts.scale = 0.5;
  Kokkos::deep_copy(Kokkos::subview(q, 0, 1, 2, 3), std::numeric_limits<float>::quiet_NaN());
  at::fused_attention_forward(Space(), q, k, v, o, lse, opts);
  const auto out = to_host(o);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const bool row_1_2 = i / 6 == 1 * 3 + 2;  // o[0, 1, 2, :]: the row of the NaN
    EXPECT_EQ(std::isnan(out[i]), row_1_2) << "element " << i;
  }
  opts.scale = 1e37;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "opts.scale=1e+37 with max|q|=3");
  opts.scale = 0.5;
  opts.check_finite = true;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "q[0, 1, 2, 3]=nan, expected finite values (check_finite)");
  Kokkos::deep_copy(q, 3.0f);
  Kokkos::deep_copy(Kokkos::subview(k, 0, 0, 4, 0), -std::numeric_limits<float>::infinity());
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "k[0, 0, 4, 0]=-inf, expected finite values (check_finite)");
}

TEST(FusedAttentionErrors, BadInputIsAKdnnError) {
  DeviceView<double****> q("q", 1, 2, 3, 4), k("k", 1, 2, 5, 4), v("v", 1, 2, 5, 6),
      o("o", 1, 2, 3, 6);
  DeviceView<double***> lse("lse", 1, 2, 3);
  DeviceView<double****> k_bad("k", 1, 2, 5, 3), o_bad("o", 1, 2, 3, 5);
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k_bad, v, o, lse),
                    "k has extent(3)=3, expected 4 (D, q's extent(3))");
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o_bad, lse),
                    "o has extent(3)=5, expected 6 (Dv, v's extent(3))");
  // Key/value heads: a divisor of q's heads, the same for k and v.
  DeviceView<double****> q3("q", 1, 3, 3, 4), o3("o", 1, 3, 3, 6), v1("v", 1, 1, 5, 6);
  DeviceView<double***> lse3("lse", 1, 3, 3);
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q3, k, v, o3, lse3),
                    "k has extent(1)=2, expected a number of key/value heads that divides H=3");
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v1, o, lse),
                    "v has extent(1)=1, expected 2 (Hkv, k's extent(1))");
  at::FusedAttentionOptions opts;
  opts.dropout.p = 1;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "opts.dropout.p=1, expected a value in [0, 1)");
  opts.dropout.p = 0;
  opts.softcap = -1;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "opts.softcap=-1, expected 0 (none) or a value > 0");
  opts.softcap = 1e-320;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "whose inverse is finite in double");
  opts.softcap = 0;
  opts.backward = static_cast<at::FusedBackwardSchedule>(7);
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "opts.backward=7, expected FusedBackwardSchedule::automatic");
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v,
                                                DeviceView<double****>(q.data(), 1, 2, 3, 6), lse),
                    "output o overlaps input q");

  // A finite double that is +inf as a float: an error in float, fine in double.
  DeviceView<float****> qf("q", 1, 2, 3, 4), kf("k", 1, 2, 5, 4), vf("v", 1, 2, 5, 6),
      of("o", 1, 2, 3, 6), gf("g", 1, 2, 3, 6), dqf("dq", 1, 2, 3, 4), dkf("dk", 1, 2, 5, 4),
      dvf("dv", 1, 2, 5, 6);
  DeviceView<float***> lsef("lse", 1, 2, 3);
  opts = at::FusedAttentionOptions();
  opts.scale = 1e39;
  const char* message =
      "opts.scale=1e+39, expected a value finite in float (|opts.scale| <= 3.40282e+38)";
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), qf, kf, vf, of, lsef, opts), message);
  EXPECT_KDNN_ERROR(
      at::fused_attention_backward(Space(), qf, kf, vf, of, lsef, gf, dqf, dkf, dvf, opts),
      message);
  DeviceView<float****> sf("s", 1, 2, 3, 5), pf("p", 1, 2, 3, 5);
  EXPECT_KDNN_ERROR(at::softmax_forward(Space(), sf, pf, {at::SoftmaxMode::accurate, 1e39}),
                    "scale=1e+39, expected a value finite in float");
  at::fused_attention_forward(Space(), q, k, v, o, lse, opts);  // double: finite

  // The caller's δ workspace: [B, H, S], and not aliasing an input or output.
  opts = at::FusedAttentionOptions();
  DeviceView<float***> delta_bad("delta", 1, 2, 4), delta("delta", 1, 2, 3);
  EXPECT_KDNN_ERROR(at::fused_attention_backward(Space(), qf, kf, vf, of, lsef, gf, dqf, dkf, dvf,
                                                 delta_bad, opts),
                    "delta has extent(2)=4, expected 3 (same as lse)");
  const DeviceView<float***> delta_on_lse(lsef.data(), 1, 2, 3);
  EXPECT_KDNN_ERROR(at::fused_attention_backward(Space(), qf, kf, vf, of, lsef, gf, dqf, dkf, dvf,
                                                 delta_on_lse, opts),
                    "output delta overlaps input lse");
  const DeviceView<float***> delta_on_dq(dqf.data(), 1, 2, 3);
  EXPECT_KDNN_ERROR(at::fused_attention_backward(Space(), qf, kf, vf, of, lsef, gf, dqf, dkf, dvf,
                                                 delta_on_dq, opts),
                    "outputs dq and delta overlap");
  at::fused_attention_backward(Space(), qf, kf, vf, of, lsef, gf, dqf, dkf, dvf, delta, opts);

  // 2^32 heads of one query and one key: B·H·blocks overflows int (the
  // kernels' index type). Views over a few bytes: the sizes are refused
  // before anything is read.
  float tiny[8] = {};
  const std::size_t n = 65536;
  const kdnn::Tensor4<const float, Space> big(tiny, n, n, 1, 1);
  const kdnn::Tensor4<float, Space> big_o(tiny + 2, n, n, 1, 1);
  const kdnn::Tensor3<float, Space> big_lse(tiny + 4, n, n, 1);
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), big, big, big, big_o, big_lse),
                    "B=65536, H=65536, S=1, Sk=1, D=1, Dv=1 needs 4294967296 teams");
  const kdnn::Tensor3<const float, Space> big_lse_in(tiny + 6, n, n, 1);
  EXPECT_KDNN_ERROR(at::fused_attention_backward(Space(), big, big, big, big, big_lse_in, big,
                                                 big_o, big_o, big_o),
                    "expected at most 2^31 - 1 (B·H·blocks)");
}

}  // namespace
