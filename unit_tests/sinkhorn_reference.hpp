#pragma once
// Independent double-precision references for the Sinkhorn tests: the plain
// forward formula as written in the reference (exp, then divisions), reverse
// mode through stored iterates, and central finite differences.
#include <cmath>
#include <cstddef>
#include <vector>

namespace kdnn_test {

/// One n×n matrix, row-major.
using Mat = std::vector<double>;

inline Mat ref_forward(const Mat& X, int n, int iters) {
  Mat R(n * n);
  for (int e = 0; e < n * n; ++e) R[e] = std::exp(X[e]);
  for (int it = 0; it < iters; ++it) {
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int i = 0; i < n; ++i) s += R[i * n + j];
      for (int i = 0; i < n; ++i) R[i * n + j] /= s;
    }
    for (int i = 0; i < n; ++i) {
      double s = 0;
      for (int j = 0; j < n; ++j) s += R[i * n + j];
      for (int j = 0; j < n; ++j) R[i * n + j] /= s;
    }
  }
  return R;
}

/// dX of L = Σ G∘R(X) by reverse mode through all stored iterates.
inline Mat ref_unrolled_backward(const Mat& X, const Mat& G, int n, int iters) {
  std::vector<Mat> states;  // input of every normalisation step
  Mat Z(n * n);
  for (int e = 0; e < n * n; ++e) Z[e] = std::exp(X[e]);
  const Mat P = Z;
  for (int it = 0; it < 2 * iters; ++it) {
    states.push_back(Z);
    const bool cols = it % 2 == 0;
    for (int a = 0; a < n; ++a) {
      double s = 0;
      for (int k = 0; k < n; ++k) s += cols ? Z[k * n + a] : Z[a * n + k];
      for (int k = 0; k < n; ++k) (cols ? Z[k * n + a] : Z[a * n + k]) /= s;
    }
  }
  Mat dZ = G;
  for (int it = 2 * iters - 1; it >= 0; --it) {
    const Mat& In = states[it];
    const bool cols = it % 2 == 0;
    Mat dIn(n * n);
    for (int a = 0; a < n; ++a) {
      auto idx = [&](int k) { return cols ? k * n + a : a * n + k; };
      double s = 0, d = 0;
      for (int k = 0; k < n; ++k) s += In[idx(k)];
      for (int k = 0; k < n; ++k) d += dZ[idx(k)] * In[idx(k)];
      // y_k = x_k / s:  dx_k = dy_k / s − (Σ dy_l x_l) / s²
      for (int k = 0; k < n; ++k) dIn[idx(k)] = dZ[idx(k)] / s - d / (s * s);
    }
    dZ = dIn;
  }
  for (int e = 0; e < n * n; ++e) dZ[e] *= P[e];
  return dZ;
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

/// ||a − b|| / max(||b||, tiny).
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    num += (a[k] - b[k]) * (a[k] - b[k]);
    den += b[k] * b[k];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

}  // namespace kdnn_test
