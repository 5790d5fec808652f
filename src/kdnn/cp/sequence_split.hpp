// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// How a sequence is split across the ranks of a context-parallel group, and
// the halo pieces a causal convolution of width K needs: rank r holds steps
// [offsets[r], offsets[r+1]) (any lengths, zero included), and its first
// K−1 outputs read the K−1 steps before offsets[r], which may belong to
// several predecessors when they hold fewer than K−1 steps. With an initial
// state, rank 0 also holds the K−1 steps before step 0.
#include <algorithm>
#include <cstdint>
#include <vector>

namespace kdnn::cp {

/// The split's step offsets (R + 1) from each rank's fields gathered by
/// agree_on_signature (cp/agree.hpp), its length at `length_field`.
inline std::vector<std::int64_t> offsets_of(const std::vector<std::vector<std::int64_t>>& all,
                                            std::size_t length_field) {
  std::vector<std::int64_t> offsets(all.size() + 1, 0);
  for (std::size_t r = 0; r < all.size(); ++r) offsets[r + 1] = offsets[r] + all[r][length_field];
  return offsets;
}

/// Steps [begin, end) of the sequence that rank `from` sends rank `to`.
struct HaloPiece {
  int from, to;
  std::int64_t begin, end;
  std::int64_t steps() const { return end - begin; }
};

/// The pieces of the forward exchange (the backward sends the same pieces'
/// gradients the other way), ordered by receiver, then by step. A piece lies
/// wholly before step 0 (rank 0's initial state) or wholly after it. Every rank
/// computes the same list from the same arguments.
/// `offsets`: P+1 step offsets; `halo`: K−1; `rank0_owns_initial`: rank 0
/// holds the steps [−halo, 0) (an initial state; otherwise they are zeros).
inline std::vector<HaloPiece> halo_pieces(const std::vector<std::int64_t>& offsets,
                                          std::int64_t halo, bool rank0_owns_initial) {
  std::vector<HaloPiece> pieces;
  const int P = int(offsets.size()) - 1;
  for (int to = 1; to < P; ++to) {
    const std::int64_t lo = offsets[to] - halo, hi = offsets[to];
    // Rank 0's initial state is a piece of its own (it lies before step 0).
    if (rank0_owns_initial && lo < 0) pieces.push_back({0, to, lo, std::min<std::int64_t>(hi, 0)});
    for (int from = 0; from < to; ++from) {
      const std::int64_t b = std::max(lo, offsets[from]), e = std::min(hi, offsets[from + 1]);
      if (b < e) pieces.push_back({from, to, b, e});
    }
  }
  return pieces;
}

}  // namespace kdnn::cp
