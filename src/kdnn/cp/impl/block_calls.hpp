// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The single-rank fused attention calls of context-parallel attention
// (cp/attention.hpp): a block of queries against a block of keys, piece by
// piece (block_pieces.hpp), on a run of heads (head_split.hpp) whose mask
// places them in the whole call (positions.head_begin, so dropout numbers
// them as the whole call does) with ALiBi's slopes cut to the run. The
// sinks join the merged result at the end (attention_merge.hpp).
#include <Kokkos_Core.hpp>
#include <utility>
#include <vector>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/cp/impl/block_pieces.hpp"
#include "kdnn/cp/impl/head_split.hpp"
#include "kdnn/cp/impl/sequence_rows.hpp"

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

/// Rows [r) of a [B, H, L, E] View, every head.
template <class View>
auto rows_in(const View& v, std::pair<int, int> r) {
  return Kokkos::subview(v, Kokkos::ALL, Kokkos::ALL, r, Kokkos::ALL);
}

/// The whole call's mask (of H heads) for a call on its heads `heads`:
/// placed there for dropout, with ALiBi's slopes of those heads.
template <class ExecSpace>
attention::AttentionMask<ExecSpace> mask_for(const ExecSpace& space,
                                             const attention::AttentionMask<ExecSpace>& whole,
                                             HeadRange heads, int H) {
  auto m = whole;
  m.positions.head_begin = whole.positions.head_begin + heads.begin;
  m.positions.head_count = whole.positions.head_count >= 0 ? whole.positions.head_count : H;
  if (whole.alibi_slopes.size() > 0) {  // [1 or B, H] → the run's columns
    Matrix<double, ExecSpace> slopes("kdnn::cp::alibi_slopes", whole.alibi_slopes.extent(0),
                                     std::size_t(heads.count()));
    Kokkos::deep_copy(space, slopes,
                      Kokkos::subview(whole.alibi_slopes, Kokkos::ALL, heads.range()));
    m.alibi_slopes = slopes;
  }
  return m;
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

/// Whether `pieces` are the whole block of `rows` queries against `cols`
/// keys in one call.
inline bool one_whole_piece(const std::vector<BlockPiece>& pieces, int rows, int cols) {
  return pieces.size() == 1 && pieces[0].q_rows == std::make_pair(0, rows) &&
         pieces[0].k_rows == std::make_pair(0, cols);
}

/// blk's queries against its keys, piece by piece (`pieces` of blk's
/// rows): o and lse of the pieces' query rows (the others untouched).
template <class ExecSpace, class T>
void forward_pieces(const ExecSpace& space,
                    const attention::FusedAttentionForward<T, ExecSpace>& blk,
                    const attention::FusedAttentionOptions& opts, const Packing& packing,
                    const std::vector<BlockPiece>& pieces) {
  const int H = int(blk.q.extent(1));
  const std::pair<int, int> heads(0, H);
  for (const BlockPiece& p : pieces) {
    attention::FusedAttentionForward<T, ExecSpace> c;
    c.q = rows_in(blk.q, p.q_rows), c.k = rows_in(blk.k, p.k_rows), c.v = rows_in(blk.v, p.k_rows);
    c.o = rows_in(blk.o, p.q_rows);
    c.lse = lse_block(space, blk.lse, heads, p.q_rows, false);
    c.mask = piece_mask(space, blk.mask, packing, p, H);
    c.sinks = blk.sinks;
    attention::impl::fused_attention_forward(space, c, opts,
                                             attention::impl::MaskCheck::done_by_caller);
    put_lse_block(space, blk.lse, c.lse, heads, p.q_rows);
  }
}

/// blk's backward, piece by piece: each piece's dQ, dK, dV added into
/// blk.dq, dk, dv at its rows (accumulators the caller set), in place.
template <class ExecSpace, class T>
void backward_pieces(const ExecSpace& space,
                     const attention::FusedAttentionBackward<T, ExecSpace>& blk,
                     const attention::FusedAttentionOptions& opts, const Packing& packing,
                     const std::vector<BlockPiece>& pieces) {
  const int H = int(blk.q.extent(1));
  const std::pair<int, int> heads(0, H);
  for (const BlockPiece& p : pieces) {
    attention::FusedAttentionBackward<T, ExecSpace> c;
    c.q = rows_in(blk.q, p.q_rows), c.k = rows_in(blk.k, p.k_rows), c.v = rows_in(blk.v, p.k_rows);
    c.o = rows_in(blk.o, p.q_rows), c.dout = rows_in(blk.dout, p.q_rows);
    c.lse = lse_block(space, blk.lse, heads, p.q_rows, true);
    c.dq = rows_in(blk.dq, p.q_rows), c.dk = rows_in(blk.dk, p.k_rows);
    c.dv = rows_in(blk.dv, p.k_rows);
    c.accumulate = true;
    c.mask = piece_mask(space, blk.mask, packing, p, H);
    c.sinks = blk.sinks;
    attention::impl::fused_attention_backward(space, c, opts,
                                              attention::impl::MaskCheck::done_by_caller);
  }
}

}  // namespace kdnn::cp::impl
