// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of kdnn::attention::impl::fused_attention_forward and
// _backward: the checks (fused_attention_checks.hpp), the launch plans, and
// the runs of the forms the table (fused_attention_forms.hpp) chooses.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/impl/dropout_impl.hpp"
#include "kdnn/attention/impl/fused_attention_checks.hpp"
#include "kdnn/attention/impl/fused_attention_forms.hpp"
#include "kdnn/attention/impl/fused_backward_kernels.hpp"
#include "kdnn/attention/impl/fused_forward_kernel.hpp"
#include "kdnn/attention/impl/visible_keys.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/row_major_index.hpp"
#include "kdnn/core/impl/strided_fill.hpp"
#include "kdnn/core/impl/team_plan.hpp"
#include "kdnn/core/validate.hpp"

namespace kdnn::attention::impl {

/// The dropout test of `opts` (dropout.hpp's rule, Philox keyed by seed) in
/// the mask's positions, for a call of H heads.
template <class Positions>
DropoutMask dropout_mask(const DropoutOptions& opts, const Positions& positions, int H) {
  DropoutMask m;
  m.query_begin = positions.query_begin, m.query_length = positions.query_length;
  m.key_begin = positions.key_begin, m.key_length = positions.key_length;
  m.head_begin = positions.head_begin, m.head_count = positions.head_count;
  m.heads = H > 0 ? H : 1;
  m.active = opts.p > 0;
  m.threshold = drop_threshold(opts.p);
  m.key0 = std::uint32_t(opts.seed), m.key1 = std::uint32_t(opts.seed >> 32);
  m.off0 = std::uint32_t(opts.offset), m.off1 = std::uint32_t(opts.offset >> 32);
  return m;
}

/// opts.softcap as the kernels apply it.
template <class T>
ScoreCap<T> score_cap(const FusedAttentionOptions& opts) {
  ScoreCap<T> c;
  if (opts.softcap > 0) c.cap = T(opts.softcap), c.inv = T(1.0 / opts.softcap);
  return c;
}

/// The launch plan of one fused kernel over `league` teams.
template <class ExecSpace, class Kernel>
kdnn::impl::TeamPlan<ExecSpace> plan_fused(const char* op, const ExecSpace& space, int league,
                                           const FusedAttentionOptions& opts, int bq, int bk, int D,
                                           int Dv) {
  const std::size_t bytes = kdnn::impl::layout_bytes(
      [&](kdnn::impl::ScratchCarver& s) { Kernel::carve(s, bq, bk, D, Dv); });
  return kdnn::impl::plan_team<ExecSpace, Kernel>(
      op, space, league, opts.launch, kdnn::impl::BackendTraits<ExecSpace>::is_host ? 1 : 8, bytes,
      "blocks of " + std::to_string(bq) + " queries and " + std::to_string(bk) +
          " keys with D=" + std::to_string(D) + ", Dv=" + std::to_string(Dv));
}

/// The launch plan of a GPU form over `league` blocks (plan_register_team).
template <class ExecSpace, class Kernel>
kdnn::impl::TeamPlan<ExecSpace> plan_fused_gpu(const char* op, const ExecSpace& space, int league,
                                               const FusedAttentionOptions& opts) {
  return kdnn::impl::plan_register_team<ExecSpace, Kernel>(
      op, space, league, opts.launch, Kernel::scratch_bytes(),
      "blocks of " + std::to_string(Kernel::BQ) + " queries and " + std::to_string(Kernel::BK) +
          " keys (GPU form)");
}

/// Whether the backward runs one team per head (FusedBackwardSchedule).
template <class ExecSpace>
bool backward_per_head(const ExecSpace& space, int B, int H, const FusedAttentionOptions& opts) {
  return opts.backward == FusedBackwardSchedule::per_head ||
         (opts.backward == FusedBackwardSchedule::automatic &&
          kdnn::impl::BackendTraits<ExecSpace>::is_host && B * H >= space.concurrency());
}

/// The launch plans of a register-tiled backward's kernels (as
/// launch_backward_teams below makes them), launching nothing.
template <class KV, class Q = void, class ExecSpace>
void plan_backward_teams(const char* op, const ExecSpace& space, int S, int Sk,
                         const FusedAttentionOptions& opts) {
  if (Sk > 0) plan_fused_gpu<ExecSpace, KV>(op, space, 1, opts);
  if constexpr (!std::is_void_v<Q>) {
    if (S > 0) plan_fused_gpu<ExecSpace, Q>(op, space, 1, opts);
  }
}

/// Makes the launch plans the fused forward (or backward) would make for
/// these sizes, launching nothing: throws what the call would (a head size
/// past every GPU form where one must run, team scratch past the backend's
/// limit, a launch the backend refuses). For callers that must check
/// everything before their first launch (the attention layer).
template <class ExecSpace, class T>
void check_fused_launch(const char* op, const ExecSpace& space, int B, int H, int S, int Sk, int D,
                        int Dv, const FusedAttentionOptions& opts, bool backward) {
  check_gpu_head_sizes<ExecSpace, T>(op, opts.launch, std::size_t(D), std::size_t(Dv));
  if (B == 0 || H == 0) return;
  int bq = 1, bk = 1;
  fused_block_sizes<ExecSpace>(S, Sk, D, Dv, bq, bk);
  if (!backward) {
    if (S == 0) return;
    if (!FusedForwardForms<ExecSpace, T>::visit(
            space, opts.launch, std::array<int, 2>{D, Dv}, [&](auto kernel, const char*) {
              plan_fused_gpu<ExecSpace, typename decltype(kernel)::type>(op, space, 1, opts);
            })) {
      plan_fused<ExecSpace, FusedForwardKernel<ExecSpace, T>>(op, space, 1, opts, bq, bk, D, Dv);
    }
    return;
  }
  if (FusedBackwardForms<ExecSpace, T>::visit(
          space, opts.launch, std::array<int, 2>{D, Dv}, [&](auto kv, auto q, const char*) {
            plan_backward_teams<typename decltype(kv)::type, typename decltype(q)::type>(
                op, space, S, Sk, opts);
          })) {
    return;
  }
  const bool per_head = backward_per_head(space, B, H, opts);  // one kernel
  if (Sk > 0 || per_head) {
    plan_fused<ExecSpace, FusedBackwardKVKernel<ExecSpace, T>>(op, space, 1, opts, bq, bk, D, Dv);
  }
  if (S > 0 && !per_head) {
    plan_fused<ExecSpace, FusedBackwardQKernel<ExecSpace, T>>(op, space, 1, opts, bq, bk, D, Dv);
  }
}

/// Checks the forward's arguments (and the mask where `mask_check` says)
/// and gathers what every form of it takes.
template <class ExecSpace, class T>
FusedForwardData<ExecSpace, T> forward_data(const char* op, const ExecSpace& space,
                                            const FusedAttentionForward<T, ExecSpace>& a,
                                            const FusedAttentionOptions& opts, MaskCheck mask_check,
                                            const EntryRows& queries, const EntryRows& keys) {
  const auto& q = a.q;
  const auto& k = a.k;
  const auto& v = a.v;
  const auto& o = a.o;
  const auto& lse = a.lse;
  const auto& mask = a.mask;
  validate_fused<ExecSpace, T>(op, space, opts, q, k, v, "o", StridedTensor4<const T, ExecSpace>(o),
                               "lse", Tensor3<const T, ExecSpace>(lse), a.sinks);
  validate::distinct_elements(op, "o", o);
  using validate::memory_of;
  validate::disjoint(
      op, {memory_of("o", o), memory_of("lse", lse)},
      {memory_of("q", q), memory_of("k", k), memory_of("v", v), memory_of("sinks", a.sinks)});
  if (mask_check == MaskCheck::here) {
    check_mask(op, mask, q.extent(0), q.extent(2), k.extent(2), q.extent(1));
  }
  FusedForwardData<ExecSpace, T> data;
  data.q = entry_rows(q, queries), data.k = entry_rows(k, keys), data.v = entry_rows(v, keys);
  data.o = entry_rows(o, queries), data.lse = entry_values(lse, queries);
  data.group = k.extent(1) > 0 ? int(q.extent(1) / k.extent(1)) : 1;
  data.visible = VisibleKeys<ExecSpace>(mask, queries.extent, keys.extent);
  data.scale = T(opts.scale);
  data.softcap = score_cap<T>(opts);
  data.keep_scale = T(1.0 / (1.0 - opts.dropout.p));
  data.neg_inf = -std::numeric_limits<T>::infinity();
  data.dropout = dropout_mask(opts.dropout, mask.positions, int(q.extent(1)));
  data.sinks = a.sinks;
  return data;
}

/// Launches a register-tiled form of the forward (GPU or tensor-core) with
/// `data`, one team per Kernel::BQ queries of a head.
template <class Kernel, class ExecSpace, class T>
void launch_forward_team(const char* op, const ExecSpace& space,
                         const FusedForwardData<ExecSpace, T>& data,
                         const FusedAttentionOptions& opts, const std::string& label,
                         const EntryRows& queries) {
  Kernel kernel;
  static_cast<FusedForwardData<ExecSpace, T>&>(kernel) = data;
  kernel.blocks = row_blocks(op, space, queries, int(data.q.extent(1)), Kernel::BQ);
  if (kernel.blocks.items == 0) return;
  const auto plan = plan_fused_gpu<ExecSpace, Kernel>(op, space, kernel.blocks.items, opts);
  plan.launch(label, space, kernel);
}

/// Runs the forward's kernel on `data` (forward_data) over the blocks of
/// `queries`, in the form the options and the head sizes choose.
template <class ExecSpace, class T>
void run_fused_forward(const char* op, const ExecSpace& space,
                       const FusedForwardData<ExecSpace, T>& data,
                       const FusedAttentionOptions& opts, const EntryRows& queries,
                       const EntryRows& keys) {
  const int D = int(data.q.extent(3)), Dv = int(data.v.extent(3));
  const std::string sizes = "D=" + std::to_string(D) + ", Dv=" + std::to_string(Dv) + "]";
  if (FusedForwardForms<ExecSpace, T>::visit(
          space, opts.launch, std::array<int, 2>{D, Dv}, [&](auto kernel, const char* form) {
            launch_forward_team<typename decltype(kernel)::type>(
                op, space, data, opts,
                std::string("kdnn::attention::fused_attention_forward[") + form + " " + sizes,
                queries);
          })) {
    return;
  }

  using Kernel = FusedForwardKernel<ExecSpace, T>;
  Kernel kernel;
  static_cast<FusedForwardData<ExecSpace, T>&>(kernel) = data;
  fused_block_sizes<ExecSpace>(queries.extent, keys.extent, D, Dv, kernel.bq, kernel.bk);
  kernel.blocks = row_blocks(op, space, queries, int(data.q.extent(1)), kernel.bq);
  if (kernel.blocks.items == 0) return;
  const auto plan = plan_fused<ExecSpace, Kernel>(op, space, kernel.blocks.items, opts, kernel.bq,
                                                  kernel.bk, D, Dv);
  plan.launch("kdnn::attention::fused_attention_forward", space, kernel);
}

template <class ExecSpace, class T>
void fused_attention_forward(const ExecSpace& space, const FusedAttentionForward<T, ExecSpace>& a,
                             const FusedAttentionOptions& opts, MaskCheck mask_check) {
  constexpr const char* op = "attention::fused_attention_forward";
  const EntryRows queries{int(a.q.extent(0)), int(a.q.extent(2))},
      keys{int(a.k.extent(0)), int(a.k.extent(2))};
  const auto data = forward_data<ExecSpace, T>(op, space, a, opts, mask_check, queries, keys);
  run_fused_forward<ExecSpace, T>(op, space, data, opts, queries, keys);
}

/// delta[b, h, i] = dO_i·O_i, the softmax backward's row sums.
template <class ExecSpace, class T>
void row_deltas(const ExecSpace& space, const StridedTensor4<const T, ExecSpace>& dout,
                const StridedTensor4<const T, ExecSpace>& o, const Tensor3<T, ExecSpace>& delta) {
  if (delta.size() == 0) return;
  const int Dv = int(o.extent(3));
  const kdnn::impl::RowMajorIndex<3> at(delta);
  Kokkos::parallel_for(
      "kdnn::attention::fused_delta", Kokkos::RangePolicy<ExecSpace>(space, 0, delta.size()),
      KOKKOS_LAMBDA(std::size_t row) {
        const auto bhi = at(row);
        const std::size_t b = bhi[0], h = bhi[1], i = bhi[2];
        // In double, in team_gemm's order: with T = double bitwise the
        // sum that gives dP at a one-hot row's key (dP − δ = 0 there). Each
        // row is contiguous (unit last stride, checked).
        delta(b, h, i) =
            Dv == 0 ? T(0)
                    : T(kdnn::impl::gemm_order_dot<double>(Dv, &dout(b, h, i, 0), &o(b, h, i, 0)));
      });
}

/// dsinks[h] = −Σ_{b,i} e^{sink_h − lse_{b,h,i}}·δ_{b,h,i}: a sink is a key
/// with no value, so its dS = P_sink·(0 − δ) (the rows' shared δ = dO·O).
/// One team per head sums its rows in double.
template <class ExecSpace, class T>
void sink_gradients(const ExecSpace& space, const Vector<const T, ExecSpace>& sinks,
                    const Tensor3<const T, ExecSpace>& lse, const Tensor3<T, ExecSpace>& delta,
                    const Vector<T, ExecSpace>& dsinks) {
  const int H = int(lse.extent(1)), S = int(lse.extent(2));
  const std::int64_t rows = std::int64_t(lse.extent(0)) * S;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  Kokkos::parallel_for(
      "kdnn::attention::fused_sink_gradients", Policy(space, H, Kokkos::AUTO),
      KOKKOS_LAMBDA(const typename Policy::member_type& team) {
        const int h = team.league_rank();
        const double sink = double(sinks(h));
        double sum = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, rows),
            [&](std::int64_t x, double& part) {
              const int b = int(x / S), i = int(x % S);
              const double row_lse = double(lse(b, h, i));
              // A row's sink probability: 0 where the sink is −inf (and lse
              // may be too).
              if (sink != neg_inf) {
                part += compat::exp(sink - row_lse) * double(delta(b, h, i));
              }
            },
            sum);
        Kokkos::single(Kokkos::PerTeam(team), [&] { dsinks(h) = T(-sum); });
      });
}

/// Launches a register-tiled form of the backward (GPU or tensor-core):
/// KV, a team per KV::BK keys of a head, walking the queries in tiles of
/// KV::BQ, and Q, a team per Q::BQ queries (dQ); Q void: KV adds dQ too,
/// tile by tile in turn (fused_backward_mma_kernels.hpp), from zero.
template <class KV, class Q = void, class ExecSpace, class T>
void launch_backward_teams(const char* op, const ExecSpace& space,
                           FusedBackwardData<ExecSpace, T> data,
                           const StridedTensor4<T, ExecSpace>& dq,
                           const StridedTensor4<T, ExecSpace>& dk,
                           const StridedTensor4<T, ExecSpace>& dv,
                           const FusedAttentionOptions& opts, const std::string& tag,
                           const EntryRows& queries, const EntryRows& keys) {
  const int H = int(data.q.extent(1));
  data.bq = KV::BQ;  // the rows load_rows reads
  data.bk = KV::BK;
  constexpr bool kv_adds_dq = std::is_void_v<Q>;
  // The shares are added to dQ: from zero, or (add_dq) to its values.
  if (kv_adds_dq && !data.add_dq) kdnn::impl::fill_strided(space, dq, T(0));
  KV kv;
  static_cast<FusedBackwardData<ExecSpace, T>&>(kv) = data;
  kv.dk = entry_rows(dk, keys), kv.dv = entry_rows(dv, keys);
  kv.blocks = row_blocks(op, space, keys, H, KV::BK);
  if (kv.blocks.items > 0) {
    const auto plan = plan_fused_gpu<ExecSpace, KV>(op, space, kv.blocks.items, opts);
    if constexpr (kv_adds_dq) {
      // One counter for the teams' claims, then one per (b, h, query tile).
      const Kokkos::View<int*, typename ExecSpace::memory_space> counters(
          Kokkos::view_alloc(space, std::string("kdnn::attention::fused_backward_turns")),
          1 + std::size_t(queries.entries) * H * ((queries.extent + KV::BQ - 1) / KV::BQ));
      kv.dq = entry_rows(dq, queries);
      kv.turns = counters.data() + 1;
      plan.launch("kdnn::attention::fused_backward" + tag, space, kv, counters.data());
    } else {
      plan.launch("kdnn::attention::fused_backward_kv" + tag, space, kv);
    }
  }
  if constexpr (!kv_adds_dq) {
    Q qk;
    static_cast<FusedBackwardData<ExecSpace, T>&>(qk) = data;
    qk.dq = entry_rows(dq, queries);
    qk.blocks = row_blocks(op, space, queries, H, Q::BQ);
    if (qk.blocks.items == 0) return;
    const auto plan = plan_fused_gpu<ExecSpace, Q>(op, space, qk.blocks.items, opts);
    plan.launch("kdnn::attention::fused_backward_q" + tag, space, qk);
  }
}

/// Runs the backward's kernels with dK and dV per query head (`group` query
/// heads per key/value head of k and v), on flat tensors whose entries'
/// rows `queries` and `keys` give (entry_rows.hpp). `add_dq`, `add_dkv`:
/// the kernels add into dq, and into dk and dv, instead of overwriting.
template <class ExecSpace, class T>
void run_fused_backward(
    const char* op, const ExecSpace& space, const StridedTensor4<const T, ExecSpace>& q,
    const StridedTensor4<const T, ExecSpace>& k, const StridedTensor4<const T, ExecSpace>& v,
    const StridedTensor4<const T, ExecSpace>& dout, const Tensor3<const T, ExecSpace>& lse,
    const Tensor3<const T, ExecSpace>& delta, const StridedTensor4<T, ExecSpace>& dq,
    const StridedTensor4<T, ExecSpace>& dk, const StridedTensor4<T, ExecSpace>& dv,
    const FusedAttentionOptions& opts, const AttentionMask<ExecSpace>& mask, int group, bool add_dq,
    bool add_dkv, const EntryRows& queries, const EntryRows& keys) {
  const int H = int(q.extent(1)), S = queries.extent, Sk = keys.extent, D = int(q.extent(3)),
            Dv = int(v.extent(3));
  FusedBackwardData<ExecSpace, T> data;
  data.q = entry_rows(q, queries), data.k = entry_rows(k, keys), data.v = entry_rows(v, keys);
  data.dout = entry_rows(dout, queries);
  data.lse = entry_values(lse, queries), data.delta = entry_values(delta, queries);
  data.group = group;
  data.add_dq = add_dq, data.add_dkv = add_dkv;
  data.visible = VisibleKeys<ExecSpace>(mask, S, Sk);
  data.dropout = dropout_mask(opts.dropout, mask.positions, H);
  data.scale = T(opts.scale);
  data.softcap = score_cap<T>(opts);
  data.keep_scale = T(1.0 / (1.0 - opts.dropout.p));
  fused_block_sizes<ExecSpace>(S, Sk, D, Dv, data.bq, data.bk);
  const std::string sizes = "D=" + std::to_string(D) + ", Dv=" + std::to_string(Dv) + "]";

  if (FusedBackwardForms<ExecSpace, T>::visit(
          space, opts.launch, std::array<int, 2>{D, Dv}, [&](auto kv, auto q, const char* form) {
            launch_backward_teams<typename decltype(kv)::type, typename decltype(q)::type>(
                op, space, data, dq, dk, dv, opts, std::string("[") + form + " " + sizes, queries,
                keys);
          })) {
    return;
  }

  const bool per_head = backward_per_head(space, queries.entries, H, opts);
  using KV = FusedBackwardKVKernel<ExecSpace, T>;
  KV kv;
  static_cast<FusedBackwardData<ExecSpace, T>&>(kv) = data;
  kv.dq = entry_rows(dq, queries), kv.dk = entry_rows(dk, keys), kv.dv = entry_rows(dv, keys);
  kv.with_dq = per_head;
  // Per head: one team per (b, h), which reads no blocks.
  kv.blocks = row_blocks(op, space, per_head ? EntryRows{queries.entries, 1} : keys, H, data.bk);
  if (kv.blocks.items > 0) {
    const auto plan =
        plan_fused<ExecSpace, KV>(op, space, kv.blocks.items, opts, data.bq, data.bk, D, Dv);
    plan.launch("kdnn::attention::fused_backward_kv", space, kv);
  }
  if (per_head) return;
  using Q = FusedBackwardQKernel<ExecSpace, T>;
  Q qk;
  static_cast<FusedBackwardData<ExecSpace, T>&>(qk) = data;
  qk.dq = entry_rows(dq, queries);
  qk.blocks = row_blocks(op, space, queries, H, data.bq);
  if (qk.blocks.items == 0) return;
  const auto plan =
      plan_fused<ExecSpace, Q>(op, space, qk.blocks.items, opts, data.bq, data.bk, D, Dv);
  plan.launch("kdnn::attention::fused_backward_q", space, qk);
}

/// into(b, g, ·, ·) = Σ_r heads(b, g·group + r, ·, ·), r = 0 .. group − 1 in
/// order: dK or dV of a key/value head from its query heads' shares (`add`:
/// added to into's values).
template <class ExecSpace, class T>
void sum_group_heads(const ExecSpace& space, const StridedTensor4<T, ExecSpace>& heads,
                     const StridedTensor4<T, ExecSpace>& into, int group, bool add) {
  const kdnn::impl::RowMajorIndex<4> at(into);
  Kokkos::parallel_for(
      "kdnn::attention::fused_sum_group_heads",
      Kokkos::RangePolicy<ExecSpace>(space, 0, into.size()), KOKKOS_LAMBDA(std::size_t x) {
        const auto i = at(x);  // (b, g, key, d)
        const std::size_t first = i[1] * std::size_t(group);
        T sum = heads(i[0], first, i[2], i[3]);
        for (int r = 1; r < group; ++r) sum += heads(i[0], first + r, i[2], i[3]);
        FusedBackwardData<ExecSpace, T>::store(add, into(i[0], i[1], i[2], i[3]), sum);
      });
}

/// The backward on flat tensors whose entries' rows `queries` and `keys`
/// give (entry_rows.hpp): the checks (of the mask where mask_check says
/// so), δ, the kernels, GQA's group sums.
template <class ExecSpace, class T>
void fused_backward_on_rows(const char* op, const ExecSpace& space,
                            const FusedAttentionBackward<T, ExecSpace>& a,
                            const FusedAttentionOptions& opts, MaskCheck mask_check,
                            const EntryRows& queries, const EntryRows& keys) {
  check_fused_backward<ExecSpace, T>(op, space, a, opts);
  const auto &q = a.q, &k = a.k;  // one type per declaration (nvcc)
  const auto &dk = a.dk, &dv = a.dv;
  const int B = int(q.extent(0)), H = int(q.extent(1)), S = int(q.extent(2)), Sk = int(k.extent(2));
  if (mask_check == MaskCheck::here) check_mask(op, a.mask, B, S, Sk, H);
  if (B == 0 || H == 0) {
    if (validate::given(a.dsinks)) Kokkos::deep_copy(space, a.dsinks, T(0));  // no rows
    return;
  }
  const int group = int(q.extent(1) / k.extent(1));

  // δ_i = dO_i·O_i, the softmax backward's row sums (O(B·H·S) memory): in
  // the caller's workspace, or allocated for the call.
  const Tensor3<T, ExecSpace> delta =
      validate::given(a.delta) ? a.delta
                               : Tensor3<T, ExecSpace>("kdnn::attention::fused_delta", B, H, S);
  row_deltas<ExecSpace, T>(space, a.dout, a.o, delta);
  if (validate::given(a.dsinks))
    sink_gradients<ExecSpace, T>(space, a.sinks, a.lse, delta, a.dsinks);

  // Where the kernels write dK and dV: the gradients themselves, or, for
  // grouped-query attention, one share per query head, in the caller's
  // buffers or ones for the call, whose group's heads are summed after, in
  // order.
  const auto written = [&](const StridedTensor4<T, ExecSpace>& grad,
                           const Tensor4<T, ExecSpace>& given,
                           const char* name) -> StridedTensor4<T, ExecSpace> {
    if (group == 1) return grad;
    if (validate::given(given)) return given;
    return Tensor4<T, ExecSpace>(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                                    std::string("kdnn::attention::fused_") + name),
                                 B, H, Sk, grad.extent(3));
  };
  const StridedTensor4<T, ExecSpace> dk_written = written(dk, a.dk_shares, "dk_heads"),
                                     dv_written = written(dv, a.dv_shares, "dv_heads");
  // With accumulate, the shares are written and their sums added.
  run_fused_backward<ExecSpace, T>(op, space, q, k, a.v, a.dout, a.lse, delta, a.dq, dk_written,
                                   dv_written, opts, a.mask, group, a.accumulate,
                                   a.accumulate && group == 1, queries, keys);
  if (group > 1) {
    sum_group_heads<ExecSpace, T>(space, dk_written, dk, group, a.accumulate);
    sum_group_heads<ExecSpace, T>(space, dv_written, dv, group, a.accumulate);
  }
}

template <class ExecSpace, class T>
void fused_attention_backward(const ExecSpace& space, const FusedAttentionBackward<T, ExecSpace>& a,
                              const FusedAttentionOptions& opts, MaskCheck mask_check) {
  constexpr const char* op = "attention::fused_attention_backward";
  const int B = int(a.q.extent(0)), S = int(a.q.extent(2)), Sk = int(a.k.extent(2));
  fused_backward_on_rows<ExecSpace, T>(op, space, a, opts, mask_check, EntryRows{B, S},
                                       EntryRows{B, Sk});
}

// The functions that hold the fused kernels (the two runs, and the launch
// check, whose plans name every kernel: on a GPU, planning instantiates a
// kernel), compiled into libkdnn with the operators
// (fused_attention_eti.cpp) and declared extern: the layer (mha_impl.hpp)
// and the packed operators reach the kernels through them without
// compiling them again.
#define KDNN_FUSED_ATTENTION_RUNS(PREFIX, ExecSpace, T)                                           \
  PREFIX void check_fused_launch<ExecSpace, T>(const char*, const ExecSpace&, int, int, int, int, \
                                               int, int, const FusedAttentionOptions&, bool);     \
  PREFIX void run_fused_forward<ExecSpace, T>(                                                    \
      const char*, const ExecSpace&, const FusedForwardData<ExecSpace, T>&,                       \
      const FusedAttentionOptions&, const EntryRows&, const EntryRows&);                          \
  PREFIX void fused_backward_on_rows<ExecSpace, T>(                                               \
      const char*, const ExecSpace&, const FusedAttentionBackward<T, ExecSpace>&,                 \
      const FusedAttentionOptions&, MaskCheck, const EntryRows&, const EntryRows&);
#define KDNN_FUSED_ATTENTION_RUNS_EXTERN(ExecSpace, T) \
  KDNN_FUSED_ATTENTION_RUNS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_FUSED_ATTENTION_RUNS_EXTERN)
#undef KDNN_FUSED_ATTENTION_RUNS_EXTERN

}  // namespace kdnn::attention::impl
