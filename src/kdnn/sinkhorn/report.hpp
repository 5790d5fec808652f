// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Per-matrix diagnostics of the Sinkhorn operators, and their summary.
#include <Kokkos_Core.hpp>

#include "kdnn/core/nan_max.hpp"

namespace kdnn::sinkhorn {

/// Optional per-matrix diagnostics; leave a view empty to skip it. NaN in the
/// inputs propagates into every floating-point entry.
template <class ExecSpace>
struct Report {
  using memory_space = typename ExecSpace::memory_space;
  /// Forward: iterations run. Backward (implicit/block): CG iterations.
  Kokkos::View<int*, memory_space> iterations;
  /// max(max_i |Σ_j R_ij − 1|, max_j |Σ_i R_ij − 1|) of the forward's output
  /// R, or of the R the backward was given. Well above the working precision
  /// it says R has not converged: the implicit and block gradients then
  /// differ from the unrolled one (backward_unrolled).
  Kokkos::View<double*, memory_space> marginal_error;
  /// Backward (implicit/block): final CG relative residual ||r|| / ||b||.
  /// Above the rtol asked for, CG did not converge within max_iters.
  Kokkos::View<double*, memory_space> residual;

  /// A report with every view allocated for `batch` matrices.
  static Report allocate(std::size_t batch) {
    return {Kokkos::View<int*, memory_space>("kdnn::sinkhorn::iterations", batch),
            Kokkos::View<double*, memory_space>("kdnn::sinkhorn::marginal_error", batch),
            Kokkos::View<double*, memory_space>("kdnn::sinkhorn::residual", batch)};
  }
};

/// A report reduced over the batch (0 for an empty view or batch). The maxima
/// propagate NaN: one NaN entry makes the maximum NaN.
struct ReportSummary {
  int max_iterations = 0;
  double max_marginal_error = 0;
  double max_residual = 0;
};

/// Reduces `report` on the host (synchronous: copies each view there).
template <class ExecSpace>
ReportSummary summarize(const Report<ExecSpace>& report) {
  const auto max_of = [](const auto& view) {
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
    double m = 0;
    for (std::size_t i = 0; i < host.extent(0); ++i) m = nan_max(m, double(host(i)));
    return m;
  };
  ReportSummary s;
  s.max_iterations = int(max_of(report.iterations));
  s.max_marginal_error = max_of(report.marginal_error);
  s.max_residual = max_of(report.residual);
  return s;
}

}  // namespace kdnn::sinkhorn
