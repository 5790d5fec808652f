// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The single-rank calls that one block of queries against one block of keys
// of context-parallel attention (cp/attention.hpp) makes. The whole
// sequence of S steps holds N packed sequences (CpAttentionOptions::
// cu_seqlens; without it, one sequence of S steps per batch entry), and a
// query sees only its own sequence's keys, so a pair of blocks splits into
// one piece per sequence both blocks reach. Each piece runs the single-rank
// kernels with the mask's positions in its sequence: the causal mask, the
// band and ALiBi are the sequence's (bottom-right aligned, as the packed
// single-rank call's, which for self-attention is the diagonal), and
// dropout numbers the piece's elements as element (n, h, i, j) of [N, H,
// longest, longest] (the packed call's rule, fused_attention_varlen.hpp;
// without packing [B, H, S, S], the dense call's). Pieces that the causal
// mask or the band hide entirely are left out.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "kdnn/attention/softmax.hpp"
#include "kdnn/core/tensor.hpp"
#include "kdnn/cp/sequence_layout.hpp"

namespace kdnn::cp::impl {

/// The sequences packed along the whole sequence: their offsets (N + 1,
/// 0 first, S last), or one sequence of S steps.
struct Packing {
  std::vector<std::int64_t> starts;
  std::int64_t longest = 0;
  bool packed = false;

  Packing(const std::vector<std::int64_t>& cu_seqlens, std::int64_t S)
      : starts(cu_seqlens), packed(!cu_seqlens.empty()) {
    if (!packed) starts = {0, S};
    for (std::size_t n = 0; n + 1 < starts.size(); ++n) {
      longest = std::max(longest, starts[n + 1] - starts[n]);
    }
  }
  int sequences() const { return int(starts.size()) - 1; }
  /// The sequences that hold a step of [s.begin, s.end): [first, last).
  std::pair<int, int> reaching(const Segment& s) const {
    if (s.steps() == 0) return {0, 0};
    const auto after = [&](std::int64_t p) {  // the sequence holding step p
      return int(std::upper_bound(starts.begin(), starts.end(), p) - starts.begin()) - 1;
    };
    return {after(s.begin), after(s.end - 1) + 1};
  }
};

/// Whether the mask hides every pair of queries q and keys k (positions in
/// one sequence): keys all after the queries under the causal mask, or
/// outside the band of every query (without per-entry lengths, which move
/// the band's diagonal).
template <class ExecSpace>
bool hidden(const attention::AttentionMask<ExecSpace>& mask, const Segment& q, const Segment& k) {
  if (q.steps() == 0 || k.steps() == 0) return true;
  if (mask.causal && k.begin > q.end - 1) return true;
  if (mask.seq_q.extent(0) > 0 || mask.seq_k.extent(0) > 0) return false;
  if (mask.band_right >= 0 && k.begin > q.end - 1 + mask.band_right) return true;
  if (mask.band_left >= 0 && k.end - 1 < q.begin - mask.band_left) return true;
  return false;
}

/// One single-rank call of a pair of blocks: rows of each block (counted
/// from the block's first) inside one sequence, and their positions in it.
struct BlockPiece {
  int sequence = 0;
  std::pair<int, int> q_rows, k_rows;
  Segment q, k;  ///< positions in the sequence
};

/// The pieces of queries at global steps `q` against keys at `k` that the
/// mask does not hide, one per sequence both reach.
template <class ExecSpace>
std::vector<BlockPiece> block_pieces(const Packing& packing,
                                     const attention::AttentionMask<ExecSpace>& mask,
                                     const Segment& q, const Segment& k) {
  std::vector<BlockPiece> out;
  const auto [q0, q1] = packing.reaching(q);
  const auto [k0, k1] = packing.reaching(k);
  for (int n = std::max(q0, k0); n < std::min(q1, k1); ++n) {
    const std::int64_t start = packing.starts[std::size_t(n)];
    const std::int64_t end = packing.starts[std::size_t(n) + 1];
    const Segment qs{std::max(q.begin, start), std::min(q.end, end)};
    const Segment ks{std::max(k.begin, start), std::min(k.end, end)};
    const Segment qp{qs.begin - start, qs.end - start}, kp{ks.begin - start, ks.end - start};
    if (hidden(mask, qp, kp)) continue;
    out.push_back({n,
                   {int(qs.begin - q.begin), int(qs.end - q.begin)},
                   {int(ks.begin - k.begin), int(ks.end - k.begin)},
                   qp,
                   kp});
  }
  return out;
}

/// The mask of a piece's call of H heads (which `blk`, the block's mask,
/// may place among more: positions.head_begin and head_count): positions
/// in the piece's sequence, dropout's heads those of the sequence's entry,
/// ALiBi's slopes the entry's when each sequence has its own.
template <class ExecSpace>
attention::AttentionMask<ExecSpace> piece_mask(const ExecSpace& space,
                                               const attention::AttentionMask<ExecSpace>& blk,
                                               const Packing& packing, const BlockPiece& piece,
                                               int H) {
  auto m = blk;
  const int all_heads = blk.positions.head_count >= 0 ? blk.positions.head_count : H;
  const int L = int(packing.longest);
  m.positions = {int(piece.q.begin),
                 L,
                 int(piece.k.begin),
                 L,
                 piece.sequence * all_heads + blk.positions.head_begin,
                 packing.sequences() * all_heads};
  if (packing.packed && blk.alibi_slopes.extent(0) > 1) {  // [N, H]: the sequence's row
    const auto row = std::make_pair(std::size_t(piece.sequence), std::size_t(piece.sequence) + 1);
    Matrix<double, ExecSpace> own("kdnn::cp::alibi_slopes", 1, blk.alibi_slopes.extent(1));
    Kokkos::deep_copy(space, own, Kokkos::subview(blk.alibi_slopes, row, Kokkos::ALL));
    m.alibi_slopes = own;
  }
  return m;
}

}  // namespace kdnn::cp::impl
