// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Double-precision loops for the causal depthwise conv1d (+ SiLU) and the dt
// softplus: the definitions of kdnn/ssm/causal_conv1d.hpp and dt_softplus.hpp
// written out one element at a time, for the single-rank and the
// context-parallel tests. Tensors are flat row-major vectors.
#include <cmath>
#include <cstddef>
#include <vector>

namespace kdnn_test::ssm_ref {

using Vec = std::vector<double>;

struct ConvShape {
  int B = 1, L = 1, C = 1, K = 1;
};

/// The inputs and upstream gradients of one conv case (bias, init, dfinal
/// may be empty: not given). seq [B, L] (packed sequences, ids as doubles;
/// may be empty): a product w·x̄[s] enters step t only when s and t are in
/// one sequence, the initial state continuing step 0's and the steps past
/// L taking the last step's.
struct ConvCase {
  ConvShape s;
  Vec x, w, bias, init, dy, dfinal;
  bool silu = true;
  Vec seq;
};

/// Whether steps s and t (−K+1 ≤ s, t ≤ L) of row b are in one sequence.
inline bool same_sequence(const ConvCase& a, int b, int s, int t) {
  if (a.seq.empty()) return true;
  const auto id = [&](int u) {
    const int L = a.s.L;
    return a.seq[std::size_t(b) * L + (u < 0 ? 0 : u < L ? u : L - 1)];
  };
  return id(s) == id(t);
}

/// x̄[b, t, c] for −K+1 ≤ t < L.
inline double xbar(const ConvCase& a, int b, int t, int c) {
  const auto& s = a.s;
  if (t >= 0) return a.x[(std::size_t(b) * s.L + t) * s.C + c];
  if (a.init.empty()) return 0;
  return a.init[(std::size_t(b) * (s.K - 1) + t + s.K - 1) * s.C + c];
}

inline double conv_z(const ConvCase& a, int b, int t, int c) {
  double z = a.bias.empty() ? 0 : a.bias[c];
  for (int k = 0; k < a.s.K; ++k) {
    const int src = t - a.s.K + 1 + k;
    if (same_sequence(a, b, src, t)) z += a.w[c * a.s.K + k] * xbar(a, b, src, c);
  }
  return z;
}

inline double sigmoid(double z) { return 1 / (1 + std::exp(-z)); }

struct ConvForwardResult {
  Vec y, final_state;
};

inline ConvForwardResult conv_forward(const ConvCase& a) {
  const auto& s = a.s;
  ConvForwardResult r{Vec(std::size_t(s.B) * s.L * s.C), Vec(std::size_t(s.B) * (s.K - 1) * s.C)};
  for (int b = 0; b < s.B; ++b) {
    for (int t = 0; t < s.L; ++t) {
      for (int c = 0; c < s.C; ++c) {
        const double z = conv_z(a, b, t, c);
        r.y[(std::size_t(b) * s.L + t) * s.C + c] = a.silu ? z * sigmoid(z) : z;
      }
    }
    for (int j = 0; j < s.K - 1; ++j) {
      const int src = s.L - s.K + 1 + j;
      for (int c = 0; c < s.C; ++c) {
        r.final_state[(std::size_t(b) * (s.K - 1) + j) * s.C + c] =
            same_sequence(a, b, src, s.L - 1) ? xbar(a, b, src, c) : 0.0;
      }
    }
  }
  return r;
}

struct ConvBackwardResult {
  Vec dx, dw, dbias, dinit;
};

/// Reverse mode of conv_forward, element by element: dz = dy·SiLU'(z), then
/// every product w[c,k]·x̄[t−K+1+k] sends dz·x̄ to dw and dz·w to dx̄; the
/// final state's gradient goes to the x̄ it copied.
inline ConvBackwardResult conv_backward(const ConvCase& a) {
  const auto& s = a.s;
  ConvBackwardResult r{Vec(std::size_t(s.B) * s.L * s.C, 0.0), Vec(std::size_t(s.C) * s.K, 0.0),
                       Vec(s.C, 0.0), Vec(std::size_t(s.B) * (s.K - 1) * s.C, 0.0)};
  const auto dxbar = [&](int b, int t, int c) -> double& {
    if (t >= 0) return r.dx[(std::size_t(b) * s.L + t) * s.C + c];
    return r.dinit[(std::size_t(b) * (s.K - 1) + t + s.K - 1) * s.C + c];
  };
  for (int b = 0; b < s.B; ++b) {
    for (int t = 0; t < s.L; ++t) {
      for (int c = 0; c < s.C; ++c) {
        double dz = a.dy[(std::size_t(b) * s.L + t) * s.C + c];
        if (a.silu) {
          const double z = conv_z(a, b, t, c), sg = sigmoid(z);
          dz *= sg * (1 + z * (1 - sg));
        }
        r.dbias[c] += dz;
        for (int k = 0; k < s.K; ++k) {
          const int src = t - s.K + 1 + k;
          if (!same_sequence(a, b, src, t)) continue;
          r.dw[c * s.K + k] += dz * xbar(a, b, src, c);
          dxbar(b, src, c) += dz * a.w[c * s.K + k];
        }
      }
    }
    if (a.dfinal.empty()) continue;
    for (int j = 0; j < s.K - 1; ++j) {
      const int src = s.L - s.K + 1 + j;
      if (!same_sequence(a, b, src, s.L - 1)) continue;
      for (int c = 0; c < s.C; ++c) {
        dxbar(b, src, c) += a.dfinal[(std::size_t(b) * (s.K - 1) + j) * s.C + c];
      }
    }
  }
  return r;
}

/// softplus with PyTorch's threshold, then the clamp.
inline double dt_out(double u, double lo, double hi) {
  const double sp = u > 20 ? u : std::log1p(std::exp(u));
  return std::min(std::max(sp, lo), hi);
}

struct DtResult {
  Vec out, ddt, ddt_bias;
};

/// dt [rows, H] (rows = B·L), dt_bias [H], ddt_out [rows, H] (may be empty).
inline DtResult dt_softplus(const Vec& dt, const Vec& dt_bias, const Vec& ddt_out, double lo,
                            double hi) {
  const std::size_t H = dt_bias.size(), n = dt.size();
  DtResult r{Vec(n), Vec(n, 0.0), Vec(H, 0.0)};
  for (std::size_t i = 0; i < n; ++i) {
    const double u = dt[i] + dt_bias[i % H];
    r.out[i] = dt_out(u, lo, hi);
    if (ddt_out.empty()) continue;
    const double sp = u > 20 ? u : std::log1p(std::exp(u));
    const double slope = u > 20 ? 1 : sigmoid(u);
    r.ddt[i] = sp >= lo && sp <= hi ? ddt_out[i] * slope : 0;
    r.ddt_bias[i % H] += r.ddt[i];
  }
  return r;
}

}  // namespace kdnn_test::ssm_ref
