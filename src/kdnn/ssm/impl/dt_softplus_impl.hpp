// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of kdnn::ssm::impl::{dt_softplus_forward, dt_softplus_backward}.
#include <climits>

#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/finite_values.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/ssm/dt_softplus.hpp"
#include "kdnn/ssm/impl/dt_transform.hpp"

namespace kdnn::ssm::impl {

template <class ExecSpace, class T>
void check_dt(const char* op, const Tensor3<const T, ExecSpace>& dt,
              const Vector<const compute_t<T>, ExecSpace>& dt_bias, const DtSoftplusOptions& o) {
  check_dt_limits(op, o.dt_min, o.dt_max);
  validate::extent(op, "dt_bias", dt_bias, 0, dt.extent(2), "H, dt's extent(2)");
  if (dt.size() > std::size_t(INT_MAX)) {
    fail(op, ": dt has ", dt.size(), " elements, expected fewer than 2^31");
  }
}

/// opts.check_finite: no NaN or infinity in dt, dt_bias or (the backward's)
/// ddt_out, which may be left empty.
template <class ExecSpace, class T>
void check_dt_finite(const char* op, const ExecSpace& space, const Tensor3<const T, ExecSpace>& dt,
                     const Vector<const compute_t<T>, ExecSpace>& dt_bias,
                     const Tensor3<const compute_t<T>, ExecSpace>& ddt_out,
                     const DtSoftplusOptions& opts) {
  if (!opts.check_finite) return;
  kdnn::impl::check_finite(op, space, "dt", dt);
  kdnn::impl::check_finite(op, space, "dt_bias", dt_bias);
  kdnn::impl::check_finite(op, space, "ddt_out", ddt_out);
}

/// Every host-side check of dt_softplus_forward (`op` names the caller).
template <class ExecSpace, class T>
void check_dt_forward(const char* op, const Tensor3<const T, ExecSpace>& dt,
                      const Vector<const compute_t<T>, ExecSpace>& dt_bias,
                      const Tensor3<compute_t<T>, ExecSpace>& dt_out,
                      const DtSoftplusOptions& opts) {
  check_dt<ExecSpace, T>(op, dt, dt_bias, opts);
  validate::same_shape(op, "dt_out", dt_out, "dt", dt);
  validate::disjoint(op, {validate::memory_of("dt_out", dt_out)},
                     {validate::memory_of("dt", dt), validate::memory_of("dt_bias", dt_bias)});
}

/// Every host-side check of dt_softplus_backward.
template <class ExecSpace, class T>
void check_dt_backward(const char* op, const Tensor3<const T, ExecSpace>& dt,
                       const Vector<const compute_t<T>, ExecSpace>& dt_bias,
                       const Tensor3<const compute_t<T>, ExecSpace>& ddt_out,
                       const Tensor3<T, ExecSpace>& ddt,
                       const Vector<compute_t<T>, ExecSpace>& ddt_bias,
                       const DtSoftplusOptions& opts) {
  check_dt<ExecSpace, T>(op, dt, dt_bias, opts);
  validate::same_shape(op, "ddt_out", ddt_out, "dt", dt);
  validate::same_shape(op, "ddt", ddt, "dt", dt);
  validate::extent(op, "ddt_bias", ddt_bias, 0, dt.extent(2), "H, dt's extent(2)");
  using validate::memory_of;
  validate::disjoint(
      op, {memory_of("ddt", ddt), memory_of("ddt_bias", ddt_bias)},
      {memory_of("dt", dt), memory_of("dt_bias", dt_bias), memory_of("ddt_out", ddt_out)});
}

template <class ExecSpace, class T>
void dt_softplus_forward(const ExecSpace& space, const Tensor3<const T, ExecSpace>& dt,
                         const Vector<const compute_t<T>, ExecSpace>& dt_bias,
                         const Tensor3<compute_t<T>, ExecSpace>& dt_out,
                         const DtSoftplusOptions& opts) {
  check_dt_forward<ExecSpace, T>("ssm::dt_softplus_forward", dt, dt_bias, dt_out, opts);
  check_dt_finite<ExecSpace, T>("ssm::dt_softplus_forward", space, dt, dt_bias, {}, opts);
  transform_dt(space, dt, dt_bias, dt_out.data(),
               DtTransform<compute_t<T>>(true, opts.dt_min, opts.dt_max));
}

template <class ExecSpace, class T>
void dt_softplus_backward(const ExecSpace& space, const Tensor3<const T, ExecSpace>& dt,
                          const Vector<const compute_t<T>, ExecSpace>& dt_bias,
                          const Tensor3<const compute_t<T>, ExecSpace>& ddt_out,
                          const Tensor3<T, ExecSpace>& ddt,
                          const Vector<compute_t<T>, ExecSpace>& ddt_bias,
                          const DtSoftplusOptions& opts) {
  check_dt_backward<ExecSpace, T>("ssm::dt_softplus_backward", dt, dt_bias, ddt_out, ddt, ddt_bias,
                                  opts);
  check_dt_finite<ExecSpace, T>("ssm::dt_softplus_backward", space, dt, dt_bias, ddt_out, opts);
  transform_dt_backward(space, dt, dt_bias, ddt_out.data(), ddt.data(), ddt_bias,
                        DtTransform<compute_t<T>>(true, opts.dt_min, opts.dt_max));
}

}  // namespace kdnn::ssm::impl
