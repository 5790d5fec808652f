// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// A plain double-precision multi-head attention layer for tests: the forward
// of kdnn/attention/mha.hpp written as loops straight from its definition
// (no Kokkos, no GEMM), used as the reference for the forward and, through
// central differences, for every gradient.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "central_differences.hpp"
#include "kdnn/core/impl/philox.hpp"
#include "random.hpp"

namespace kdnn_test {

/// Sizes, options and mask of one test layer.
struct MhaCase {
  std::string name;
  int B = 2, S = 3, Sk = 4, Eq = 5, Ek = 4, Ev = 3, H = 2, D = 3, Dv = 2, Eo = 4;
  int Hkv = 0;  ///< key/value heads, dividing H; 0: H
  bool bias_q = true, bias_k = true, bias_v = true, bias_o = true;
  bool causal = false;
  std::vector<int> lo, hi, seq_q, seq_k;  ///< empty: no limit
  bool residual = false;
  double p = 0;
  std::uint64_t seed = 7, offset = 0;
  std::optional<double> scaler;
  double scale() const { return scaler ? *scaler : 1.0 / std::sqrt(double(D)); }
  int kv() const { return Hkv == 0 ? H : Hkv; }      ///< the key/value heads
  int kv_of(int h) const { return h / (H / kv()); }  ///< query head h's key/value head
};

/// A layer with every feature at once: S != Sk, three heads, causal mask,
/// windows, lengths (entry 1 has padded queries and keys), residual, dropout.
inline MhaCase mha_case_with_everything() {
  MhaCase c;
  c.B = 2, c.S = 5, c.Sk = 6, c.H = 3, c.D = 2, c.Dv = 3;
  c.causal = true;
  c.lo = {0, 0, 1, 2, 4};
  c.hi = {3, 6, 6, 4, 6};
  c.seq_q = {5, 3};
  c.seq_k = {6, 4};
  c.residual = true;
  c.p = 0.2, c.seed = 99;
  return c;
}

/// Inputs, parameters and the output gradient of one test layer; empty
/// vectors for what the case leaves out.
struct MhaData {
  std::vector<double> q, k, v, residual, wq, wk, wv, wo, bq, bk, bv, bo, dout;

  static MhaData random(const MhaCase& c, unsigned seed) {
    const auto n = [](int a, int b, int d = 1) { return std::size_t(a) * b * d; };
    MhaData d;
    d.q = normal(n(c.B, c.S, c.Eq), seed);
    d.k = normal(n(c.B, c.Sk, c.Ek), seed + 1);
    d.v = normal(n(c.B, c.Sk, c.Ev), seed + 2);
    if (c.residual) d.residual = normal(n(c.B, c.S, c.Eo), seed + 3);
    const auto weights = [&](int out, int in, unsigned s) {
      auto w = normal(n(out, in), s);
      for (auto& x : w) x /= std::sqrt(double(std::max(in, 1)));
      return w;
    };
    d.wq = weights(c.H * c.D, c.Eq, seed + 4);
    d.wk = weights(c.kv() * c.D, c.Ek, seed + 5);
    d.wv = weights(c.kv() * c.Dv, c.Ev, seed + 6);
    d.wo = weights(c.Eo, c.H * c.Dv, seed + 7);
    if (c.bias_q) d.bq = normal(c.H * c.D, seed + 8);
    if (c.bias_k) d.bk = normal(c.kv() * c.D, seed + 9);
    if (c.bias_v) d.bv = normal(c.kv() * c.Dv, seed + 10);
    if (c.bias_o) d.bo = normal(c.Eo, seed + 11);
    d.dout = normal(n(c.B, c.S, c.Eo), seed + 12);
    return d;
  }
};

/// Whether dropout keeps probability (b, h, i, j): word k mod 4 of
/// Philox-4x32-10(counter = (k/4, offset), key = seed) >= round(p·2³²),
/// k the element's row-major index in [B, H, S, Sk].
inline bool reference_keep(const MhaCase& c, int b, int h, int i, int j) {
  if (c.p == 0) return true;
  const std::uint64_t k = ((std::uint64_t(b) * c.H + h) * c.S + i) * c.Sk + j;
  const std::uint64_t g = k / 4;
  const auto words =
      kdnn::impl::philox4x32_10({{std::uint32_t(g), std::uint32_t(g >> 32), std::uint32_t(c.offset),
                                  std::uint32_t(c.offset >> 32)}},
                                std::uint32_t(c.seed), std::uint32_t(c.seed >> 32));
  const double threshold = std::min(std::nearbyint(c.p * 4294967296.0), 4294967295.0);
  return double(words.v[k % 4]) >= threshold;
}

/// Whether query i of entry b sees key j under the case's mask.
inline bool reference_visible(const MhaCase& c, int b, int i, int j) {
  if (!c.seq_q.empty() && i >= c.seq_q[b]) return false;
  if (!c.seq_k.empty() && j >= c.seq_k[b]) return false;
  if (!c.lo.empty() && j < c.lo[i]) return false;
  if (!c.hi.empty() && j >= c.hi[i]) return false;
  return !(c.causal && j > i);
}

/// x·Wᵀ + b for x [rows, in], W [out, in].
inline std::vector<double> reference_linear(const std::vector<double>& x, int rows, int in,
                                            const std::vector<double>& W, int out,
                                            const std::vector<double>& b) {
  std::vector<double> y(std::size_t(rows) * out);
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int i = 0; i < in; ++i) s += x[std::size_t(r) * in + i] * W[std::size_t(o) * in + i];
      y[std::size_t(r) * out + o] = s;
    }
  return y;
}

/// The layer's output [B, S, Eo].
inline std::vector<double> reference_mha_forward(const MhaCase& c, const MhaData& d) {
  const auto Q = reference_linear(d.q, c.B * c.S, c.Eq, d.wq, c.H * c.D, d.bq);
  const auto K = reference_linear(d.k, c.B * c.Sk, c.Ek, d.wk, c.kv() * c.D, d.bk);
  const auto V = reference_linear(d.v, c.B * c.Sk, c.Ev, d.wv, c.kv() * c.Dv, d.bv);
  const int HD = c.H * c.D, HDv = c.H * c.Dv, KD = c.kv() * c.D, KDv = c.kv() * c.Dv;
  std::vector<double> A(std::size_t(c.B) * c.S * HDv, 0.0), score(std::max(c.Sk, 1));
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.H; ++h)
      for (int i = 0; i < c.S; ++i) {
        const int g = c.kv_of(h);
        double m = -INFINITY;
        for (int j = 0; j < c.Sk; ++j) {
          double s = 0;
          for (int e = 0; e < c.D; ++e)
            s += Q[(std::size_t(b) * c.S + i) * HD + h * c.D + e] *
                 K[(std::size_t(b) * c.Sk + j) * KD + g * c.D + e];
          score[j] = c.scale() * s;
          if (reference_visible(c, b, i, j)) m = std::max(m, score[j]);
        }
        double sum = 0;
        for (int j = 0; j < c.Sk; ++j)
          if (reference_visible(c, b, i, j)) sum += std::exp(score[j] - m);
        for (int j = 0; j < c.Sk; ++j) {
          if (!reference_visible(c, b, i, j) || !reference_keep(c, b, h, i, j)) continue;
          const double p = std::exp(score[j] - m) / sum / (1 - c.p);
          for (int e = 0; e < c.Dv; ++e)
            A[(std::size_t(b) * c.S + i) * HDv + h * c.Dv + e] +=
                p * V[(std::size_t(b) * c.Sk + j) * KDv + g * c.Dv + e];
        }
      }
  auto out = reference_linear(A, c.B * c.S, HDv, d.wo, c.Eo, d.bo);
  for (int b = 0; b < c.B; ++b)
    for (int i = 0; i < c.S; ++i)
      for (int o = 0; o < c.Eo; ++o) {
        const std::size_t at = (std::size_t(b) * c.S + i) * c.Eo + o;
        if (!c.seq_q.empty() && i >= c.seq_q[b]) {
          out[at] = 0;
        } else if (c.residual) {
          out[at] += d.residual[at];
        }
      }
  return out;
}

/// d/dx of L = Σ dout·out for every element of the member `x` of the data,
/// by central differences of step h.
inline std::vector<double> reference_gradient(const MhaCase& c, MhaData d,
                                              std::vector<double> MhaData::*x, double h = 1e-5) {
  const auto loss = [&] {
    const auto out = reference_mha_forward(c, d);
    double L = 0;
    for (std::size_t k = 0; k < out.size(); ++k) L += d.dout[k] * out[k];
    return L;
  };
  return central_differences(d.*x, loss, h);
}

}  // namespace kdnn_test
