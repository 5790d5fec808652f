// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of kdnn::attention::impl::{softmax_forward, softmax_backward}:
// one team thread per query row, its vector lanes over the row's visible keys
// (impl/visible_keys.hpp); the row is read from global memory on each pass.
#include <limits>

#include "kdnn/attention/impl/visible_keys.hpp"
#include "kdnn/attention/softmax.hpp"
#include "kdnn/core/compat.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/validate.hpp"

namespace kdnn::attention::impl {

template <class T>
void validate_softmax_options(const char* op, const SoftmaxOptions& opts) {
  if (opts.mode != SoftmaxMode::accurate && opts.mode != SoftmaxMode::log) {
    fail(op, ": mode=", int(opts.mode), ", expected SoftmaxMode::accurate or SoftmaxMode::log");
  }
  validate::finite_as<T>(op, "scale", opts.scale);
}

/// Runs row(team, r, first, last) for every query row r of scores
/// [B, H, S, Sk] (row r's keys are r·Sk .. r·Sk + Sk − 1, the visible ones
/// [first, last)): one row per team thread, its vector lanes over the keys; on
/// a GPU a warp's worth of lanes (fewer for short rows), 128 threads a team.
template <class ExecSpace, class Row>
void for_each_row(const char* name, const ExecSpace& space, int B, int H, int S, int Sk,
                  const VisibleKeys<ExecSpace>& visible, const Row& row) {
  const std::size_t rows = std::size_t(B) * H * S;
  if (rows == 0 || Sk == 0) return;
  const int warp = kdnn::impl::BackendTraits<ExecSpace>::warp_width();
  int lanes = 1;
  while (lanes < warp && lanes < Sk) lanes *= 2;
  const int threads = warp > 1 ? 128 / lanes : 1;
  const int league = int((rows + threads - 1) / threads);
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Kokkos::parallel_for(
      name, Kokkos::TeamPolicy<ExecSpace>(space, league, threads, lanes),
      KOKKOS_LAMBDA(const Member& team) {
        const std::size_t r = std::size_t(team.league_rank()) * threads + team.team_rank();
        if (r >= rows) return;
        int first, last;
        visible.range(int(r / (std::size_t(H) * S)), int(r % S), first, last);
        row(team, r, first, last);
      });
}

template <class ExecSpace, class T>
void softmax_forward(const ExecSpace& space, const Tensor4<const T, ExecSpace>& x,
                     const Tensor4<T, ExecSpace>& y, const SoftmaxOptions& opts,
                     const AttentionMask<ExecSpace>& mask, MaskCheck mask_check) {
  constexpr const char* op = "attention::softmax_forward";
  validate_softmax_options<T>(op, opts);
  validate::same_shape(op, "y", y, "x", x);
  validate::disjoint(op, {validate::memory_of("y", y)}, {validate::memory_of("x", x)});
  const int B = int(x.extent(0)), H = int(x.extent(1)), S = int(x.extent(2)), Sk = int(x.extent(3));
  if (mask_check == MaskCheck::here) check_mask(op, mask, B, S, Sk);
  const T s = T(opts.scale);
  const bool log_mode = opts.mode == SoftmaxMode::log;
  const T masked = log_mode ? -std::numeric_limits<T>::infinity() : T(0);
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  for_each_row(
      "kdnn::attention::softmax_forward", space, B, H, S, Sk, VisibleKeys<ExecSpace>(mask, S, Sk),
      KOKKOS_LAMBDA(const Member& team, std::size_t r, int first, int last) {
        const T* xr = x.data() + r * Sk;
        T* yr = y.data() + r * Sk;
        const auto all = Kokkos::ThreadVectorRange(team, Sk);
        if (first >= last) {
          Kokkos::parallel_for(all, [&](int j) { yr[j] = masked; });
          return;
        }
        const auto keys = Kokkos::ThreadVectorRange(team, first, last);
        // The exponents are s·(x − xm), xm the score that s·x is largest at
        // (the largest x for s ≥ 0, the smallest for s < 0, found as the
        // largest sign(s)·x; the sign flips are exact): never above 0,
        // exactly 0 at xm, and one rounding after an exact-or-once-rounded
        // difference. The form s·x − max(s·x) would let a compiler that
        // contracts a·b − c into one FMA (CUDA's, a host's with FMA)
        // leave the rounding error of s·xm in place of that 0, which a huge
        // scale turns into P ≠ 1 on a one-hot row.
        const T sign = s >= T(0) ? T(1) : T(-1);
        T signed_max = 0;
        Kokkos::parallel_reduce(
            keys, [&](int j, T& v) { v = sign * xr[j] > v ? sign * xr[j] : v; },
            Kokkos::Max<T>(signed_max));
        const T xm = sign * signed_max;
        T sum = 0;
        Kokkos::parallel_reduce(
            keys, [&](int j, T& v) { v += compat::exp(s * (xr[j] - xm)); }, sum);
        if (log_mode) {
          const T log_sum = compat::log(sum);
          Kokkos::parallel_for(all, [&](int j) {
            yr[j] = j >= first && j < last ? s * (xr[j] - xm) - log_sum : masked;
          });
        } else {
          const T inv = T(1) / sum;
          Kokkos::parallel_for(all, [&](int j) {
            yr[j] = j >= first && j < last ? compat::exp(s * (xr[j] - xm)) * inv : masked;
          });
        }
      });
}

template <class ExecSpace, class T>
void softmax_backward(const ExecSpace& space, const Tensor4<const T, ExecSpace>& y,
                      const Tensor4<const T, ExecSpace>& dy, const Tensor4<T, ExecSpace>& dx,
                      const SoftmaxOptions& opts, const AttentionMask<ExecSpace>& mask,
                      MaskCheck mask_check) {
  constexpr const char* op = "attention::softmax_backward";
  validate_softmax_options<T>(op, opts);
  validate::same_shape(op, "dy", dy, "y", y);
  validate::same_shape(op, "dx", dx, "y", y);
  validate::disjoint(op, {validate::memory_of("dx", dx)},
                     {validate::memory_of("y", y), validate::memory_of("dy", dy)});
  const int B = int(y.extent(0)), H = int(y.extent(1)), S = int(y.extent(2)), Sk = int(y.extent(3));
  if (mask_check == MaskCheck::here) check_mask(op, mask, B, S, Sk);
  const T s = T(opts.scale);
  const bool log_mode = opts.mode == SoftmaxMode::log;
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  for_each_row(
      "kdnn::attention::softmax_backward", space, B, H, S, Sk, VisibleKeys<ExecSpace>(mask, S, Sk),
      KOKKOS_LAMBDA(const Member& team, std::size_t r, int first, int last) {
        const T* yr = y.data() + r * Sk;
        const T* gr = dy.data() + r * Sk;
        T* dr = dx.data() + r * Sk;
        const auto all = Kokkos::ThreadVectorRange(team, Sk);
        if (first >= last) {
          Kokkos::parallel_for(all, [&](int j) { dr[j] = T(0); });
          return;
        }
        const auto keys = Kokkos::ThreadVectorRange(team, first, last);
        // accurate: Σ y∘dy; log: Σ dy (both over the visible keys).
        T dot = 0;
        Kokkos::parallel_reduce(
            keys, [&](int j, T& v) { v += log_mode ? gr[j] : yr[j] * gr[j]; }, dot);
        Kokkos::parallel_for(all, [&](int j) {
          const bool seen = j >= first && j < last;
          dr[j] = !seen      ? T(0)
                  : log_mode ? s * (gr[j] - compat::exp(yr[j]) * dot)
                             : s * yr[j] * (gr[j] - dot);
        });
      });
}

}  // namespace kdnn::attention::impl
