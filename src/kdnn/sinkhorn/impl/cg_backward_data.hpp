// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What both forms of the Sinkhorn implicit and block backwards take
// (cg_backward_kernel.hpp and cg_backward_gpu_kernel.hpp), with the layout
// of their vectors in scratch and the report's writes.
#include <Kokkos_Core.hpp>
#include "kdnn/core/impl/projected_cg.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::sinkhorn::impl {

/// What both forms of the implicit and block backward take: the operands,
/// the report's views and the solver's settings.
template <class ExecSpace, class T>
struct CGBackwardData {
  Batch<const T, ExecSpace> R, G;
  Batch<T, ExecSpace> dX;
  Kokkos::View<int*, typename ExecSpace::memory_space> iters_out;
  Kokkos::View<double*, typename ExecSpace::memory_space> marginal_error_out, residual_out;
  int max_iters = 0;
  double rtol = 0;
  bool block = false, measured = false;

  /// s_r (then u), s_c, R's row and column sums a and c and a product buffer
  /// q (n each); the CG vectors x, r, p, Ap (2n each: the block system has 2n
  /// unknowns).
  template <class Work>
  static KOKKOS_INLINE_FUNCTION void carve_vectors(kdnn::impl::ScratchCarver& s, int n, Work& w) {
    w.sr = s.take<T>(n);
    w.sc = s.take<T>(n);
    w.a = s.take<T>(n);
    w.c = s.take<T>(n);
    w.q = s.take<T>(n);
    w.x = s.take<T>(2 * n);
    w.r = s.take<T>(2 * n);
    w.p = s.take<T>(2 * n);
    w.Ap = s.take<T>(2 * n);
  }

  /// Matrix b's report entries.
  KOKKOS_INLINE_FUNCTION void report(int b, const kdnn::impl::CGResult& cg,
                                     double marginal_error) const {
    if (iters_out.extent(0) > 0) iters_out(b) = cg.iterations;
    if (marginal_error_out.extent(0) > 0) marginal_error_out(b) = marginal_error;
    if (residual_out.extent(0) > 0) residual_out(b) = cg.relative_residual;
  }
  /// The same, by one lane of a team thread.
  template <class Member>
  KOKKOS_INLINE_FUNCTION void report(const Member& team, int b, const kdnn::impl::CGResult& cg,
                                     double marginal_error) const {
    Kokkos::single(Kokkos::PerThread(team), [&]() { report(b, cg, marginal_error); });
  }
};

}  // namespace kdnn::sinkhorn::impl
