// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::cp::SequenceLayout: which steps of a global sequence of S steps each
// rank of a context-parallel group holds, as a list of segments per rank.
// A rank's local tensors hold its segments one after another, in the order
// of its list (local step 0 is the first segment's first step). Every
// kdnn::cp operator takes the same layout, so that a model keeps one layout
// through its attention, conv and SSD layers, with no re-permutation.
//
// Two layouts are built in:
//  * contiguous(lengths): rank r holds one segment, the steps
//    [Σ_{q<r} lengths[q], Σ_{q≤r} lengths[q]): any lengths, zero included.
//  * load_balanced(S, R): the sequence cut in 2R chunks, rank r holding
//    chunks r and 2R−1−r (in that order), so that under a causal mask every
//    rank has the same amount of work (the layout of TransformerEngine's and
//    Megatron's context parallelism). Any S: chunk c has ⌊S/2R⌋ steps, and
//    one more when c < S mod 2R, so that two ranks' chunks differ by at most
//    one step each.
// A layout made any other way (SequenceLayout(segments)) must cover [0, S)
// exactly once, and give each rank at least one segment; segments may be
// empty (an empty segment [p, p) places a rank: its conv halo and final
// state are the steps before p).
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/fingerprint.hpp"

namespace kdnn::cp {

/// Global steps [begin, end).
struct Segment {
  std::int64_t begin = 0, end = 0;
  std::int64_t steps() const { return end - begin; }
  bool operator==(const Segment& o) const { return begin == o.begin && end == o.end; }
};

/// Where a run of a rank's local steps lies in the global sequence.
struct Placement {
  int rank = 0;
  std::int64_t local = 0;  ///< the run's first local step on `rank`
  Segment global;          ///< the run's global steps
  int segment = 0;         ///< the index of its segment in `rank`'s list
};

class SequenceLayout {
 public:
  /// R = 1: the whole sequence of 0 steps on one rank.
  SequenceLayout() : SequenceLayout(std::vector<std::vector<Segment>>{{Segment{}}}) {}

  /// The segments of each rank (ranks ≥ 1), which together must cover
  /// [0, S) exactly once; a kdnn::Error names the first gap or overlap.
  explicit SequenceLayout(std::vector<std::vector<Segment>> per_rank)
      : per_rank_(std::move(per_rank)) {
    validate();
  }

  static SequenceLayout contiguous(const std::vector<std::int64_t>& lengths) {
    const char* op = "cp::SequenceLayout::contiguous";
    if (lengths.empty()) fail(op, ": lengths is empty, expected one length per rank");
    std::vector<std::vector<Segment>> per_rank(lengths.size());
    std::int64_t at = 0;
    for (std::size_t r = 0; r < lengths.size(); ++r) {
      if (lengths[r] < 0) fail(op, ": lengths[", r, "]=", lengths[r], ", expected >= 0");
      per_rank[r] = {{at, at + lengths[r]}};
      at += lengths[r];
    }
    return SequenceLayout(std::move(per_rank));
  }

  static SequenceLayout load_balanced(std::int64_t S, int ranks) {
    const char* op = "cp::SequenceLayout::load_balanced";
    if (S < 0) fail(op, ": S=", S, ", expected >= 0");
    if (ranks < 1) fail(op, ": ranks=", ranks, ", expected >= 1");
    const std::int64_t chunks = 2 * std::int64_t(ranks), base = S / chunks, extra = S % chunks;
    std::vector<Segment> chunk(static_cast<std::size_t>(chunks));
    std::int64_t at = 0;
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t n = base + (c < extra ? 1 : 0);
      chunk[std::size_t(c)] = {at, at + n};
      at += n;
    }
    std::vector<std::vector<Segment>> per_rank(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      per_rank[std::size_t(r)] = {chunk[std::size_t(r)], chunk[std::size_t(chunks - 1 - r)]};
    }
    return SequenceLayout(std::move(per_rank));
  }

  int ranks() const { return int(per_rank_.size()); }
  std::int64_t length() const { return length_; }  ///< S
  /// Rank r's segments, in the order its local tensors hold them.
  const std::vector<Segment>& segments(int r) const { return per_rank_.at(std::size_t(r)); }
  /// The number of segments of all the ranks.
  std::size_t segment_count() const {
    std::size_t n = 0;
    for (const auto& list : per_rank_) n += list.size();
    return n;
  }
  /// The number of steps rank r holds.
  std::int64_t local_steps(int r) const {
    std::int64_t n = 0;
    for (const Segment& s : segments(r)) n += s.steps();
    return n;
  }
  /// Whether the ranks' segments, read rank after rank and each rank's in
  /// its order, are the sequence in order (the split of cp::HaloPlan and of
  /// the calls without a layout).
  bool is_contiguous() const {
    std::int64_t at = 0;
    for (const auto& list : per_rank_) {
      std::int64_t n = 0;
      for (const Segment& s : list) {
        if (s.steps() > 0 && s.begin != at + n) return false;
        n += s.steps();
      }
      at += n;
    }
    return true;
  }
  /// Every non-empty run of local steps with its rank, in global order:
  /// the sequence read from its start.
  const std::vector<Placement>& in_sequence_order() const { return order_; }
  /// The run that holds global step p (0 ≤ p < S).
  const Placement& holding(std::int64_t p) const {
    const auto after = std::upper_bound(
        order_.begin(), order_.end(), p,
        [](std::int64_t step, const Placement& run) { return step < run.global.begin; });
    return *(after - 1);
  }
  /// The runs of local steps that hold global steps [begin, end), in global
  /// order (each clipped to the range).
  std::vector<Placement> find(std::int64_t begin, std::int64_t end) const {
    std::vector<Placement> out;
    for (const Placement& p : order_) {
      const std::int64_t b = std::max(begin, p.global.begin), e = std::min(end, p.global.end);
      if (b < e) out.push_back({p.rank, p.local + (b - p.global.begin), {b, e}, p.segment});
    }
    return out;
  }

  /// A 64-bit hash of every rank's segments (chained through the mix of
  /// core/impl/fingerprint.hpp), for checking that the ranks of a call were
  /// given the same layout without sending it.
  std::int64_t fingerprint() const {
    std::uint64_t h = kdnn::impl::mix64(std::uint64_t(ranks()));
    const auto mix = [&h](std::int64_t v) { h = kdnn::impl::mix64(h + std::uint64_t(v) + 1); };
    for (const auto& list : per_rank_) {
      mix(std::int64_t(list.size()));
      for (const Segment& s : list) mix(s.begin), mix(s.end);
    }
    return std::int64_t(h);
  }

  bool operator==(const SequenceLayout& o) const { return per_rank_ == o.per_rank_; }
  bool operator!=(const SequenceLayout& o) const { return !(*this == o); }

 private:
  void validate() {
    const char* op = "cp::SequenceLayout";
    if (per_rank_.empty()) fail(op, ": no ranks, expected at least one");
    order_.clear();
    for (std::size_t r = 0; r < per_rank_.size(); ++r) {
      if (per_rank_[r].empty()) {
        fail(op, ": rank ", r, " has no segments, expected at least one (an empty segment [p, p) ",
             "places a rank that holds no steps)");
      }
      std::int64_t local = 0;
      for (std::size_t i = 0; i < per_rank_[r].size(); ++i) {
        const Segment& s = per_rank_[r][i];
        if (s.begin < 0 || s.end < s.begin) {
          fail(op, ": rank ", r, "'s segment ", i, " is [", s.begin, ", ", s.end,
               "), expected 0 <= begin <= end");
        }
        if (s.steps() > 0) order_.push_back({int(r), local, s, int(i)});
        local += s.steps();
      }
    }
    std::sort(order_.begin(), order_.end(), [](const Placement& a, const Placement& b) {
      return a.global.begin < b.global.begin;
    });
    length_ = 0;
    for (const Placement& p : order_) {
      if (p.global.begin < length_) {
        fail(op, ": steps [", p.global.begin, ", ", std::min(length_, p.global.end),
             ") are held twice (again in rank ", p.rank, "'s segment [", p.global.begin, ", ",
             p.global.end, "))");
      }
      if (p.global.begin > length_) {
        fail(op, ": no rank holds steps [", length_, ", ", p.global.begin, ")");
      }
      length_ = p.global.end;
    }
    for (std::size_t r = 0; r < per_rank_.size(); ++r) {
      for (std::size_t i = 0; i < per_rank_[r].size(); ++i) {
        const Segment& s = per_rank_[r][i];
        if (s.end > length_) {
          fail(op, ": rank ", r, "'s segment ", i, " is [", s.begin, ", ", s.end,
               "), beyond the sequence's ", length_, " steps");
        }
      }
    }
  }

  std::vector<std::vector<Segment>> per_rank_;
  std::vector<Placement> order_;
  std::int64_t length_ = 0;
};

}  // namespace kdnn::cp
