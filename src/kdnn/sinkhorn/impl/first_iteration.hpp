// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The first Sinkhorn iteration and its reverse, shared by the forward and the
// unrolled backward; one team thread and its vector lanes, in double. Written
// for the columns-first order (rows first is the same on Xᵀ).
//
// Forward: S = column softmax of X (S_ij = exp(X_ij − m_j) / s_j with m_j the
// column maximum, so s_j >= 1), Q = S + eps, then P_ij = Q_ij / ρ_i with
// ρ_i = Σ_j Q_ij + eps. For eps = 0 this equals exp(X) divided by its column
// sums and then by its row sums, without forming exp(X). A row whose entries
// all underflow (ρ_i tiny, only for spreads of X beyond ~600) is computed in
// the log domain instead, at half scale so that differences of values up to
// ±DBL_MAX stay finite:
//   h_j = (X_ij − m_j − log s_j) / 2,  P_ij = (e^{2(h_j − h*)} + ε) / Σ,
// with h* = max(max_j h_j, log(eps)/2), ε = eps e^{−2h*} and
// Σ = Σ_j e^{2(h_j − h*)} + (n + 1) ε. Every row of P has an entry >= 1/(n+1)
// and every column one >= 1/(n+1)², so the later iterations cannot overflow or
// divide by zero, whatever the range of X.
//
// Reverse (for dP = dL/dP): with w_i = eps/ρ_i (so S_ij/ρ_i = P_ij − w_i),
// a_i = Σ_l dP_il P_il and b_j = Σ_l (dP_lj − a_l)(P_lj − w_l), the chain rule
// through P = Q/ρ and the column softmax gives
//   dX_ij = (P_ij − w_i)(dP_ij − a_i) − S_ij b_j,
// which never divides by ρ_i, so it stays finite where ρ_i underflows
// (rebuilding S = ρ∘P, as a plain reverse sweep would, gives 0·∞ there).
#include "kdnn/core/compat.hpp"

namespace kdnn::sinkhorn::impl {

/// The first iteration's statistics, kept for the reverse.
struct FirstIteration {
  double* shift;       ///< m_j, n entries
  double* inv_colsum;  ///< 1 / s_j, n entries
  double* row_eps;     ///< w_i = eps / ρ_i, n entries (0 when eps = 0)
  double* S;           ///< optional (may be null): the column softmax, n×ld
};

/// Column j's statistics, by the lane that owns the column: its maximum
/// m_j (`shift`), e_i = exp(x(i) − m_j) for x(i) = X_ij, handed to
/// put(i, e_i), and 1 / s_j with s_j = Σ_i e_i (`inv_colsum`). Both forms of
/// the forward call this (and first_row), so their first iterations agree
/// bitwise.
template <class XCol, class Put>
KOKKOS_FORCEINLINE_FUNCTION void first_column(int n, const XCol& x, const Put& put, double& shift,
                                              double& inv_colsum) {
  double m = x(0);
  for (int i = 1; i < n; ++i) m = m > x(i) ? m : x(i);
  double s = 0;
  for (int i = 0; i < n; ++i) {
    const double e = compat::exp(x(i) - m);
    put(i, e);
    s += e;
  }
  shift = m;
  inv_colsum = 1 / s;
}

/// Row i of P, by the lane that owns the row, from e(j) = exp(X_ij − m_j),
/// x(j) = X_ij and the columns' shift(j) = m_j and inv_colsum(j) = 1 / s_j:
/// P_ij is handed to put(j, P_ij) (after e(j) was last read); returns
/// w_i = eps / ρ_i.
template <class E, class XRow, class Shift, class InvColsum, class Put>
KOKKOS_FORCEINLINE_FUNCTION double first_row(int n, const E& e, const XRow& x, const Shift& shift,
                                             const InvColsum& inv_colsum, double eps,
                                             const Put& put) {
  double rho = eps;
  for (int j = 0; j < n; ++j) rho += e(j) * inv_colsum(j) + eps;
  if (rho > 1e-280) {
    const double inv_rho = 1 / rho;
    for (int j = 0; j < n; ++j) put(j, (e(j) * inv_colsum(j) + eps) * inv_rho);
    return eps * inv_rho;
  }
  auto h = [&](int j) { return 0.5 * x(j) - 0.5 * shift(j) + 0.5 * compat::log(inv_colsum(j)); };
  const double h_eps = eps > 0 ? 0.5 * compat::log(eps) : 0;
  double hmax = h(0);
  for (int j = 1; j < n; ++j) hmax = hmax > h(j) ? hmax : h(j);
  if (eps > 0 && h_eps > hmax) hmax = h_eps;
  const double eh = eps > 0 ? compat::exp(2 * (h_eps - hmax)) : 0;
  double sum = (n + 1) * eh;
  for (int j = 0; j < n; ++j) sum += compat::exp(2 * (h(j) - hmax));
  const double inv_sum = 1 / sum;
  for (int j = 0; j < n; ++j) put(j, (compat::exp(2 * (h(j) - hmax)) + eh) * inv_sum);
  return eh * inv_sum;
}

/// P (n×n, row stride ld) from X, read through x(i, j) -> double.
template <class Member, class XAt>
KOKKOS_INLINE_FUNCTION void first_iteration(const Member& team, int n, const XAt& x, double eps,
                                            double* P, int ld, const FirstIteration& fi) {
  const auto lanes = Kokkos::ThreadVectorRange(team, n);
  Kokkos::parallel_for(lanes, [&](int j) {
    first_column(
        n, [&](int i) { return x(i, j); }, [&](int i, double e) { P[i * ld + j] = e; }, fi.shift[j],
        fi.inv_colsum[j]);
    if (fi.S != nullptr) {
      const double inv_s = fi.inv_colsum[j];
      for (int i = 0; i < n; ++i) fi.S[i * ld + j] = P[i * ld + j] * inv_s;
    }
  });
  Kokkos::parallel_for(lanes, [&](int i) {
    double* Pi = P + i * ld;
    fi.row_eps[i] = first_row(
        n, [&](int j) { return Pi[j]; }, [&](int j) { return x(i, j); },
        [&](int j) { return fi.shift[j]; }, [&](int j) { return fi.inv_colsum[j]; }, eps,
        [&](int j, double p) { Pi[j] = p; });
  });
}

/// dX of the first iteration, written through store(i, j, value), from its
/// output P, dP = dL/dP (both n×n, stride ld) and its statistics. `a` and `b`
/// are work vectors of n entries.
template <class Member, class XAt, class Store>
KOKKOS_INLINE_FUNCTION void first_iteration_reverse(const Member& team, int n, const XAt& x,
                                                    const double* P, const double* dP, int ld,
                                                    const FirstIteration& fi, double* a, double* b,
                                                    const Store& store) {
  const auto lanes = Kokkos::ThreadVectorRange(team, n);
  const double* w = fi.row_eps;
  Kokkos::parallel_for(lanes, [&](int i) {
    double s = 0;
    for (int l = 0; l < n; ++l) s += dP[i * ld + l] * P[i * ld + l];
    a[i] = s;
  });
  Kokkos::parallel_for(lanes, [&](int j) {
    double s = 0;
    for (int l = 0; l < n; ++l) s += (dP[l * ld + j] - a[l]) * (P[l * ld + j] - w[l]);
    b[j] = s;
  });
  for (int i = 0; i < n; ++i) {
    Kokkos::parallel_for(lanes, [&](int j) {
      const double S = fi.S != nullptr ? fi.S[i * ld + j]
                                       : compat::exp(x(i, j) - fi.shift[j]) * fi.inv_colsum[j];
      store(i, j, (P[i * ld + j] - w[i]) * (dP[i * ld + j] - a[i]) - S * b[j]);
    });
  }
}

}  // namespace kdnn::sinkhorn::impl
