// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The halo pieces of a causal convolution of width K over a sequence laid
// out on the ranks by a SequenceLayout (cp/sequence_layout.hpp): each
// segment's first K−1 outputs read the K−1 steps before the segment's first
// step, which may belong to several runs of other ranks' (or the same
// rank's) local steps when those are shorter than K−1. With an initial
// state, rank 0 also holds the K−1 steps before step 0.
//
// A rank's halo tensor holds one block of K−1 rows per segment of its list
// (empty segments included): row j of block s is step segments[s].begin −
// (K−1) + j.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kdnn/cp/sequence_layout.hpp"

namespace kdnn::cp {

/// Each rank's length, from the fields gathered by agree_on_signature
/// (cp/agree.hpp), the length at `length_field`.
inline std::vector<std::int64_t> lengths_of(const std::vector<std::vector<std::int64_t>>& all,
                                            std::size_t length_field) {
  std::vector<std::int64_t> lengths(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) lengths[r] = all[r][length_field];
  return lengths;
}

/// The step offsets (R + 1) of the contiguous split with those lengths.
inline std::vector<std::int64_t> offsets_of(const std::vector<std::vector<std::int64_t>>& all,
                                            std::size_t length_field) {
  std::vector<std::int64_t> offsets(all.size() + 1, 0);
  for (std::size_t r = 0; r < all.size(); ++r) offsets[r + 1] = offsets[r] + all[r][length_field];
  return offsets;
}

/// Global steps [begin, end) that rank `from` sends rank `to` for the halo of
/// `to`'s segment `segment`, with the rows they occupy on each side.
struct HaloPiece {
  int from, to, segment;
  std::int64_t begin, end;
  /// The sender's row of step `begin`: of its local steps, or, for a piece
  /// before step 0 (begin < 0), of rank 0's initial state [B, K−1, C].
  std::int64_t from_row;
  /// The receiver's row of step `begin` in its halo (all its segments').
  std::int64_t to_row;
  std::int64_t steps() const { return end - begin; }
  bool initial() const { return begin < 0; }
  bool operator==(const HaloPiece& o) const {
    return from == o.from && to == o.to && segment == o.segment && begin == o.begin &&
           end == o.end && from_row == o.from_row && to_row == o.to_row;
  }
};

/// The pieces of the forward exchange (the backward sends the same pieces'
/// gradients the other way), ordered by receiver, segment, then step; a rank
/// may send to itself (its own earlier segment; rank 0's initial state to
/// its first segment). Every rank computes the same list from the same
/// arguments. `halo`: K−1; `rank0_owns_initial`: rank 0 holds the steps
/// [−halo, 0) (an initial state; otherwise they are zeros, sent by no one).
inline std::vector<HaloPiece> halo_pieces(const SequenceLayout& layout, std::int64_t halo,
                                          bool rank0_owns_initial) {
  std::vector<HaloPiece> pieces;
  if (halo == 0) return pieces;
  for (int to = 0; to < layout.ranks(); ++to) {
    const auto& segments = layout.segments(to);
    for (std::size_t s = 0; s < segments.size(); ++s) {
      const std::int64_t lo = segments[s].begin - halo, hi = segments[s].begin;
      const std::int64_t block = std::int64_t(s) * halo - lo;  // step → halo row
      if (rank0_owns_initial && lo < 0) {
        const std::int64_t e = std::min<std::int64_t>(hi, 0);
        pieces.push_back({0, to, int(s), lo, e, lo + halo, lo + block});
      }
      for (const Placement& p : layout.find(std::max<std::int64_t>(lo, 0), hi)) {
        pieces.push_back(
            {p.rank, to, int(s), p.global.begin, p.global.end, p.local, p.global.begin + block});
      }
    }
  }
  return pieces;
}

}  // namespace kdnn::cp
