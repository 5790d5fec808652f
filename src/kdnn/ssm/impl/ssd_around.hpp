// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What mamba's mamba_chunk_scan_combined fuses around the scan, for the SSD
// forward and backward of one rank and of kdnn::cp alike: the step-size
// transform before it (dt_transform.hpp) and the gate after it,
//
//   y = u·SiLU(z),  SiLU(z) = z·σ(z),  u the scan's output (y_ungated),
//   du = dy·SiLU(z),  dz = dy·u·σ(z)·(1 + z·(1 − σ(z))).
//
// around_forward / around_backward take the caller's arguments (checked)
// and the step sizes (step_sizes: a context-parallel caller computes them
// where a failed check_dt reaches every rank), and run the scan (`scan`,
// and `scan_forward` for the backward's recomputation of u when the
// forward did not keep it) on arguments with those step sizes and without
// dt_bias and z, in scratch where needed.
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <string>

#include "kdnn/core/validate.hpp"
#include "kdnn/ssm/impl/dt_transform.hpp"
#include "kdnn/ssm/impl/sigmoid.hpp"
#include "kdnn/ssm/impl/ssd_checks.hpp"
#include "kdnn/ssm/ssd.hpp"

namespace kdnn::ssm::impl {

/// y = u·SiLU(z) elementwise (y may be u's memory).
template <class ExecSpace, class T>
void gate_forward(const ExecSpace& space, const T* u, const Tensor4<const T, ExecSpace>& z, T* y) {
  const T* zp = z.data();
  Kokkos::parallel_for(
      "kdnn::ssm::ssd_gate", Kokkos::RangePolicy<ExecSpace>(space, 0, z.size()),
      KOKKOS_LAMBDA(std::size_t i) {
        const T zi = zp[i];
        y[i] = u[i] * (zi * sigmoid(zi));
      });
}

/// du = dy·SiLU(z) and dz = dy·u·SiLU'(z), elementwise.
template <class ExecSpace, class T>
void gate_backward(const ExecSpace& space, const T* u, const Tensor4<const T, ExecSpace>& z,
                   const T* dy, T* du, T* dz) {
  const T* zp = z.data();
  Kokkos::parallel_for(
      "kdnn::ssm::ssd_gate_backward", Kokkos::RangePolicy<ExecSpace>(space, 0, z.size()),
      KOKKOS_LAMBDA(std::size_t i) {
        const T zi = zp[i], s = sigmoid(zi), g = dy[i];
        du[i] = g * (zi * s);
        dz[i] = g * u[i] * (s * (T(1) + zi * (T(1) - s)));
      });
}

/// Uninitialised scratch of x's extents.
template <class T, class ExecSpace, class X>
Tensor4<T, ExecSpace> scratch_like(const char* label, const X& x) {
  return Tensor4<T, ExecSpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
                               x.extent(0), x.extent(1), x.extent(2), x.extent(3));
}

/// The transform the options describe.
template <class T>
DtTransform<T> dt_transform_of(const SsdOptions& opts) {
  return DtTransform<T>(opts.dt_softplus, opts.dt_min, opts.dt_max);
}

/// The step sizes the scan reads: a.dt itself, or its transform in scratch
/// (checked with opts.check_dt, which then applies to it).
template <class ExecSpace, class T, class Args>
Tensor3<const T, ExecSpace> step_sizes(const char* op, const ExecSpace& space, const Args& a,
                                       const SsdOptions& opts) {
  if (!transforms_dt(a, opts)) return a.dt;
  Tensor3<T, ExecSpace> dt(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kdnn::ssm::ssd_dt"),
                           a.dt.extent(0), a.dt.extent(1), a.dt.extent(2));
  transform_dt(space, a.dt, a.dt_bias, dt.data(), dt_transform_of<T>(opts));
  if (opts.check_dt) check_dt_values<ExecSpace, T>(op, space, dt);
  return dt;
}

/// The scan's arguments: a's with dt the step sizes, no dt_bias and no z.
template <class Args, class Dt>
Args scan_arguments(const Args& a, const Dt& dt) {
  Args inner = a;
  inner.dt = dt;
  inner.dt_bias = {};
  inner.z = {};
  inner.y_ungated = {};
  return inner;
}

/// The forward: scan(args) → u (in y_ungated, or in y), then the gate.
template <class ExecSpace, class T, class Scan>
void around_forward(const ExecSpace& space, const SsdForward<T, ExecSpace>& a,
                    const Tensor3<const T, ExecSpace>& dt, const Scan& scan) {
  auto inner = scan_arguments(a, dt);
  const bool gated = validate::given(a.z);
  if (gated && validate::given(a.y_ungated)) inner.y = a.y_ungated;
  scan(inner);
  if (gated) gate_forward(space, inner.y.data(), a.z, a.y.data());
}

/// The backward: the gate's backward (dz, and du, the scan's dy), scan(args)
/// on the step sizes, then the transform's backward (ddt in place,
/// ddt_bias). u is a.y_ungated, or recomputed by scan_forward.
template <class ExecSpace, class T, class ScanForward, class Scan>
void around_backward(const ExecSpace& space, const SsdBackward<T, ExecSpace>& a,
                     const SsdOptions& opts, const Tensor3<const T, ExecSpace>& dt,
                     const ScanForward& scan_forward, const Scan& scan) {
  auto inner = scan_arguments(a, dt);
  inner.ddt_bias = {};
  inner.dz = {};
  if (validate::given(a.z)) {
    Tensor4<const T, ExecSpace> u = a.y_ungated;
    if (!validate::given(u)) {
      SsdForward<T, ExecSpace> f;
      f.x = a.x, f.dt = dt, f.A = a.A, f.B = a.B, f.C = a.C, f.D = a.D;
      f.initial_state = a.initial_state;
      f.seq_idx = a.seq_idx;
      f.y = scratch_like<T, ExecSpace>("kdnn::ssm::ssd_y_ungated", a.x);
      scan_forward(f);
      u = f.y;
    }
    const auto du = scratch_like<T, ExecSpace>("kdnn::ssm::ssd_dy_ungated", a.x);
    gate_backward(space, u.data(), a.z, a.dy.data(), du.data(), a.dz.data());
    inner.dy = du;
  }
  scan(inner);
  if (transforms_dt(a, opts)) {
    transform_dt_backward(space, a.dt, a.dt_bias, a.ddt.data(), a.ddt.data(), a.ddt_bias,
                          dt_transform_of<T>(opts));
  }
}

}  // namespace kdnn::ssm::impl
