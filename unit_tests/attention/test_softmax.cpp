// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Masked softmax (accurate and log) against a double reference that applies
// each mask condition per key, finite differences for the backward, fully
// masked rows and bad masks.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/attention/softmax.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;
using Mask = at::AttentionMask<Space>;

template <class T>
class Softmax : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Softmax, Types);

constexpr int kB = 2, kH = 2, kS = 5, kSk = 7;
const std::size_t kCount = std::size_t(kB) * kH * kS * kSk;

/// A mask on the host, and its device form.
struct HostMask {
  bool causal = false;
  std::vector<int> lo, hi, seq_q, seq_k;
  int band_left = -1, band_right = -1;  // around d = i + Sk_b − S_b
  bool sees(int b, int i, int j) const {
    if (!seq_q.empty() && i >= seq_q[b]) return false;
    if (!seq_k.empty() && j >= seq_k[b]) return false;
    if (!lo.empty() && j < lo[i]) return false;
    if (!hi.empty() && j >= hi[i]) return false;
    const int d = i + (seq_k.empty() ? kSk : seq_k[b]) - (seq_q.empty() ? kS : seq_q[b]);
    if (band_left >= 0 && j < d - band_left) return false;
    if (band_right >= 0 && j > d + band_right) return false;
    return !causal || j <= i;
  }
  Mask device() const {
    auto vec = [](const std::vector<int>& v) {
      Kokkos::View<int*, Kokkos::LayoutRight, Space::memory_space> d("mask", v.size());
      auto h = Kokkos::create_mirror_view(d);
      for (std::size_t k = 0; k < v.size(); ++k) h(k) = v[k];
      Kokkos::deep_copy(d, h);
      return at::Vector<const int, Space>(d);
    };
    Mask m;
    m.causal = causal;
    m.band_left = band_left, m.band_right = band_right;
    if (!lo.empty()) m.lo_win = vec(lo);
    if (!hi.empty()) m.hi_win = vec(hi);
    if (!seq_q.empty()) m.seq_q = vec(seq_q);
    if (!seq_k.empty()) m.seq_k = vec(seq_k);
    return m;
  }
};

std::vector<double> reference(const std::vector<double>& x, const HostMask& m, double s,
                              bool log_mode) {
  std::vector<double> y(x.size());
  for (int b = 0; b < kB; ++b)
    for (int h = 0; h < kH; ++h)
      for (int i = 0; i < kS; ++i) {
        const std::size_t row = ((std::size_t(b) * kH + h) * kS + i) * kSk;
        double m_max = -INFINITY, sum = 0;
        for (int j = 0; j < kSk; ++j)
          if (m.sees(b, i, j)) m_max = std::max(m_max, s * x[row + j]);
        for (int j = 0; j < kSk; ++j)
          if (m.sees(b, i, j)) sum += std::exp(s * x[row + j] - m_max);
        for (int j = 0; j < kSk; ++j) {
          const bool seen = m.sees(b, i, j);
          y[row + j] = log_mode ? (seen ? s * x[row + j] - m_max - std::log(sum) : -INFINITY)
                                : (seen ? std::exp(s * x[row + j] - m_max) / sum : 0.0);
        }
      }
  return y;
}

std::vector<std::pair<std::string, HostMask>> masks() {
  HostMask none, causal, window, lengths, all, band, band_lengths;
  causal.causal = true;
  window.lo = {0, 1, 2, 3, 3};
  window.hi = {2, 4, 2, 7, 6};  // query 2: empty window
  lengths.seq_q = {5, 3};
  lengths.seq_k = {7, 0};  // batch entry 1: no keys at all
  all = window;
  all.causal = true;
  all.seq_q = {4, 5};
  all.seq_k = {6, 5};
  band.band_left = 1, band.band_right = 0;  // flash-attn's causal window of 2 (Sk > S)
  band_lengths = band;
  band_lengths.band_left = -1, band_lengths.band_right = 1;
  band_lengths.seq_q = {5, 4};
  band_lengths.seq_k = {3, 6};  // entry 0: its first queries see no key
  return {{"none", none},
          {"causal", causal},
          {"window", window},
          {"lengths", lengths},
          {"all", all},
          {"band", band},
          {"band, lengths", band_lengths}};
}

TYPED_TEST(Softmax, ForwardMatchesDoubleReference) {
  using T = TypeParam;
  const auto x = normal(kCount, 1);
  for (const auto& [name, m] : masks()) {
    for (bool log_mode : {false, true}) {
      at::SoftmaxOptions o;
      o.mode = log_mode ? at::SoftmaxMode::log : at::SoftmaxMode::accurate;
      o.scale = 0.7;
      DeviceView<T****> y("y", kB, kH, kS, kSk);
      const auto X = to_device<T****>(x, kB, kH, kS, kSk);
      at::softmax_forward(Space(), X, y, o, m.device());
      const auto got = to_host(y);
      const auto expected = reference(to_host(X), m, 0.7, log_mode);
      // −inf entries must match exactly (allclose treats inf as not close).
      std::vector<double> got_f, exp_f;
      for (std::size_t k = 0; k < got.size(); ++k) {
        ASSERT_FALSE(std::isnan(got[k])) << name << " k=" << k;
        if (std::isinf(expected[k])) {
          EXPECT_EQ(got[k], expected[k]) << name << " k=" << k;
        } else {
          got_f.push_back(got[k]);
          exp_f.push_back(expected[k]);
        }
      }
      EXPECT_ALLCLOSE(got_f, exp_f, sizeof(T) == 8 ? 1e-13 : 1e-5, sizeof(T) == 8 ? 1e-15 : 1e-6)
          << name << (log_mode ? " log" : " accurate");
    }
  }
}

TEST(Softmax, BackwardMatchesFiniteDifferences) {
  // L = Σ over visible entries of g ∘ y; masked dy entries must be ignored.
  const auto x = normal(kCount, 2), g = normal(kCount, 3);
  const double s = 1.3, h = 1e-6;
  for (const auto& named : masks()) {
    const std::string& name = named.first;
    const HostMask& m = named.second;
    for (bool log_mode : {false, true}) {
      at::SoftmaxOptions o;
      o.mode = log_mode ? at::SoftmaxMode::log : at::SoftmaxMode::accurate;
      o.scale = s;
      auto loss = [&](const std::vector<double>& xv) {
        const auto y = reference(xv, m, s, log_mode);
        double sum = 0;
        for (std::size_t k = 0; k < y.size(); ++k)
          if (std::isfinite(y[k])) sum += g[k] * y[k];
        return sum;
      };
      DeviceView<double****> y("y", kB, kH, kS, kSk), dx("dx", kB, kH, kS, kSk);
      at::softmax_forward(Space(), to_device<double****>(x, kB, kH, kS, kSk), y, o, m.device());
      at::softmax_backward(Space(), y, to_device<double****>(g, kB, kH, kS, kSk), dx, o,
                           m.device());
      const auto grad = to_host(dx);
      for (std::size_t k = 0; k < kCount; k += 3) {
        auto plus = x, minus = x;
        plus[k] += h;
        minus[k] -= h;
        EXPECT_NEAR(grad[k], (loss(plus) - loss(minus)) / (2 * h), 1e-7)
            << name << (log_mode ? " log" : " accurate") << " k=" << k;
      }
    }
  }
}

TEST(Softmax, FullyMaskedRowsAreZeroNotNaN) {
  HostMask m;
  m.seq_k = {0, 0};
  const auto X = to_device<float****>(normal(kCount, 4), kB, kH, kS, kSk);
  DeviceView<float****> y("y", kB, kH, kS, kSk), dx("dx", kB, kH, kS, kSk);
  at::softmax_forward(Space(), X, y, {}, m.device());
  EXPECT_EQ(to_host(y), std::vector<double>(kCount, 0.0));
  at::softmax_backward(Space(), y, X, dx, {}, m.device());
  EXPECT_EQ(to_host(dx), std::vector<double>(kCount, 0.0));
}

TEST(Softmax, BadMasksAndOptionsAreErrors) {
  DeviceView<float****> x("x", kB, kH, kS, kSk), y("y", kB, kH, kS, kSk);
  HostMask m;
  m.lo = {0, 3, 0, 0, 0};
  m.hi = {1, 2, 7, 7, 7};
  EXPECT_KDNN_ERROR(at::softmax_forward(Space(), x, y, {}, m.device()),
                    "mask.lo_win[1]=3 > mask.hi_win[1]=2, expected lo <= hi");
  HostMask q;
  q.seq_q = {6, 1};
  EXPECT_KDNN_ERROR(at::softmax_forward(Space(), x, y, {}, q.device()),
                    "mask.seq_q[0]=6, expected a value in [0, 5] (query length, S)");
  HostMask w;
  w.hi = {1, 2, 8, 7, 7};
  EXPECT_KDNN_ERROR(at::softmax_forward(Space(), x, y, {}, w.device()),
                    "mask.hi_win[2]=8, expected a value in [0, 7]");
  HostMask e;
  e.seq_k = {1, 2, 3};
  EXPECT_KDNN_ERROR(at::softmax_forward(Space(), x, y, {}, e.device()),
                    "mask.seq_k has extent(0)=3, expected 2 (one per batch entry, B)");
  at::SoftmaxOptions o;
  o.scale = NAN;
  EXPECT_KDNN_ERROR(at::softmax_forward(Space(), x, y, o), "scale=nan, expected a finite value");
  o.scale = 1;
  o.mode = at::SoftmaxMode(5);
  EXPECT_KDNN_ERROR(at::softmax_forward(Space(), x, y, o), "mode=5");
  EXPECT_KDNN_ERROR(at::softmax_forward(Space(), y, y), "output y overlaps input x");
  DeviceView<float****> dy("dy", kB, kH, kS, kSk + 1);
  EXPECT_KDNN_ERROR(at::softmax_backward(Space(), y, dy, x), "dy has extent(3)=8, expected 7");
}

}  // namespace
