// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The fused attention's argument checks (fused_attention_impl.hpp runs
// them): the options, the tensors' shapes, strides and overlaps, the sizes
// the kernels can index, the scores' range; and the block sizes of the host
// form, which the size checks and the runs share.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/impl/fused_attention_forms.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/finite_values.hpp"
#include "kdnn/core/impl/largest_magnitude.hpp"
#include "kdnn/core/validate.hpp"

namespace kdnn::attention::impl {

/// Queries per team (bq) and keys per tile (bk). On a host, one thread per
/// team: 128 when the sequence is longer than 64 and D, Dv ≤ 64 (the
/// backward's per-head working set, ten tiles, then fills about 416 KiB,
/// inside a core's L2, and the K/V tile copies and per-tile steps are spread
/// over twice the queries: measured 7% faster at S = 2048, D = 64), else 64.
/// On a GPU, warp-sized blocks, halved past D = 128 so that the team's
/// scratch stays small.
template <class ExecSpace>
void fused_block_sizes(int S, int Sk, int D, int Dv, int& bq, int& bk) {
  if (kdnn::impl::BackendTraits<ExecSpace>::is_host) {
    const bool narrow = D <= 64 && Dv <= 64;
    bq = narrow && S > 64 ? 128 : 64;
    bk = narrow && Sk > 64 ? 128 : 64;
  } else {
    bq = bk = (D > 128 || Dv > 128) ? 16 : 32;
  }
}

/// Refuses a head size D (q's) or Dv (v's) past every GPU and tensor-core
/// form (largest_gpu_head_size) where such a form would have to run it: on
/// a GPU backend, whatever the launch asks, and wherever the launch pins
/// KernelForm::gpu or tensor_cores. Only the host form could take it, a
/// form written for CPU caches that a GPU runs slowly: an error naming the
/// largest, rather than that. On a host backend the host form takes any
/// size.
template <class ExecSpace, class T>
void check_gpu_head_sizes(const char* op, const Launch& launch, std::size_t D, std::size_t Dv) {
  const bool gpu = kdnn::impl::BackendTraits<ExecSpace>::is_gpu || launch.form == KernelForm::gpu ||
                   launch.form == KernelForm::tensor_cores;
  if (!gpu) return;
  const auto check = [&](const char* name, std::size_t size, int largest) {
    if (size > std::size_t(largest)) {
      fail(op, ": ", name, "=", size, ", expected at most ", largest,
           ", the largest head size of the GPU and tensor-core forms, which a GPU backend and "
           "launch.form gpu or tensor_cores run (the host form on a host backend takes any)");
    }
  };
  check("q's head size D", D, largest_gpu_head_size<ExecSpace, T>(0));
  check("v's head size Dv", Dv, largest_gpu_head_size<ExecSpace, T>(1));
}

/// The kernels index with int: every extent, and the teams of each launch
/// (B·H·⌈S/bq⌉ query blocks, B·H·⌈Sk/bk⌉ key blocks), counted in 64 bits,
/// must stay below 2^31.
template <class ExecSpace, class T>
void check_fused_sizes(const char* op, const ExecSpace& space, const FusedAttentionOptions& opts,
                       std::size_t B, std::size_t H, std::size_t S, std::size_t Sk, std::size_t D,
                       std::size_t Dv) {
  const std::size_t limit = std::size_t(std::numeric_limits<int>::max());
  const auto shape = [&] {
    return "B=" + std::to_string(B) + ", H=" + std::to_string(H) + ", S=" + std::to_string(S) +
           ", Sk=" + std::to_string(Sk) + ", D=" + std::to_string(D) + ", Dv=" + std::to_string(Dv);
  };
  for (const std::size_t extent : {B, H, S, Sk, D, Dv}) {
    if (extent > limit) fail(op, ": ", shape(), ", expected every extent below 2^31");
  }
  check_gpu_head_sizes<ExecSpace, T>(op, opts.launch, D, Dv);
  // The smallest blocks of queries (bq) and keys (bk) of the kernels the
  // forward and the backward run.
  int bq = std::numeric_limits<int>::max(), bk = bq;
  const auto take = [&](auto... kernel) {
    const auto one = [&](auto k) {
      using K = typename decltype(k)::type;
      if constexpr (!std::is_void_v<K>)
        bq = std::min(bq, int(K::BQ)), bk = std::min(bk, int(K::BK));
    };
    (one(kernel), ...);
  };
  const std::array<int, 2> heads_sizes{int(D), int(Dv)};
  const bool forward_team = FusedForwardForms<ExecSpace, T>::visit(
      space, opts.launch, heads_sizes, [&](auto kernel, const char*) { take(kernel); });
  const bool backward_teams = FusedBackwardForms<ExecSpace, T>::visit(
      space, opts.launch, heads_sizes, [&](auto kv, auto q, const char*) { take(kv, q); });
  if (!forward_team || !backward_teams) {  // a host form
    int host_bq = 1, host_bk = 1;
    fused_block_sizes<ExecSpace>(int(S), int(Sk), int(D), int(Dv), host_bq, host_bk);
    bq = std::min(bq, host_bq), bk = std::min(bk, host_bk);
  }
  const std::size_t heads = B * H;  // < 2^62
  const std::size_t teams = heads * std::max((S + bq - 1) / bq, (Sk + bk - 1) / bk);
  if (heads > limit || teams > limit) {
    fail(op, ": ", shape(), " needs ", teams, " teams of ", bq, " queries or ", bk,
         " keys, expected at most 2^31 - 1 (B·H·blocks)");
  }
}

/// With opts.check_scores, refuses finite q and k that could take a score
/// past T's range: |scale·q_i·k_j| <= |scale|·D·max|q|·max|k| over their
/// finite values, compared in logarithms (which cannot overflow) with half
/// of T's largest value, the margin for the rounding of the sums. Values
/// that are not finite are opts.check_finite's (they propagate otherwise).
template <class ExecSpace, class T>
void check_score_range(const char* op, const ExecSpace& space, const FusedAttentionOptions& opts,
                       const StridedTensor4<const T, ExecSpace>& q,
                       const StridedTensor4<const T, ExecSpace>& k) {
  if (!opts.check_scores) return;
  const double max_q = kdnn::impl::largest_finite_magnitude(space, q);
  const double max_k = kdnn::impl::largest_finite_magnitude(space, k);
  const double D = double(q.extent(3)), scale = std::abs(opts.scale);
  if (D == 0 || max_q == 0 || max_k == 0 || scale == 0) return;
  const double log_bound = std::log(scale) + std::log(D) + std::log(max_q) + std::log(max_k);
  const double limit = double(std::numeric_limits<T>::max()) / 2;
  if (log_bound > std::log(limit)) {
    fail(op, ": opts.scale=", opts.scale, " with max|q|=", max_q, ", max|k|=", max_k, " and D=", D,
         " could take a score past ", limit, " (|scale|·D·max|q|·max|k| = ", std::exp(log_bound),
         "), expected scores within ", sizeof(T) == sizeof(float) ? "float" : "double",
         "'s range (check_scores)");
  }
}

/// Checks the options and that q, k, v, the [B, H, S, Dv] and [B, H, S]
/// tensors named o_name and lse_name, and the sinks [H] (where given) agree.
template <class ExecSpace, class T>
void validate_fused(const char* op, const ExecSpace& space, const FusedAttentionOptions& opts,
                    const StridedTensor4<const T, ExecSpace>& q,
                    const StridedTensor4<const T, ExecSpace>& k,
                    const StridedTensor4<const T, ExecSpace>& v, const char* o_name,
                    const StridedTensor4<const T, ExecSpace>& o, const char* lse_name,
                    const Tensor3<const T, ExecSpace>& lse,
                    const Vector<const T, ExecSpace>& sinks) {
  if (validate::given(sinks))
    validate::extent(op, "sinks", sinks, 0, q.extent(1), "H, q's extent(1)");
  validate::finite_as<T>(op, "opts.scale", opts.scale);
  validate::finite_as<T>(op, "opts.softcap", opts.softcap);
  if (!(opts.softcap >= 0 &&
        (opts.softcap == 0 || 1 / opts.softcap <= double(std::numeric_limits<T>::max())))) {
    fail(op, ": opts.softcap=", opts.softcap, ", expected 0 (none) or a value > 0 whose inverse ",
         "is finite in ", sizeof(T) == sizeof(float) ? "float" : "double");
  }
  validate::in_half_open(op, "opts.dropout.p", opts.dropout.p, 0.0, 1.0);
  const int schedule = int(opts.backward);
  if (schedule < int(FusedBackwardSchedule::automatic) ||
      schedule > int(FusedBackwardSchedule::per_key_block)) {
    fail(op, ": opts.backward=", schedule,
         ", expected FusedBackwardSchedule::automatic, per_head or per_key_block (0, 1 or 2)");
  }
  for (int d = 0; d < 2; ++d) {
    const char* what = d == 0 ? "q's batch" : "q's heads";
    validate::extent(op, o_name, o, d, q.extent(d), what);
    validate::extent(op, lse_name, lse, d, q.extent(d), what);
  }
  validate::extent(op, "k", k, 0, q.extent(0), "q's batch");
  validate::extent(op, "v", v, 0, q.extent(0), "q's batch");
  // Grouped-query attention: Hkv key/value heads, each read by H / Hkv
  // consecutive query heads.
  const std::size_t H = q.extent(1), Hkv = k.extent(1);
  if (Hkv == 0 ? H != 0 : H % Hkv != 0) {
    fail(op, ": k has extent(1)=", Hkv, ", expected a number of key/value heads that divides H=", H,
         " (q's extent(1))");
  }
  validate::extent(op, "v", v, 1, Hkv, "Hkv, k's extent(1)");
  validate::extent(op, "k", k, 3, q.extent(3), "D, q's extent(3)");
  validate::extent(op, "v", v, 2, k.extent(2), "Sk, k's extent(2)");
  validate::extent(op, o_name, o, 2, q.extent(2), "S, q's extent(2)");
  validate::extent(op, o_name, o, 3, v.extent(3), "Dv, v's extent(3)");
  validate::extent(op, lse_name, lse, 2, q.extent(2), "S, q's extent(2)");
  validate::unit_last_stride(op, "q", q);
  validate::unit_last_stride(op, "k", k);
  validate::unit_last_stride(op, "v", v);
  validate::unit_last_stride(op, o_name, o);
  check_fused_sizes<ExecSpace, T>(op, space, opts, q.extent(0), q.extent(1), q.extent(2),
                                  k.extent(2), q.extent(3), v.extent(3));
  if (opts.check_finite) {
    kdnn::impl::check_finite(op, space, "q", q);
    kdnn::impl::check_finite(op, space, "k", k);
    kdnn::impl::check_finite(op, space, "v", v);
  }
  check_score_range<ExecSpace, T>(op, space, opts, q, k);
}

/// Checks the backward's tensors and options (not the mask).
template <class ExecSpace, class T>
void check_fused_backward(const char* op, const ExecSpace& space,
                          const FusedAttentionBackward<T, ExecSpace>& a,
                          const FusedAttentionOptions& opts) {
  const auto &q = a.q, &k = a.k, &v = a.v, &o = a.o, &dout = a.dout;
  const auto &dq = a.dq, &dk = a.dk, &dv = a.dv;
  validate_fused<ExecSpace, T>(op, space, opts, q, k, v, "o", o, "lse", a.lse, a.sinks);
  if (validate::given(a.dsinks)) {
    if (!validate::given(a.sinks))
      fail(op, ": dsinks given but sinks not (no sinks to differentiate)");
    validate::same_shape(op, "dsinks", a.dsinks, "sinks", a.sinks);
  }
  validate::same_shape(op, "dout", dout, "o", o);
  // o from the forward of finite inputs is finite; lse is -inf for a query
  // that sees no key, by design: only the incoming gradient is new here.
  if (opts.check_finite) kdnn::impl::check_finite(op, space, "dout", dout);
  validate::same_shape(op, "dq", dq, "q", q);
  validate::same_shape(op, "dk", dk, "k", k);
  validate::same_shape(op, "dv", dv, "v", v);
  validate::unit_last_stride(op, "dout", dout);
  validate::unit_last_stride(op, "dq", dq);
  validate::unit_last_stride(op, "dk", dk);
  validate::unit_last_stride(op, "dv", dv);
  validate::distinct_elements(op, "dq", dq);
  validate::distinct_elements(op, "dk", dk);
  validate::distinct_elements(op, "dv", dv);
  using validate::memory_of;
  if (validate::given(a.delta)) validate::same_shape(op, "delta", a.delta, "lse", a.lse);
  const int group = k.extent(1) > 0 ? int(q.extent(1) / k.extent(1)) : 1;
  const auto check_shares = [&](const char* name, const Tensor4<T, ExecSpace>& shares,
                                const StridedTensor4<T, ExecSpace>& grad) {
    if (group == 1 || !validate::given(shares)) return;
    validate::extent(op, name, shares, 0, q.extent(0), "B");
    validate::extent(op, name, shares, 1, q.extent(1), "H, q's extent(1)");
    validate::extent(op, name, shares, 2, grad.extent(2), "Sk");
    validate::extent(op, name, shares, 3, grad.extent(3), "the head size");
  };
  check_shares("dk_shares", a.dk_shares, dk);
  check_shares("dv_shares", a.dv_shares, dv);
  validate::disjoint(
      op,
      {memory_of("dq", dq), memory_of("dk", dk), memory_of("dv", dv), memory_of("delta", a.delta),
       memory_of("dk_shares", a.dk_shares), memory_of("dv_shares", a.dv_shares),
       memory_of("dsinks", a.dsinks)},
      {memory_of("q", q), memory_of("k", k), memory_of("v", v), memory_of("o", o),
       memory_of("lse", a.lse), memory_of("dout", dout), memory_of("sinks", a.sinks)});
}

}  // namespace kdnn::attention::impl
