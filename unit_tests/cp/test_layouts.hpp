// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The sequence layouts the context-parallel tests run on: the contiguous
// splits of rank_splits, the load-balanced layout, and an interleaved one
// whose segments are short (shorter than a halo, empty) and where a rank
// holds two adjacent segments (its halo partly its own); a rank's local
// steps of a whole-sequence tensor.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kdnn/cp/sequence_layout.hpp"
#include "rank_splits.hpp"

namespace kdnn_test {

/// The interleaved layout of L steps over R ranks: runs of 1, 3, 0, 2, 5, 1
/// steps (in turn) dealt to ranks 0, 0, 1, 2, …, R−1, 0, 1, …: rank 0's
/// first two segments are adjacent.
inline kdnn::cp::SequenceLayout interleaved_layout(std::int64_t L, int R) {
  const std::int64_t runs[] = {1, 3, 0, 2, 5, 1};
  std::vector<std::vector<kdnn::cp::Segment>> per_rank(static_cast<std::size_t>(R));
  std::int64_t at = 0;
  for (int i = 0; at < L; ++i) {
    const std::int64_t n = std::min(runs[i % 6], L - at);
    const int r = i == 0 ? 0 : (i - 1) % R;
    per_rank[std::size_t(r)].push_back({at, at + n});
    at += n;
  }
  for (auto& list : per_rank) {
    if (list.empty()) list.push_back({L, L});  // a rank that holds no steps
  }
  return kdnn::cp::SequenceLayout(std::move(per_rank));
}

/// Every layout the tests use for L steps on R ranks, with a name.
struct NamedLayout {
  std::string name;
  kdnn::cp::SequenceLayout layout;
  bool contiguous;  ///< one of rank_splits (a plan from each rank's length)
};
inline std::vector<NamedLayout> test_layouts(int R, int L, int short_steps) {
  std::vector<NamedLayout> out;
  for (const auto& lengths : rank_splits(R, L, short_steps, 0)) {
    std::string name = "contiguous";
    for (int l : lengths) name += " " + std::to_string(l);
    out.push_back(
        {name, kdnn::cp::SequenceLayout::contiguous({lengths.begin(), lengths.end()}), true});
  }
  out.push_back({"load-balanced", kdnn::cp::SequenceLayout::load_balanced(L, R), false});
  out.push_back({"interleaved", interleaved_layout(L, R), false});
  return out;
}

/// Rank r's local steps of a [B, L, E] tensor: its segments' steps one after
/// another, flat.
inline std::vector<double> local_steps(const std::vector<double>& v, int B, int L, int E,
                                       const std::vector<kdnn::cp::Segment>& segments) {
  std::vector<double> out;
  for (int b = 0; b < B; ++b) {
    for (const auto& s : segments) {
      const auto at = v.begin() + (std::size_t(b) * L + std::size_t(s.begin)) * E;
      out.insert(out.end(), at, at + std::size_t(s.steps()) * E);
    }
  }
  return out;
}

/// The rank whose final state is the sequence's: the last whose last
/// segment ends at the sequence's end.
inline int final_rank(const kdnn::cp::SequenceLayout& layout) {
  int last = 0;
  for (int r = 0; r < layout.ranks(); ++r) {
    const auto& list = layout.segments(r);
    if (list.back().end == layout.length()) last = r;
  }
  return last;
}

}  // namespace kdnn_test
