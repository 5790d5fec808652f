// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Mamba-2's step-size transform and its gradient, the kernels behind
// dt_softplus (dt_softplus.hpp) and the SSD's own dt_bias/dt_softplus/
// dt_limit (ssd.hpp):
//
//   dt_out[b,t,h] = clamp(f(dt[b,t,h] + bias[h]), lo, hi),  f = softplus or the identity
//
// softplus(u) = log(1 + e^u), and u itself above 20 (PyTorch's threshold).
// The gradient passes where lo ≤ f(u) ≤ hi (torch.clamp's rule), times
// f'(u) = σ(u) below the threshold, 1 above it (or 1 for the identity). The
// bias gradient is Σ over batch and steps, per block of rows and then over
// the blocks in a fixed order (deterministic). dt (and its gradient) may be
// stored in a 16-bit type: the transform computes in C, the type of the
// bias, the output and the incoming gradient (float for the 16-bit types, as
// mamba keeps them). The kernels check nothing: the callers check their
// arguments first (check_dt_limits for the bounds).
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/compat.hpp"
#include "kdnn/core/error.hpp"
#include "kdnn/core/float16.hpp"
#include "kdnn/core/impl/block_sums.hpp"
#include "kdnn/core/tensor.hpp"

namespace kdnn::ssm::impl {

/// softplus(u) with PyTorch's threshold: u itself above 20.
template <class T>
KOKKOS_INLINE_FUNCTION T softplus(T u) {
  return u > T(20) ? u : T(compat::log1p(compat::exp(u)));
}

/// Refuses NaN bounds and dt_min > dt_max.
inline void check_dt_limits(const char* op, double dt_min, double dt_max) {
  if (dt_min != dt_min || dt_max != dt_max || !(dt_min <= dt_max)) {
    fail(op, ": opts.dt_min=", dt_min, ", opts.dt_max=", dt_max,
         ", expected dt_min <= dt_max (no NaN)");
  }
}

/// f, then the clamp to [lo, hi] (±∞ bounds stay ±∞).
template <class T>
struct DtTransform {
  bool use_softplus = true;
  T lo = T(0), hi = T(0);

  DtTransform(bool sp, double dt_min, double dt_max)
      : use_softplus(sp), lo(T(dt_min)), hi(T(dt_max)) {}

  KOKKOS_INLINE_FUNCTION T unclamped(T u) const { return use_softplus ? softplus(u) : u; }
  KOKKOS_INLINE_FUNCTION T operator()(T u) const {
    const T f = unclamped(u);
    return f < lo ? lo : f > hi ? hi : f;
  }
  /// g · d dt_out / du: exactly 0 where the clamp holds f(u) at a bound.
  KOKKOS_INLINE_FUNCTION T gradient(T u, T g) const {
    const T f = unclamped(u);
    if (!(f >= lo && f <= hi)) return T(0);
    return use_softplus && u <= T(20) ? g * (T(1) / (T(1) + compat::exp(-u))) : g;
  }
};

/// out = transform(dt + bias) over dt [B, L, H] (bias [H] or empty: 0);
/// out may be dt's own memory (In = C).
template <class ExecSpace, class In, class C>
void transform_dt(const ExecSpace& space, const Tensor3<const In, ExecSpace>& dt,
                  const Vector<const C, ExecSpace>& bias, C* out, const DtTransform<C>& f) {
  const std::size_t H = dt.extent(2), n = dt.size();
  const bool has_bias = bias.extent(0) > 0;
  const In* in = dt.data();
  Kokkos::parallel_for(
      "kdnn::ssm::dt_transform", Kokkos::RangePolicy<ExecSpace>(space, 0, n),
      KOKKOS_LAMBDA(std::size_t i) {
        out[i] = f(to_compute(in[i]) + (has_bias ? bias(i % H) : C(0)));
      });
}

/// Rows of [B·L, H] per team of the backward (one partial sum of dbias each).
constexpr int kDtRowsPerBlock = 256;

/// ddt = g · transform'(dt + bias), elementwise (g and ddt may be the same
/// memory when In = C), and, when dbias is given, dbias[h] = Σ_{b,t} ddt[b,t,h]
/// (of the values in C, before ddt's rounding to In).
template <class ExecSpace, class In, class C>
void transform_dt_backward(const ExecSpace& space, const Tensor3<const In, ExecSpace>& dt,
                           const Vector<const C, ExecSpace>& bias, const C* g, In* ddt,
                           const Vector<C, ExecSpace>& dbias, const DtTransform<C>& f) {
  const int H = int(dt.extent(2)), rows = int(dt.extent(0) * dt.extent(1));
  const int blocks = (rows + kDtRowsPerBlock - 1) / kDtRowsPerBlock;
  if (H == 0) return;
  const bool has_dbias = dbias.extent(0) > 0;
  if (blocks == 0) {
    if (has_dbias) Kokkos::deep_copy(space, dbias, C(0));
    return;
  }
  const bool has_bias = bias.extent(0) > 0;
  const In* in = dt.data();
  Matrix<double, ExecSpace> partial(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kdnn::ssm::dt_partial_sums"),
      has_dbias ? blocks : 0, H);
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  using Member = typename Policy::member_type;
  // One team per block of rows: threads over the heads, vector lanes over the
  // block's rows (their sum, in double, in the lanes' fixed reduction order).
  Kokkos::parallel_for(
      "kdnn::ssm::dt_transform_backward", Policy(space, blocks, Kokkos::AUTO),
      KOKKOS_LAMBDA(const Member& team) {
        const int r0 = team.league_rank() * kDtRowsPerBlock;
        const int nr = rows - r0 < kDtRowsPerBlock ? rows - r0 : kDtRowsPerBlock;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, H), [&](int h) {
          double sum = 0;
          const C b = has_bias ? bias(h) : C(0);
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(team, nr),
              [&](int r, double& acc) {
                const std::size_t i = std::size_t(r0 + r) * H + h;
                const C d = f.gradient(to_compute(in[i]) + b, g[i]);
                ddt[i] = from_compute<In>(d);
                acc += double(d);
              },
              sum);
          if (has_dbias) {
            Kokkos::single(Kokkos::PerThread(team), [&] { partial(team.league_rank(), h) = sum; });
          }
        });
      });
  if (!has_dbias) return;
  kdnn::impl::sum_blocks(
      space, "kdnn::ssm::dt_bias_sums", partial,
      KOKKOS_LAMBDA(int h, double v) { dbias(h) = C(v); });
}

}  // namespace kdnn::ssm::impl
