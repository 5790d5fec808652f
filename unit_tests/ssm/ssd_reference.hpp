// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The SSD's definition as a plain float64 recurrence, one step at a time
// (no chunks), and its backward by the adjoint recurrence, for the tests:
//
//   h_t = exp(dt_t·A_h)·h_{t−1} + dt_t·x_t ⊗ B_t,   y_t = h_t·C_t + D_h·x_t
//
// with head h reading group h / (H/G). Flat row-major vectors: x [B,L,H,P],
// dt [B,L,H], A [H], B and C [B,L,G,N], D [H], states [B,H,P,N]. Packed
// sequences (seq [B,L], ids as doubles): a step whose id differs from the
// previous step's starts a sequence, and its h_{t−1} is not carried (the
// decay into it is 0).
#include <cmath>
#include <cstddef>
#include <vector>

namespace kdnn_test::ssm_ref {

using Vec = std::vector<double>;

struct SsdShape {
  int B, L, H, P, G, N;
};

/// One problem; D, init and dfinal may be empty (not given).
struct SsdCase {
  SsdShape s;
  Vec x, dt, A, Bm, Cm, D, init, dy, dfinal;
  Vec seq;  ///< [B, L] sequence ids; empty: one sequence per batch entry
};

/// The decay into step t of batch entry b, head h: exp(dt_t·A_h), or 0 where
/// step t starts a sequence.
inline double step_decay(const SsdCase& a, int b, int t, int h) {
  const std::size_t bt = std::size_t(b) * a.s.L + t;
  if (!a.seq.empty() && t > 0 && a.seq[bt] != a.seq[bt - 1]) return 0.0;
  return std::exp(a.dt[bt * a.s.H + h] * a.A[h]);
}

struct SsdForwardResult {
  Vec y, final_state;
};

struct SsdBackwardResult {
  Vec dx, ddt, dA, dB, dC, dD, dinit;
};

/// Index helpers for the flat layouts.
struct SsdIndex {
  SsdShape s;
  std::size_t x(int b, int t, int h, int p) const {
    return ((std::size_t(b) * s.L + t) * s.H + h) * s.P + p;
  }
  std::size_t dt(int b, int t, int h) const { return (std::size_t(b) * s.L + t) * s.H + h; }
  std::size_t bc(int b, int t, int h, int n) const {
    return ((std::size_t(b) * s.L + t) * s.G + h / (s.H / s.G)) * s.N + n;
  }
  std::size_t state(int b, int h, int p, int n) const {
    return ((std::size_t(b) * s.H + h) * s.P + p) * s.N + n;
  }
};

/// The states h_t of (b, h) for t = −1 (the initial state) … L−1, each [P, N].
inline std::vector<Vec> ssd_states(const SsdCase& a, int b, int h) {
  const SsdShape& s = a.s;
  const SsdIndex ix{s};
  std::vector<Vec> hs(std::size_t(s.L) + 1, Vec(std::size_t(s.P) * s.N, 0.0));
  if (!a.init.empty()) {
    for (int p = 0; p < s.P; ++p)
      for (int n = 0; n < s.N; ++n) hs[0][std::size_t(p) * s.N + n] = a.init[ix.state(b, h, p, n)];
  }
  for (int t = 0; t < s.L; ++t) {
    const double dt = a.dt[ix.dt(b, t, h)], decay = step_decay(a, b, t, h);
    for (int p = 0; p < s.P; ++p) {
      const double xt = dt * a.x[ix.x(b, t, h, p)];
      for (int n = 0; n < s.N; ++n) {
        const std::size_t e = std::size_t(p) * s.N + n;
        hs[t + 1][e] = decay * hs[t][e] + xt * a.Bm[ix.bc(b, t, h, n)];
      }
    }
  }
  return hs;
}

inline SsdForwardResult ssd_forward(const SsdCase& a) {
  const SsdShape& s = a.s;
  const SsdIndex ix{s};
  SsdForwardResult r;
  r.y.assign(std::size_t(s.B) * s.L * s.H * s.P, 0.0);
  r.final_state.assign(std::size_t(s.B) * s.H * s.P * s.N, 0.0);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.H; ++h) {
      const auto hs = ssd_states(a, b, h);
      for (int t = 0; t < s.L; ++t) {
        for (int p = 0; p < s.P; ++p) {
          double y = a.D.empty() ? 0.0 : a.D[h] * a.x[ix.x(b, t, h, p)];
          for (int n = 0; n < s.N; ++n) {
            y += hs[t + 1][std::size_t(p) * s.N + n] * a.Cm[ix.bc(b, t, h, n)];
          }
          r.y[ix.x(b, t, h, p)] = y;
        }
      }
      for (int p = 0; p < s.P; ++p)
        for (int n = 0; n < s.N; ++n)
          r.final_state[ix.state(b, h, p, n)] = hs[s.L][std::size_t(p) * s.N + n];
    }
  }
  return r;
}

/// The gradients of Σ y·dy + Σ final·dfinal, by the adjoint recurrence
/// g_t = dL/dh_t = dy_t ⊗ C_t + exp(a_{t+1})·g_{t+1}, g_{L−1} including dfinal.
inline SsdBackwardResult ssd_backward(const SsdCase& a) {
  const SsdShape& s = a.s;
  const SsdIndex ix{s};
  SsdBackwardResult r;
  r.dx.assign(a.x.size(), 0.0);
  r.ddt.assign(a.dt.size(), 0.0);
  r.dA.assign(s.H, 0.0);
  r.dB.assign(a.Bm.size(), 0.0);
  r.dC.assign(a.Cm.size(), 0.0);
  r.dD.assign(s.H, 0.0);
  r.dinit.assign(std::size_t(s.B) * s.H * s.P * s.N, 0.0);
  const std::size_t PN = std::size_t(s.P) * s.N;
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.H; ++h) {
      const auto hs = ssd_states(a, b, h);
      Vec g(PN, 0.0);
      if (!a.dfinal.empty()) {
        for (int p = 0; p < s.P; ++p)
          for (int n = 0; n < s.N; ++n)
            g[std::size_t(p) * s.N + n] = a.dfinal[ix.state(b, h, p, n)];
      }
      for (int t = s.L - 1; t >= 0; --t) {
        const double dt = a.dt[ix.dt(b, t, h)], decay = step_decay(a, b, t, h);
        for (int p = 0; p < s.P; ++p) {
          const double dy = a.dy[ix.x(b, t, h, p)];
          for (int n = 0; n < s.N; ++n) {
            g[std::size_t(p) * s.N + n] += dy * a.Cm[ix.bc(b, t, h, n)];
            r.dC[ix.bc(b, t, h, n)] += dy * hs[t + 1][std::size_t(p) * s.N + n];
          }
        }
        double da = 0, xdx = 0, dyx = 0;
        for (int p = 0; p < s.P; ++p) {
          const double xv = a.x[ix.x(b, t, h, p)], dy = a.dy[ix.x(b, t, h, p)];
          double dxt = 0;  // dL/d(dt·x)
          for (int n = 0; n < s.N; ++n) {
            const std::size_t e = std::size_t(p) * s.N + n;
            dxt += g[e] * a.Bm[ix.bc(b, t, h, n)];
            r.dB[ix.bc(b, t, h, n)] += g[e] * dt * xv;
            da += g[e] * decay * hs[t][e];
          }
          r.dx[ix.x(b, t, h, p)] = dt * dxt + (a.D.empty() ? 0.0 : a.D[h] * dy);
          xdx += xv * dxt;
          dyx += dy * xv;
        }
        r.ddt[ix.dt(b, t, h)] = a.A[h] * da + xdx;
        r.dA[h] += dt * da;
        r.dD[h] += dyx;
        for (double& v : g) v *= decay;
      }
      for (int p = 0; p < s.P; ++p)
        for (int n = 0; n < s.N; ++n) r.dinit[ix.state(b, h, p, n)] = g[std::size_t(p) * s.N + n];
    }
  }
  return r;
}

}  // namespace kdnn_test::ssm_ref
