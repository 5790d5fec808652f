// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of kdnn::ssm::impl::{dt_softplus_forward, dt_softplus_backward}.
#include <climits>

#include "kdnn/core/compat.hpp"
#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/block_sums.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/ssm/dt_softplus.hpp"

namespace kdnn::ssm::impl {

/// softplus(u) with PyTorch's threshold: u itself above 20.
template <class T>
KOKKOS_INLINE_FUNCTION T softplus(T u) {
  return u > T(20) ? u : T(compat::log1p(compat::exp(u)));
}

/// Clamp bounds in T; ±∞ stays ±∞.
template <class T>
struct DtClamp {
  T lo, hi;
  explicit DtClamp(const DtSoftplusOptions& o) : lo(T(o.dt_min)), hi(T(o.dt_max)) {}
};

inline void check_dt_options(const char* op, const DtSoftplusOptions& o) {
  if (o.dt_min != o.dt_min || o.dt_max != o.dt_max || !(o.dt_min <= o.dt_max)) {
    fail(op, ": opts.dt_min=", o.dt_min, ", opts.dt_max=", o.dt_max,
         ", expected dt_min <= dt_max (no NaN)");
  }
}

template <class ExecSpace, class T>
void check_dt(const char* op, const Tensor3<const T, ExecSpace>& dt,
              const Vector<const T, ExecSpace>& dt_bias, const DtSoftplusOptions& o) {
  check_dt_options(op, o);
  validate::extent(op, "dt_bias", dt_bias, 0, dt.extent(2), "H, dt's extent(2)");
  if (dt.size() > std::size_t(INT_MAX)) {
    fail(op, ": dt has ", dt.size(), " elements, expected fewer than 2^31");
  }
}

/// Every host-side check of dt_softplus_forward (`op` names the caller).
template <class ExecSpace, class T>
void check_dt_forward(const char* op, const Tensor3<const T, ExecSpace>& dt,
                      const Vector<const T, ExecSpace>& dt_bias,
                      const Tensor3<T, ExecSpace>& dt_out, const DtSoftplusOptions& opts) {
  check_dt<ExecSpace, T>(op, dt, dt_bias, opts);
  validate::same_shape(op, "dt_out", dt_out, "dt", dt);
  validate::disjoint(op, {validate::memory_of("dt_out", dt_out)},
                     {validate::memory_of("dt", dt), validate::memory_of("dt_bias", dt_bias)});
}

/// Every host-side check of dt_softplus_backward.
template <class ExecSpace, class T>
void check_dt_backward(const char* op, const Tensor3<const T, ExecSpace>& dt,
                       const Vector<const T, ExecSpace>& dt_bias,
                       const Tensor3<const T, ExecSpace>& ddt_out, const Tensor3<T, ExecSpace>& ddt,
                       const Vector<T, ExecSpace>& ddt_bias, const DtSoftplusOptions& opts) {
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
                         const Vector<const T, ExecSpace>& dt_bias,
                         const Tensor3<T, ExecSpace>& dt_out, const DtSoftplusOptions& opts) {
  check_dt_forward<ExecSpace, T>("ssm::dt_softplus_forward", dt, dt_bias, dt_out, opts);
  const int H = int(dt.extent(2)), n = int(dt.size());
  const DtClamp<T> clamp(opts);
  const T* in = dt.data();
  T* out = dt_out.data();
  Kokkos::parallel_for(
      "kdnn::ssm::dt_softplus_forward", Kokkos::RangePolicy<ExecSpace>(space, 0, n),
      KOKKOS_LAMBDA(int i) {
        const T sp = softplus(T(in[i] + dt_bias(i % H)));
        out[i] = sp < clamp.lo ? clamp.lo : sp > clamp.hi ? clamp.hi : sp;
      });
}

/// Rows of [B·L, H] per team of the backward (one partial sum of ddt_bias each).
constexpr int kDtRowsPerBlock = 256;

template <class ExecSpace, class T>
void dt_softplus_backward(const ExecSpace& space, const Tensor3<const T, ExecSpace>& dt,
                          const Vector<const T, ExecSpace>& dt_bias,
                          const Tensor3<const T, ExecSpace>& ddt_out,
                          const Tensor3<T, ExecSpace>& ddt, const Vector<T, ExecSpace>& ddt_bias,
                          const DtSoftplusOptions& opts) {
  check_dt_backward<ExecSpace, T>("ssm::dt_softplus_backward", dt, dt_bias, ddt_out, ddt, ddt_bias,
                                  opts);
  const int H = int(dt.extent(2)), rows = int(dt.extent(0) * dt.extent(1));
  const int blocks = (rows + kDtRowsPerBlock - 1) / kDtRowsPerBlock;
  if (H == 0) return;
  if (blocks == 0) {
    Kokkos::deep_copy(space, ddt_bias, T(0));
    return;
  }
  const DtClamp<T> clamp(opts);
  const T *in = dt.data(), *g = ddt_out.data();
  T* out = ddt.data();
  Matrix<double, ExecSpace> partial(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kdnn::ssm::dt_partial_sums"), blocks, H);
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  using Member = typename Policy::member_type;
  // One team per block of rows: threads over the heads, vector lanes over the
  // block's rows (their sum, in double, in the lanes' fixed reduction order).
  Kokkos::parallel_for(
      "kdnn::ssm::dt_softplus_backward", Policy(space, blocks, Kokkos::AUTO),
      KOKKOS_LAMBDA(const Member& team) {
        const int r0 = team.league_rank() * kDtRowsPerBlock;
        const int nr = rows - r0 < kDtRowsPerBlock ? rows - r0 : kDtRowsPerBlock;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, H), [&](int h) {
          double sum = 0;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(team, nr),
              [&](int r, double& acc) {
                const int i = (r0 + r) * H + h;
                const T u = in[i] + dt_bias(h);
                const T sp = softplus(u);
                const bool pass = sp >= clamp.lo && sp <= clamp.hi;
                // d softplus/du = σ(u) below the threshold, 1 above it.
                const T slope = u > T(20) ? T(1) : T(1) / (T(1) + compat::exp(-u));
                const T d = pass ? g[i] * slope : T(0);
                out[i] = d;
                acc += double(d);
              },
              sum);
          Kokkos::single(Kokkos::PerThread(team), [&] { partial(team.league_rank(), h) = sum; });
        });
      });
  kdnn::impl::sum_blocks(
      space, "kdnn::ssm::dt_bias_sums", partial,
      KOKKOS_LAMBDA(int h, double v) { ddt_bias(h) = T(v); });
}

}  // namespace kdnn::ssm::impl
