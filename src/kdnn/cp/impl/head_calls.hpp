// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The single-rank fused attention on a run of heads (head_split.hpp) of
// the whole sequence's keys, as the gathering forms of context-parallel
// attention (all_gather, all_to_all; cp/attention.hpp) call it: the mask's
// positions place the call's queries, keys and heads in the whole call
// (so the causal mask, the band, the padding lengths and dropout's
// numbering are those of the whole), and ALiBi's slopes and the sinks are
// cut to the run's heads.
#include <Kokkos_Core.hpp>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/cp/impl/head_split.hpp"

namespace kdnn::cp::impl {

/// Heads [h) of a [B, H, L, E] View (any strides).
template <class View>
auto heads_of(const View& v, std::pair<int, int> h) {
  return Kokkos::subview(v, Kokkos::ALL, h, Kokkos::ALL, Kokkos::ALL);
}

/// Heads [h) and rows [r) of a [B, H, L, E] View.
template <class View>
auto block_of(const View& v, std::pair<int, int> h, std::pair<int, int> r) {
  return Kokkos::subview(v, Kokkos::ALL, h, r, Kokkos::ALL);
}

/// The whole call's mask for query heads `heads` of H, queries from
/// position `query_begin` and every key, all of S steps.
template <class ExecSpace>
attention::AttentionMask<ExecSpace> mask_for(const ExecSpace& space,
                                             const attention::AttentionMask<ExecSpace>& whole,
                                             HeadRange heads, int H, int query_begin, int S) {
  auto m = whole;
  m.positions = {query_begin, S, 0, S, heads.begin, H};
  if (whole.alibi_slopes.size() > 0) {  // [1 or B, H] → the run's columns
    Kokkos::View<double**, ExecSpace> slopes("kdnn::cp::alibi_slopes", whole.alibi_slopes.extent(0),
                                             std::size_t(heads.count()));
    Kokkos::deep_copy(space, slopes,
                      Kokkos::subview(whole.alibi_slopes, Kokkos::ALL, heads.range()));
    m.alibi_slopes = slopes;
  }
  return m;
}

/// The sinks of `heads` (none when not given).
template <class Sinks>
Sinks sinks_for(const Sinks& sinks, HeadRange heads) {
  if (!validate::given(sinks)) return sinks;
  return Kokkos::subview(sinks, heads.range());
}

/// lse's heads [h) and rows [r) as a contiguous Tensor3: the View itself
/// when it is all of lse, else a copy (`copy_in`: with lse's values).
template <class ExecSpace, class Lse>
Tensor3<typename Lse::value_type, ExecSpace> lse_block(const ExecSpace& space, const Lse& lse,
                                                       std::pair<int, int> h, std::pair<int, int> r,
                                                       bool copy_in) {
  if (h.first == 0 && std::size_t(h.second) == lse.extent(1) && r.first == 0 &&
      std::size_t(r.second) == lse.extent(2)) {
    return lse;
  }
  using T = typename Lse::non_const_value_type;
  Tensor3<T, ExecSpace> out(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kdnn::cp::lse_block"),
                            lse.extent(0), std::size_t(h.second - h.first),
                            std::size_t(r.second - r.first));
  if (copy_in) Kokkos::deep_copy(space, out, Kokkos::subview(lse, Kokkos::ALL, h, r));
  return out;
}

/// lse's heads [h) and rows [r) ← block (nothing when block is lse itself).
template <class ExecSpace, class T>
void put_lse_block(const ExecSpace& space, const Tensor3<T, ExecSpace>& lse,
                   const Tensor3<T, ExecSpace>& block, std::pair<int, int> h,
                   std::pair<int, int> r) {
  if (block.data() == lse.data()) return;
  Kokkos::deep_copy(space, Kokkos::subview(lse, Kokkos::ALL, h, r), block);
}

}  // namespace kdnn::cp::impl
