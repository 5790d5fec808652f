#pragma once
// Definition of kdnn::attention::impl::fused_attention_forward: checks, the
// launch plan (query-block and key-tile sizes per backend and D), the kernel
// (impl/fused_forward_kernel.hpp).
#include <limits>
#include <string>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/impl/dropout_impl.hpp"
#include "kdnn/attention/impl/fused_forward_kernel.hpp"
#include "kdnn/attention/impl/visible_keys.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/team_plan.hpp"
#include "kdnn/core/validate.hpp"

namespace kdnn::attention::impl {

/// Queries per team and keys per tile: large blocks on a host (one thread
/// per team, scratch in cache), warp-sized ones on a GPU, halved past
/// D = 128 so that the team's scratch stays small.
template <class ExecSpace>
void fused_block_sizes(int D, int Dv, int& bq, int& bk) {
  if (kdnn::impl::BackendTraits<ExecSpace>::is_host) {
    bq = bk = 64;
  } else {
    bq = bk = (D > 128 || Dv > 128) ? 16 : 32;
  }
}

template <class ExecSpace, class T>
void fused_attention_forward(const ExecSpace& space, const Tensor4<const T, ExecSpace>& q,
                             const Tensor4<const T, ExecSpace>& k,
                             const Tensor4<const T, ExecSpace>& v, const Tensor4<T, ExecSpace>& o,
                             const Tensor3<T, ExecSpace>& lse, const FusedAttentionOptions& opts,
                             const AttentionMask<ExecSpace>& mask) {
  constexpr const char* op = "attention::fused_attention_forward";
  validate::finite(op, "opts.scale", opts.scale);
  if (!(opts.dropout.p >= 0 && opts.dropout.p < 1)) {
    fail(op, ": opts.dropout.p=", opts.dropout.p, ", expected a value in [0, 1)");
  }
  for (int d = 0; d < 2; ++d) {
    const char* what = d == 0 ? "q's batch" : "q's heads";
    validate::extent(op, "k", k, d, q.extent(d), what);
    validate::extent(op, "v", v, d, q.extent(d), what);
    validate::extent(op, "o", o, d, q.extent(d), what);
    validate::extent(op, "lse", lse, d, q.extent(d), what);
  }
  validate::extent(op, "k", k, 3, q.extent(3), "D, q's extent(3)");
  validate::extent(op, "v", v, 2, k.extent(2), "Sk, k's extent(2)");
  validate::extent(op, "o", o, 2, q.extent(2), "S, q's extent(2)");
  validate::extent(op, "o", o, 3, v.extent(3), "Dv, v's extent(3)");
  validate::extent(op, "lse", lse, 2, q.extent(2), "S, q's extent(2)");
  using validate::memory_of;
  validate::disjoint(op, {memory_of("o", o), memory_of("lse", lse)},
                     {memory_of("q", q), memory_of("k", k), memory_of("v", v)});
  const int B = int(q.extent(0)), H = int(q.extent(1)), S = int(q.extent(2)), Sk = int(k.extent(2)),
            D = int(q.extent(3)), Dv = int(v.extent(3));
  check_mask(op, mask, B, S, Sk);
  if (B == 0 || H == 0 || S == 0) return;

  using Kernel = FusedForwardKernel<ExecSpace, T>;
  Kernel kernel;
  kernel.q = q, kernel.k = k, kernel.v = v, kernel.o = o, kernel.lse = lse;
  kernel.visible = VisibleKeys<ExecSpace>(mask, Sk);
  kernel.scale = T(opts.scale);
  kernel.keep_scale = T(1.0 / (1.0 - opts.dropout.p));
  kernel.neg_inf = -std::numeric_limits<T>::infinity();
  kernel.dropout.active = opts.dropout.p > 0;
  kernel.dropout.threshold = drop_threshold(opts.dropout.p);
  kernel.dropout.key0 = std::uint32_t(opts.dropout.seed);
  kernel.dropout.key1 = std::uint32_t(opts.dropout.seed >> 32);
  kernel.dropout.off0 = std::uint32_t(opts.dropout.offset);
  kernel.dropout.off1 = std::uint32_t(opts.dropout.offset >> 32);
  fused_block_sizes<ExecSpace>(D, Dv, kernel.bq, kernel.bk);
  const int bq = kernel.bq, bk = kernel.bk;
  const std::size_t bytes = kdnn::impl::layout_bytes(
      [&](kdnn::impl::ScratchCarver& s) { Kernel::carve(s, bq, bk, D, Dv); });
  const int blocks = (S + bq - 1) / bq;
  const auto plan = kdnn::impl::plan_team<ExecSpace, Kernel>(
      op, space, B * H * blocks, opts.launch, kdnn::impl::BackendTraits<ExecSpace>::is_host ? 1 : 8,
      bytes,
      "a block of " + std::to_string(bq) + " queries with D=" + std::to_string(D) +
          ", Dv=" + std::to_string(Dv));
  kernel.level = plan.level;
  kernel.scratch_bytes = plan.scratch_bytes;
  Kokkos::parallel_for("kdnn::attention::fused_attention_forward", plan.policy(space), kernel);
}

}  // namespace kdnn::attention::impl
