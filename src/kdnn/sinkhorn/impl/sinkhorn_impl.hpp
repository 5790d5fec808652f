// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of kdnn::sinkhorn::impl::{forward, backward, backward_unrolled}:
// host-side validation, then one TeamPolicy launch. Included at the end of
// sinkhorn.hpp: libkdnn instantiates the pairs of core/impl/eti.hpp
// (sinkhorn_eti.cpp; `extern template` elsewhere), any other execution space
// instantiates from here on use.
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "kdnn/core/impl/finite_values.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/sinkhorn/impl/cg_backward_gpu_kernel.hpp"
#include "kdnn/sinkhorn/impl/cg_backward_kernel.hpp"
#include "kdnn/sinkhorn/impl/cg_backward_thread_kernel.hpp"
#include "kdnn/sinkhorn/impl/forward_gpu_kernel.hpp"
#include "kdnn/sinkhorn/impl/forward_kernel.hpp"
#include "kdnn/sinkhorn/impl/forward_thread_kernel.hpp"
#include "kdnn/sinkhorn/impl/matrix_forms.hpp"
#include "kdnn/sinkhorn/impl/unrolled_backward_gpu_kernel.hpp"
#include "kdnn/sinkhorn/impl/unrolled_backward_kernel.hpp"
#include "kdnn/sinkhorn/impl/unrolled_backward_thread_kernel.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::sinkhorn::impl {

/// The report's views: a batch entry each, and no overlap with the operator's
/// matrices (a report written over X or R would corrupt them).
template <class ExecSpace, class... Views>
void validate_report(const char* op, const Report<ExecSpace>& report, std::size_t batch,
                     const Views&... matrices) {
  validate::optional_batch(op, "report.iterations", report.iterations, batch);
  validate::optional_batch(op, "report.marginal_error", report.marginal_error, batch);
  validate::optional_batch(op, "report.residual", report.residual, batch);
  const auto no_alias = [&](const char* name, const auto& view) {
    (validate::no_alias(op, name, view, matrices.first, matrices.second), ...);
  };
  no_alias("report.iterations", report.iterations);
  no_alias("report.marginal_error", report.marginal_error);
  no_alias("report.residual", report.residual);
  validate::no_alias(op, "report.marginal_error", report.marginal_error, "report.residual",
                     report.residual);
  validate::no_alias(op, "report.iterations", report.iterations, "report.marginal_error",
                     report.marginal_error);
  validate::no_alias(op, "report.iterations", report.iterations, "report.residual",
                     report.residual);
}

inline void validate_forward_options(const char* op, const ForwardOptions& opts) {
  validate::in_range(op, "iters", opts.iters, 1, std::numeric_limits<int>::max());
  if (!(std::isfinite(opts.tol) && opts.tol >= 0)) {
    fail(op, ": tol=", opts.tol, ", expected a finite value >= 0");
  }
  if (!(opts.eps >= 0 && opts.eps <= 1)) {
    fail(op, ": eps=", opts.eps, ", expected a value in [0, 1]");
  }
  if (opts.order != Order::columns_first && opts.order != Order::rows_first) {
    fail(op, ": order=", int(opts.order), ", expected Order::columns_first or Order::rows_first");
  }
}

/// n >= 1 (a batch of B >= 0 matrices of n×n) and sizes the kernels index
/// with int.
inline void validate_batch_size(const char* op, const char* name, std::size_t batch,
                                std::size_t n) {
  if (n == 0) {
    fail(op, ": ", name, " has shape [", batch, ", 0, 0], expected n >= 1");
  }
  if (batch > std::size_t(std::numeric_limits<int>::max()) ||
      n > std::size_t(std::numeric_limits<int>::max() / 2)) {
    fail(op, ": ", name, " has shape [", batch, ", ", n, ", ", n,
         "], expected batch and n below 2^31 and 2^30");
  }
}

/// Runs the GPU form of the forward (forward_gpu_kernel.hpp) with n = N;
/// `k` is the host form's kernel, already set up, whose operands and
/// settings it takes.
template <int N, class ExecSpace, class T>
void forward_gpu(const char* op, const ExecSpace& space, const ForwardKernel<ExecSpace, T>& k,
                 const Launch& launch) {
  ForwardGpuKernel<ExecSpace, T, N> g;
  static_cast<ForwardData<ExecSpace, T>&>(g) = k;
  g.batch = k.batch;
  g.transpose = k.transpose;
  g.run(op, space, launch);
}

/// Runs the GPU form of the implicit or block backward
/// (cg_backward_gpu_kernel.hpp) with n = N; `k` is the host form's kernel,
/// already set up, whose operands and settings it takes.
template <int N, class ExecSpace, class T>
void backward_gpu(const char* op, const ExecSpace& space, const CGBackwardKernel<ExecSpace, T>& k,
                  const Launch& launch) {
  CGBackwardGpuKernel<ExecSpace, T, N> g;
  static_cast<CGBackwardData<ExecSpace, T>&>(g) = k;
  g.batch = k.batch;
  g.run(op, space, launch);
}

/// Runs the GPU form of the unrolled backward (unrolled_backward_gpu_kernel.hpp)
/// with n = N, taking the host form's kernel `k`, already set up; false (and
/// nothing run) when one matrix's scaling-vector history does not fit
/// on-chip, which that form needs; with Step::plan_only, planned only.
template <int N, class ExecSpace, class T>
bool backward_unrolled_gpu(const char* op, const ExecSpace& space,
                           const UnrolledBackwardKernel<ExecSpace, T>& k, const Launch& launch,
                           Step step) {
  UnrolledBackwardGpuKernel<ExecSpace, T, N> g;
  static_cast<UnrolledBackwardData<ExecSpace, T>&>(g) = k;
  g.batch = k.batch;
  g.transpose = k.transpose;
  if (!g.fits_on_chip()) return false;
  g.run(op, space, launch, step);
  return true;
}

template <class ExecSpace, class T>
void forward(const ExecSpace& space, const Batch<const T, ExecSpace>& X,
             const Batch<T, ExecSpace>& R, const ForwardOptions& opts,
             const Report<ExecSpace>& report) {
  constexpr const char* op = "sinkhorn::forward";
  validate::square(op, "X", X);
  validate::same_shape(op, "R", R, "X", X);
  validate::no_alias(op, "R", R, "X", X);
  validate_batch_size(op, "X", X.extent(0), X.extent(1));
  validate_forward_options(op, opts);
  validate_report(op, report, X.extent(0), std::pair("X", X), std::pair("R", R));
  if (opts.check_finite) kdnn::impl::check_finite(op, space, "X", X);
  const int batch = int(X.extent(0)), n = int(X.extent(1));
  if (batch == 0) return;

  using Kernel = ForwardKernel<ExecSpace, T>;
  Kernel k;
  k.X = X;
  k.R = R;
  k.iters_out = report.iterations;
  k.error_out = report.marginal_error;
  k.batch = batch;
  k.n = n;
  k.transpose = opts.order == Order::rows_first;
  k.iters = opts.iters;
  k.tol = opts.tol;
  k.eps = opts.eps;
  const auto thread = [&](auto size) {
    ForwardThreadKernel<ExecSpace, T, decltype(size)::value> t;
    static_cast<ForwardData<ExecSpace, T>&>(t) = k;
    t.batch = batch;
    t.transpose = k.transpose;
    t.run(space);
  };
  const auto lanes = [&](auto size) {
    forward_gpu<decltype(size)::value>(op, space, k, opts.launch);
    return true;
  };
  if (run_matrix_form(op, space, opts.launch, n, thread, lanes)) return;
  k.run(op, space, n, opts.launch);
}

template <class ExecSpace, class T>
void backward(const ExecSpace& space, const Batch<const T, ExecSpace>& R,
              const Batch<const T, ExecSpace>& G, const Batch<T, ExecSpace>& dX,
              const BackwardOptions& opts, const Report<ExecSpace>& report) {
  constexpr const char* op = "sinkhorn::backward";
  validate::square(op, "R", R);
  validate::same_shape(op, "G", G, "R", R);
  validate::same_shape(op, "dX", dX, "R", R);
  validate::no_alias(op, "dX", dX, "R", R);
  validate::no_alias(op, "dX", dX, "G", G);
  validate_batch_size(op, "R", R.extent(0), R.extent(1));
  validate::in_half_open(op, "rtol", opts.rtol, 0.0, 1.0);
  if (opts.max_iters < 0) fail(op, ": max_iters=", opts.max_iters, ", expected >= 0");
  if (opts.method != Method::implicit && opts.method != Method::block) {
    fail(op, ": method=", int(opts.method), ", expected Method::implicit or Method::block");
  }
  if (opts.marginals != Marginals::measured && opts.marginals != Marginals::unit) {
    fail(op, ": marginals=", int(opts.marginals),
         ", expected Marginals::measured or Marginals::unit");
  }
  validate_report(op, report, R.extent(0), std::pair("R", R), std::pair("G", G),
                  std::pair("dX", dX));
  if (opts.check_finite) {
    kdnn::impl::check_finite(op, space, "R", R);
    kdnn::impl::check_finite(op, space, "G", G);
  }
  const int batch = int(R.extent(0)), n = int(R.extent(1));
  if (batch == 0) return;

  const bool block = opts.method == Method::block;
  using Kernel = CGBackwardKernel<ExecSpace, T>;
  Kernel k;
  k.R = R;
  k.G = G;
  k.dX = dX;
  k.iters_out = report.iterations;
  k.marginal_error_out = report.marginal_error;
  k.residual_out = report.residual;
  k.batch = batch;
  k.n = n;
  k.max_iters = opts.max_iters > 0 ? opts.max_iters : (block ? 4 : 2) * n;
  k.rtol = opts.rtol > 0 ? opts.rtol : default_rtol<T>();
  k.block = block;
  k.measured = opts.marginals == Marginals::measured;
  const auto thread = [&](auto size) {
    CGBackwardThreadKernel<ExecSpace, T, decltype(size)::value> t;
    static_cast<CGBackwardData<ExecSpace, T>&>(t) = k;
    t.batch = batch;
    t.run(space);
  };
  const auto lanes = [&](auto size) {
    backward_gpu<decltype(size)::value>(op, space, k, opts.launch);
    return true;
  };
  if (run_matrix_form(op, space, opts.launch, n, thread, lanes)) return;
  k.run(op, space, block ? 2 * n : n, opts.launch);
}

/// The reverse-mode kernel for X's shape and `opts` (its operands unset),
/// after the checks of X and the options.
template <class ExecSpace, class T>
UnrolledBackwardKernel<ExecSpace, T> unrolled_kernel(const char* op,
                                                     const Batch<const T, ExecSpace>& X,
                                                     const ForwardOptions& opts) {
  validate::square(op, "X", X);
  validate_batch_size(op, "X", X.extent(0), X.extent(1));
  validate_forward_options(op, opts);
  if (opts.tol != 0) {
    fail(op, ": tol=", opts.tol,
         ", expected 0 (reverse mode differentiates a fixed iteration count)");
  }
  UnrolledBackwardKernel<ExecSpace, T> k;
  k.batch = int(X.extent(0));
  k.n = int(X.extent(1));
  k.iters = opts.iters;
  k.eps = opts.eps;
  k.transpose = opts.order == Order::rows_first;
  return k;
}

/// Plans the reverse mode's launch in the form that suits n, and runs it
/// unless `step` is Step::plan_only.
template <class ExecSpace, class T>
void run_unrolled(const char* op, const ExecSpace& space,
                  const UnrolledBackwardKernel<ExecSpace, T>& k, const Launch& launch, Step step) {
  const auto thread = [&](auto size) {
    UnrolledBackwardThreadKernel<ExecSpace, T, decltype(size)::value> t;
    static_cast<UnrolledBackwardData<ExecSpace, T>&>(t) = k;
    t.batch = k.batch;
    t.transpose = k.transpose;
    t.run(op, space, launch, step);
  };
  const auto lanes = [&](auto size) {
    return backward_unrolled_gpu<decltype(size)::value>(op, space, k, launch, step);
  };
  if (run_matrix_form(op, space, launch, k.n, thread, lanes)) return;
  UnrolledBackwardKernel<ExecSpace, T> team = k;
  team.run(op, space, k.n, launch, step);
}

template <class ExecSpace, class T>
void backward_unrolled(const ExecSpace& space, const Batch<const T, ExecSpace>& X,
                       const Batch<const T, ExecSpace>& G, const Batch<T, ExecSpace>& dX,
                       const ForwardOptions& opts) {
  constexpr const char* op = "sinkhorn::backward_unrolled";
  auto k = unrolled_kernel<ExecSpace, T>(op, X, opts);
  validate::same_shape(op, "G", G, "X", X);
  validate::same_shape(op, "dX", dX, "X", X);
  validate::no_alias(op, "dX", dX, "X", X);
  validate::no_alias(op, "dX", dX, "G", G);
  if (opts.check_finite) {
    kdnn::impl::check_finite(op, space, "X", X);
    kdnn::impl::check_finite(op, space, "G", G);
  }
  if (k.batch == 0) return;
  k.X = X;
  k.G = G;
  k.dX = dX;
  run_unrolled(op, space, k, opts.launch, Step::launch);
}

template <class ExecSpace, class T>
void check_backward_unrolled(const ExecSpace& space, const Batch<const T, ExecSpace>& X,
                             const ForwardOptions& opts) {
  constexpr const char* op = "sinkhorn::backward_unrolled";
  const auto k = unrolled_kernel<ExecSpace, T>(op, X, opts);
  if (k.batch > 0) run_unrolled(op, space, k, opts.launch, Step::plan_only);
}

}  // namespace kdnn::sinkhorn::impl
