// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Independent double-precision references for the Sinkhorn tests: the plain
// forward formula as written in the reference (exp, then divisions), reverse
// mode through stored iterates, and central finite differences.
#include <cmath>
#include <cstddef>
#include <vector>

#include "allclose.hpp"  // rel_error

namespace kdnn_test {

/// One n×n matrix, row-major.
using Mat = std::vector<double>;

/// Matrix b of a flattened [batch, n, n] array.
inline Mat matrix(const std::vector<double>& all, std::size_t b, std::size_t n) {
  return Mat(all.begin() + b * n * n, all.begin() + (b + 1) * n * n);
}

/// The forward's variant: the order of the two normalisations of an
/// iteration and TileKernels' eps (added after the first normalisation, and
/// to the sum of every later one).
struct Variant {
  bool rows_first = false;
  double eps = 0;
};

/// Normalisation step `it` (0 .. 2·iters − 1) divides columns?
inline bool step_divides_columns(const Variant& v, int it) { return (it % 2 == 0) != v.rows_first; }

/// The eps added to the sum of normalisation step `it` (none for the first).
inline double step_eps(const Variant& v, int it) { return it == 0 ? 0.0 : v.eps; }

/// Normalisation step `it` of the plain formula, in place on Z (n×n), and for
/// it = 0 the + eps that follows it.
template <class Real>
void normalise_step(std::vector<Real>& Z, int n, const Variant& var, int it) {
  const bool cols = step_divides_columns(var, it);
  for (int a = 0; a < n; ++a) {
    Real s = Real(step_eps(var, it));
    for (int k = 0; k < n; ++k) s += cols ? Z[k * n + a] : Z[a * n + k];
    for (int k = 0; k < n; ++k) (cols ? Z[k * n + a] : Z[a * n + k]) /= s;
  }
  if (it == 0) {
    for (auto& z : Z) z += Real(var.eps);  // its reverse is the identity
  }
}

/// The plain formula, computed in Real (long double reaches exp(±11000),
/// for inputs whose exp() overflows or underflows in double).
template <class Real = double>
Mat ref_forward(const Mat& X, int n, int iters, const Variant& var = {}) {
  std::vector<Real> R(n * n);
  for (int e = 0; e < n * n; ++e) R[e] = std::exp(Real(X[e]));
  for (int it = 0; it < 2 * iters; ++it) normalise_step(R, n, var, it);
  return Mat(R.begin(), R.end());
}

/// dX of L = Σ G∘R(X) by reverse mode through all stored iterates, in Real.
template <class Real = double>
Mat ref_unrolled_backward(const Mat& X, const Mat& G, int n, int iters, const Variant& var = {}) {
  using Vec = std::vector<Real>;
  std::vector<Vec> states;  // input of every normalisation step
  Vec Z(n * n);
  for (int e = 0; e < n * n; ++e) Z[e] = std::exp(Real(X[e]));
  const Vec P = Z;
  for (int it = 0; it < 2 * iters; ++it) {
    states.push_back(Z);
    normalise_step(Z, n, var, it);
  }
  Vec dZ(G.begin(), G.end());
  for (int it = 2 * iters - 1; it >= 0; --it) {
    const Vec& In = states[it];
    const bool cols = step_divides_columns(var, it);
    const Real eps = Real(step_eps(var, it));
    Vec dIn(n * n);
    for (int a = 0; a < n; ++a) {
      auto idx = [&](int k) { return cols ? k * n + a : a * n + k; };
      Real s = eps, d = 0;
      for (int k = 0; k < n; ++k) s += In[idx(k)];
      for (int k = 0; k < n; ++k) d += dZ[idx(k)] * In[idx(k)];
      // y_k = x_k / s:  dx_k = dy_k / s − (Σ dy_l x_l) / s²
      for (int k = 0; k < n; ++k) dIn[idx(k)] = dZ[idx(k)] / s - d / (s * s);
    }
    dZ = dIn;
  }
  for (int e = 0; e < n * n; ++e) dZ[e] *= P[e];
  return Mat(dZ.begin(), dZ.end());
}

/// max(max_i |Σ_j R_ij − 1|, max_j |Σ_i R_ij − 1|), NaN if R holds NaN.
inline double marginal_error(const Mat& R, int n) {
  double e = 0;
  for (int a = 0; a < n; ++a) {
    double row = 0, col = 0;
    for (int k = 0; k < n; ++k) {
      row += R[a * n + k];
      col += R[k * n + a];
    }
    for (double d : {std::abs(row - 1), std::abs(col - 1)}) e = (d > e || d != d) ? d : e;
  }
  return e;
}

/// Central differences of L = Σ G∘R(X) with step h.
inline Mat finite_difference(const Mat& X, const Mat& G, int n, int iters, double h,
                             const Variant& var = {}) {
  Mat dX(n * n);
  for (int e = 0; e < n * n; ++e) {
    Mat Xp = X, Xm = X;
    Xp[e] += h;
    Xm[e] -= h;
    const Mat Rp = ref_forward(Xp, n, iters, var), Rm = ref_forward(Xm, n, iters, var);
    double lp = 0, lm = 0;
    for (int k = 0; k < n * n; ++k) {
      lp += G[k] * Rp[k];
      lm += G[k] * Rm[k];
    }
    dX[e] = (lp - lm) / (2 * h);
  }
  return dX;
}

}  // namespace kdnn_test
