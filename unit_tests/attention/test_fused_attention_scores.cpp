// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What the fused attention adds to its scores: a softcap, ALiBi slopes and
// a band of keys around each query's diagonal, against a double loop, in
// every form; the checks of the slopes and the band.
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
#include "fused_attention_runs.hpp"
#include "fused_case.hpp"
#include "kdnn/attention/batched_gemm.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/impl/fused_attention_impl.hpp"
#include "mha_reference.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;

TYPED_TEST_SUITE(FusedAttention, Types);

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

}  // namespace
