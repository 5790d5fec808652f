// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::cp::SequenceLayout (kdnn/cp/sequence_layout.hpp): the contiguous
// layout (any lengths, empty ranks) and the load-balanced one (rank r holds
// chunks r and 2R−1−r of 2R, any S, chunks within one step of each other);
// the sequence read in order across the ranks' segments, a range of steps
// found on the ranks that hold it; a layout that misses or repeats a step
// refused with the steps named. Local logic: every rank of the mpiexec run
// checks the same.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "expect_error.hpp"
#include "kdnn/cp/sequence_layout.hpp"

namespace {

using kdnn::cp::Placement;
using kdnn::cp::Segment;
using kdnn::cp::SequenceLayout;

/// Global step → (rank, local step), by walking every rank's segments.
struct Owner {
  int rank;
  std::int64_t local;
};
std::vector<Owner> owners(const SequenceLayout& layout) {
  std::vector<Owner> out(std::size_t(layout.length()), Owner{-1, -1});
  for (int r = 0; r < layout.ranks(); ++r) {
    std::int64_t local = 0;
    for (const Segment& s : layout.segments(r)) {
      for (std::int64_t t = s.begin; t < s.end; ++t) out[std::size_t(t)] = {r, local++};
    }
  }
  return out;
}

/// find(begin, end) lists exactly the owners of [begin, end), in order.
void expect_find_matches_owners(const SequenceLayout& layout) {
  const auto own = owners(layout);
  for (std::int64_t b = 0; b <= layout.length(); ++b) {
    for (std::int64_t e = b; e <= layout.length(); ++e) {
      std::int64_t next = b;
      for (const Placement& p : layout.find(b, e)) {
        ASSERT_EQ(p.global.begin, next) << "find(" << b << ", " << e << ")";
        ASSERT_GT(p.global.end, p.global.begin);
        for (std::int64_t t = p.global.begin; t < p.global.end; ++t) {
          ASSERT_EQ(own[std::size_t(t)].rank, p.rank) << "step " << t;
          ASSERT_EQ(own[std::size_t(t)].local, p.local + (t - p.global.begin)) << "step " << t;
        }
        next = p.global.end;
      }
      ASSERT_EQ(next, e) << "find(" << b << ", " << e << ")";
    }
  }
}

TEST(CpSequenceLayout, ContiguousHoldsTheLengthsInRankOrder) {
  const auto layout = SequenceLayout::contiguous({3, 0, 5, 1});
  EXPECT_EQ(layout.ranks(), 4);
  EXPECT_EQ(layout.length(), 9);
  EXPECT_TRUE(layout.is_contiguous());
  EXPECT_EQ(layout.segments(0), (std::vector<Segment>{{0, 3}}));
  EXPECT_EQ(layout.segments(1), (std::vector<Segment>{{3, 3}}));
  EXPECT_EQ(layout.segments(2), (std::vector<Segment>{{3, 8}}));
  EXPECT_EQ(layout.local_steps(1), 0);
  EXPECT_EQ(layout.local_steps(2), 5);
  const auto& order = layout.in_sequence_order();  // the empty rank has no run
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[1].rank, 2);
  EXPECT_EQ(order[2].global, (Segment{8, 9}));
  expect_find_matches_owners(layout);
}

TEST(CpSequenceLayout, LoadBalancedGivesRankRChunksRAndTwoRMinusOneMinusR) {
  const auto layout = SequenceLayout::load_balanced(16, 4);
  EXPECT_EQ(layout.length(), 16);
  EXPECT_EQ(layout.segments(0), (std::vector<Segment>{{0, 2}, {14, 16}}));
  EXPECT_EQ(layout.segments(1), (std::vector<Segment>{{2, 4}, {12, 14}}));
  EXPECT_EQ(layout.segments(3), (std::vector<Segment>{{6, 8}, {8, 10}}));
  EXPECT_FALSE(layout.is_contiguous());
  // Rank 3's two chunks are adjacent: one run each in sequence order.
  const auto found = layout.find(5, 11);
  ASSERT_EQ(found.size(), 4u);
  EXPECT_EQ(found[0].rank, 2);
  EXPECT_EQ(found[0].local, 1);
  EXPECT_EQ(found[1].rank, 3);
  EXPECT_EQ(found[2].rank, 3);
  EXPECT_EQ(found[2].local, 2);
  EXPECT_EQ(found[3].rank, 2);
  EXPECT_EQ(found[3].global, (Segment{10, 11}));
  // One rank: its two halves, in order, are the whole sequence.
  EXPECT_TRUE(SequenceLayout::load_balanced(7, 1).is_contiguous());
}

TEST(CpSequenceLayout, LoadBalancedTakesAnyLengthWithChunksWithinOneStep) {
  for (int R = 1; R <= 5; ++R) {
    for (std::int64_t S = 0; S <= 4 * R + 3; ++S) {
      SCOPED_TRACE(::testing::Message() << "S=" << S << " R=" << R);
      const auto layout = SequenceLayout::load_balanced(S, R);
      ASSERT_EQ(layout.length(), S);
      ASSERT_EQ(layout.ranks(), R);
      const std::int64_t q = S / (2 * R);
      std::int64_t least = S, most = 0;
      for (int r = 0; r < R; ++r) {
        ASSERT_EQ(layout.segments(r).size(), 2u);
        for (const Segment& s : layout.segments(r)) {
          EXPECT_TRUE(s.steps() == q || s.steps() == q + 1) << s.steps();
        }
        least = std::min(least, layout.local_steps(r));
        most = std::max(most, layout.local_steps(r));
      }
      EXPECT_LE(most - least, 2);
      expect_find_matches_owners(layout);
    }
  }
}

TEST(CpSequenceLayout, ALayoutThatMissesOrRepeatsAStepIsRefused) {
  using Lists = std::vector<std::vector<Segment>>;
  EXPECT_KDNN_ERROR(SequenceLayout(Lists{{{0, 3}}, {{4, 6}}}), "no rank holds steps [3, 4)");
  EXPECT_KDNN_ERROR(SequenceLayout(Lists{{{0, 3}}, {{2, 6}}}),
                    "steps [2, 3) are held twice (again in rank 1's segment [2, 6))");
  EXPECT_KDNN_ERROR(SequenceLayout(Lists{{{1, 3}}}), "no rank holds steps [0, 1)");
  EXPECT_KDNN_ERROR(SequenceLayout(Lists{{{0, 3}, {5, 4}}}),
                    "rank 0's segment 1 is [5, 4), expected 0 <= begin <= end");
  EXPECT_KDNN_ERROR(SequenceLayout(Lists{}), "no ranks");
  EXPECT_KDNN_ERROR(SequenceLayout(Lists{{{0, 3}}, {}}),
                    "rank 1 has no segments, expected at least one");
  EXPECT_KDNN_ERROR(SequenceLayout(Lists{{{0, 3}}, {{5, 5}}}),
                    "rank 1's segment 0 is [5, 5), beyond the sequence's 3 steps");
  EXPECT_KDNN_ERROR(SequenceLayout::contiguous({2, -1}), "lengths[1]=-1, expected >= 0");
  EXPECT_KDNN_ERROR(SequenceLayout::contiguous({}), "lengths is empty");
  EXPECT_KDNN_ERROR(SequenceLayout::load_balanced(-1, 2), "S=-1, expected >= 0");
  EXPECT_KDNN_ERROR(SequenceLayout::load_balanced(8, 0), "ranks=0, expected >= 1");
  // Given in another order, the segments still make a layout.
  const SequenceLayout shuffled(Lists{{{4, 6}, {0, 1}}, {{1, 4}}});
  EXPECT_EQ(shuffled.length(), 6);
  EXPECT_FALSE(shuffled.is_contiguous());
  expect_find_matches_owners(shuffled);
}

}  // namespace
