#pragma once
// The first Sinkhorn iteration and its reverse, shared by the forward and the
// unrolled backward; one team thread and its vector lanes, in double.
//
// Forward: S = column softmax of X (S_ij = exp(X_ij − m_j) / s_j with m_j the
// column maximum, so s_j >= 1), then P_ij = S_ij / ρ_i with ρ_i = Σ_j S_ij.
// This equals exp(X) divided by its column sums and then by its row sums,
// without forming exp(X). A row whose entries all underflow (ρ_i tiny, only
// for spreads of X beyond ~600) is computed in the log domain instead:
// log P_ij = l_ij − logsumexp_j l_ij with l_ij = X_ij − m_j − log s_j. Every
// row of P has an entry >= 1/n and every column one >= 1/n², so the later
// iterations cannot overflow or divide by zero, whatever the range of X.
//
// Reverse (for dP = dL/dP): with a_i = Σ_l dP_il P_il and
// b_j = Σ_l (dP_lj − a_l) P_lj, the chain rule through P = S/ρ and the column
// softmax gives
//   dX_ij = P_ij (dP_ij − a_i) − S_ij b_j,
// which never divides by ρ_i, so it stays finite where ρ_i underflows
// (rebuilding S = ρ∘P, as a plain reverse sweep would, gives 0·∞ there).
#include "kdnn/core/compat.hpp"

namespace kdnn::sinkhorn::impl {

/// The first iteration's column statistics, kept for the reverse.
struct ColumnSoftmax {
  double* shift;       ///< m_j, n entries
  double* inv_colsum;  ///< 1 / s_j, n entries
};

/// P (n×n, row stride ld) from X, read through x(i, j) -> double.
template <class Member, class XAt>
KOKKOS_INLINE_FUNCTION void first_iteration(const Member& team, int n, const XAt& x,
                                            double* P, int ld, const ColumnSoftmax& cs) {
  const auto lanes = Kokkos::ThreadVectorRange(team, n);
  Kokkos::parallel_for(lanes, [&](int j) {
    double m = x(0, j);
    for (int i = 1; i < n; ++i) m = m > x(i, j) ? m : x(i, j);
    double s = 0;
    for (int i = 0; i < n; ++i) {
      P[i * ld + j] = compat::exp(x(i, j) - m);
      s += P[i * ld + j];
    }
    cs.shift[j] = m;
    cs.inv_colsum[j] = 1 / s;
  });
  Kokkos::parallel_for(lanes, [&](int i) {
    double rho = 0;
    for (int j = 0; j < n; ++j) rho += P[i * ld + j] * cs.inv_colsum[j];
    if (rho > 1e-280) {
      const double inv_rho = 1 / rho;
      for (int j = 0; j < n; ++j) P[i * ld + j] *= cs.inv_colsum[j] * inv_rho;
      return;
    }
    auto l = [&](int j) { return x(i, j) - cs.shift[j] + compat::log(cs.inv_colsum[j]); };
    double lmax = l(0);
    for (int j = 1; j < n; ++j) lmax = lmax > l(j) ? lmax : l(j);
    double sum = 0;
    for (int j = 0; j < n; ++j) sum += compat::exp(l(j) - lmax);
    for (int j = 0; j < n; ++j) P[i * ld + j] = compat::exp(l(j) - lmax - compat::log(sum));
  });
}

/// dX of the first iteration, written through store(i, j, value), from its
/// output P, dP = dL/dP (both n×n, stride ld) and the column statistics.
/// `a` and `b` are work vectors of n entries.
template <class Member, class XAt, class Store>
KOKKOS_INLINE_FUNCTION void first_iteration_reverse(const Member& team, int n, const XAt& x,
                                                    const double* P, const double* dP, int ld,
                                                    const ColumnSoftmax& cs, double* a,
                                                    double* b, const Store& store) {
  const auto lanes = Kokkos::ThreadVectorRange(team, n);
  Kokkos::parallel_for(lanes, [&](int i) {
    double s = 0;
    for (int l = 0; l < n; ++l) s += dP[i * ld + l] * P[i * ld + l];
    a[i] = s;
  });
  Kokkos::parallel_for(lanes, [&](int j) {
    double s = 0;
    for (int l = 0; l < n; ++l) s += (dP[l * ld + j] - a[l]) * P[l * ld + j];
    b[j] = s;
  });
  for (int i = 0; i < n; ++i) {
    Kokkos::parallel_for(lanes, [&](int j) {
      const double S = compat::exp(x(i, j) - cs.shift[j]) * cs.inv_colsum[j];
      store(i, j, P[i * ld + j] * (dP[i * ld + j] - a[i]) - S * b[j]);
    });
  }
}

}  // namespace kdnn::sinkhorn::impl
