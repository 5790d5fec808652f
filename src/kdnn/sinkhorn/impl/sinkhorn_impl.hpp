#pragma once
// Definitions of kdnn::sinkhorn::impl::{forward, backward, backward_unrolled}:
// host-side validation, then one TeamPolicy launch. Included at the end of
// sinkhorn.hpp: libkdnn instantiates the pairs of core/impl/eti.hpp
// (sinkhorn_eti.cpp; `extern template` elsewhere), any other execution space
// instantiates from here on use.
#include <cmath>
#include <limits>

#include "kdnn/core/validate.hpp"
#include "kdnn/sinkhorn/impl/cg_backward_kernel.hpp"
#include "kdnn/sinkhorn/impl/forward_kernel.hpp"
#include "kdnn/sinkhorn/impl/unrolled_backward_kernel.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace>
void validate_report(const char* op, const Report<ExecSpace>& report, std::size_t batch) {
  validate::optional_batch(op, "report.iterations", report.iterations, batch);
  validate::optional_batch(op, "report.error", report.error, batch);
}

inline void validate_iters(const char* op, const ForwardOptions& opts) {
  validate::in_range(op, "iters", opts.iters, 1, std::numeric_limits<int>::max());
  if (!(std::isfinite(opts.tol) && opts.tol >= 0)) {
    fail(op, ": tol=", opts.tol, ", expected a finite value >= 0");
  }
}

inline void validate_batch_size(const char* op, const char* name, std::size_t batch,
                                std::size_t n) {
  if (batch > std::size_t(std::numeric_limits<int>::max()) ||
      n > std::size_t(std::numeric_limits<int>::max() / 2)) {
    fail(op, ": ", name, " has shape [", batch, ", ", n, ", ", n,
         "], expected batch and n below 2^31 and 2^30");
  }
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
  validate_iters(op, opts);
  validate_report(op, report, X.extent(0));
  const int batch = int(X.extent(0)), n = int(X.extent(1));
  if (batch == 0 || n == 0) return;

  using Kernel = ForwardKernel<ExecSpace, T>;
  Kernel k;
  k.X = X;
  k.R = R;
  k.iters_out = report.iterations;
  k.error_out = report.error;
  k.batch = batch;
  k.n = n;
  k.iters = opts.iters;
  k.tol = opts.tol;
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
  if (!(opts.rtol >= 0 && opts.rtol < 1)) {
    fail(op, ": rtol=", opts.rtol, ", expected a value in [0, 1)");
  }
  if (opts.max_iters < 0) fail(op, ": max_iters=", opts.max_iters, ", expected >= 0");
  if (opts.measured_marginals && opts.method != Method::implicit) {
    fail(op, ": measured_marginals=true needs method=implicit, got method=block");
  }
  validate_report(op, report, R.extent(0));
  const int batch = int(R.extent(0)), n = int(R.extent(1));
  if (batch == 0 || n == 0) return;

  const bool block = opts.method == Method::block;
  using Kernel = CGBackwardKernel<ExecSpace, T>;
  Kernel k;
  k.R = R;
  k.G = G;
  k.dX = dX;
  k.iters_out = report.iterations;
  k.error_out = report.error;
  k.batch = batch;
  k.n = n;
  k.max_iters = opts.max_iters > 0 ? opts.max_iters : (block ? 4 : 2) * n;
  k.rtol = opts.rtol > 0 ? opts.rtol : (sizeof(T) == 4 ? 1e-6 : 1e-12);
  k.block = block;
  k.measured = opts.measured_marginals;
  k.run(op, space, block ? 2 * n : n, opts.launch);
}

template <class ExecSpace, class T>
void backward_unrolled(const ExecSpace& space, const Batch<const T, ExecSpace>& X,
                       const Batch<const T, ExecSpace>& G, const Batch<T, ExecSpace>& dX,
                       const ForwardOptions& opts) {
  constexpr const char* op = "sinkhorn::backward_unrolled";
  validate::square(op, "X", X);
  validate::same_shape(op, "G", G, "X", X);
  validate::same_shape(op, "dX", dX, "X", X);
  validate::no_alias(op, "dX", dX, "X", X);
  validate::no_alias(op, "dX", dX, "G", G);
  validate_batch_size(op, "X", X.extent(0), X.extent(1));
  validate_iters(op, opts);
  if (opts.tol != 0) {
    fail(op, ": tol=", opts.tol,
         ", expected 0 (reverse mode differentiates a fixed iteration count)");
  }
  const int batch = int(X.extent(0)), n = int(X.extent(1));
  if (batch == 0 || n == 0) return;

  using Kernel = UnrolledBackwardKernel<ExecSpace, T>;
  Kernel k;
  k.X = X;
  k.G = G;
  k.dX = dX;
  k.batch = batch;
  k.n = n;
  k.iters = opts.iters;
  k.run(op, space, n, opts.launch);
}

}  // namespace kdnn::sinkhorn::impl
