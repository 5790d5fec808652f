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

/// The plain formula, computed in Real (long double reaches exp(±11000),
/// for inputs whose exp() overflows or underflows in double).
template <class Real = double>
Mat ref_forward(const Mat& X, int n, int iters) {
  std::vector<Real> R(n * n);
  for (int e = 0; e < n * n; ++e) R[e] = std::exp(Real(X[e]));
  for (int it = 0; it < iters; ++it) {
    for (int j = 0; j < n; ++j) {
      Real s = 0;
      for (int i = 0; i < n; ++i) s += R[i * n + j];
      for (int i = 0; i < n; ++i) R[i * n + j] /= s;
    }
    for (int i = 0; i < n; ++i) {
      Real s = 0;
      for (int j = 0; j < n; ++j) s += R[i * n + j];
      for (int j = 0; j < n; ++j) R[i * n + j] /= s;
    }
  }
  return Mat(R.begin(), R.end());
}

/// dX of L = Σ G∘R(X) by reverse mode through all stored iterates, in Real.
template <class Real = double>
Mat ref_unrolled_backward(const Mat& X, const Mat& G, int n, int iters) {
  using Vec = std::vector<Real>;
  std::vector<Vec> states;  // input of every normalisation step
  Vec Z(n * n);
  for (int e = 0; e < n * n; ++e) Z[e] = std::exp(Real(X[e]));
  const Vec P = Z;
  for (int it = 0; it < 2 * iters; ++it) {
    states.push_back(Z);
    const bool cols = it % 2 == 0;
    for (int a = 0; a < n; ++a) {
      Real s = 0;
      for (int k = 0; k < n; ++k) s += cols ? Z[k * n + a] : Z[a * n + k];
      for (int k = 0; k < n; ++k) (cols ? Z[k * n + a] : Z[a * n + k]) /= s;
    }
  }
  Vec dZ(G.begin(), G.end());
  for (int it = 2 * iters - 1; it >= 0; --it) {
    const Vec& In = states[it];
    const bool cols = it % 2 == 0;
    Vec dIn(n * n);
    for (int a = 0; a < n; ++a) {
      auto idx = [&](int k) { return cols ? k * n + a : a * n + k; };
      Real s = 0, d = 0;
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

/// Central differences of L = Σ G∘R(X) with step h.
inline Mat finite_difference(const Mat& X, const Mat& G, int n, int iters, double h) {
  Mat dX(n * n);
  for (int e = 0; e < n * n; ++e) {
    Mat Xp = X, Xm = X;
    Xp[e] += h;
    Xm[e] -= h;
    const Mat Rp = ref_forward(Xp, n, iters), Rm = ref_forward(Xm, n, iters);
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
