// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Which heads a rank computes when context-parallel attention scatters the
// heads (all_to_all, cp/attention.hpp), and how a range of query heads maps
// onto single-rank fused calls. H query heads are dealt out as evenly as
// possible (⌈H/R⌉ to the first H mod R ranks, ⌊H/R⌋ to the others; a rank
// may get none when H < R). Query head h reads K/V head h / g (g = H/Hkv),
// so a rank takes every K/V head its query heads read: a K/V head whose
// group the split cuts goes to two ranks (Hkv < R always cuts), and their
// gradients are summed back.
#include <algorithm>
#include <utility>
#include <vector>

namespace kdnn::cp::impl {

/// Heads [begin, end).
struct HeadRange {
  int begin = 0, end = 0;
  int count() const { return end - begin; }
  std::pair<int, int> range() const { return {begin, end}; }
  /// The same heads counted from `origin` (a view that starts there).
  std::pair<int, int> from(int origin) const { return {begin - origin, end - origin}; }
};

/// A rank's query heads and the K/V heads they read.
struct HeadSplit {
  HeadRange query, kv;

  static HeadSplit of(int H, int Hkv, int ranks, int rank) {
    const int base = H / ranks, extra = H % ranks;
    HeadSplit s;
    s.query.begin = rank * base + std::min(rank, extra);
    s.query.end = s.query.begin + base + (rank < extra ? 1 : 0);
    const int g = H / Hkv;
    if (s.query.count() > 0) s.kv = {s.query.begin / g, (s.query.end - 1) / g + 1};
    return s;
  }
};

/// Query heads and their K/V heads that one single-rank call takes: the
/// query heads of whole groups, or part of one group with its K/V head.
using HeadRun = HeadSplit;

/// `query`'s heads cut into at most three runs, each one call: a partial
/// group at either end, whole groups between.
inline std::vector<HeadRun> head_runs(const HeadRange& query, int g) {
  std::vector<HeadRun> runs;
  const auto add = [&](int b, int e) {
    if (b < e) runs.push_back({{b, e}, {b / g, (e - 1) / g + 1}});
  };
  if (query.count() == 0) return runs;
  if (query.begin / g == (query.end - 1) / g) {  // inside one group
    add(query.begin, query.end);
    return runs;
  }
  const int first_whole = (query.begin + g - 1) / g * g, last_whole = query.end / g * g;
  add(query.begin, first_whole);
  add(first_whole, last_whole);
  add(last_whole, query.end);
  return runs;
}

}  // namespace kdnn::cp::impl
