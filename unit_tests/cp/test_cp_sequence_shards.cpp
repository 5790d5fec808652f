// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// kdnn::cp::shard and gather (kdnn/cp/sequence_shards.hpp), run by ctest
// under mpiexec at 1, 2, 3 and 4 ranks: shard gives each rank exactly its
// segments' steps, in its order, for the contiguous layout (uneven, an
// empty rank) and the load-balanced one (S not a multiple of 2R), for
// tensors of rank 2, 3 and 4 and a strided global; gather puts every rank's
// part back in place on every rank; a layout, shape or dtype that differs
// between ranks gives every rank the same error.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "kdnn/cp/sequence_shards.hpp"
#include "rank_splits.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace cp = kdnn::cp;

/// A value that names its element: batch entry b, global step s, element j of the step.
double element_value(std::int64_t b, std::int64_t s, std::int64_t j) {
  return 100000.0 * double(b) + 100.0 * double(s) + double(j);
}

/// The layouts every test runs on: contiguous with uneven lengths (the
/// second rank empty), and load-balanced with S not a multiple of 2R.
std::vector<cp::SequenceLayout> layouts(int P) {
  std::vector<std::int64_t> lengths;
  for (int r = 0; r < P; ++r) lengths.push_back(r == 1 ? 0 : 3 + r);
  return {cp::SequenceLayout::contiguous(lengths), cp::SequenceLayout::load_balanced(4 * P + 3, P),
          cp::SequenceLayout::load_balanced(1, P)};
}

/// The global step of each of rank r's local steps.
std::vector<std::int64_t> global_steps(const cp::SequenceLayout& layout, int r) {
  std::vector<std::int64_t> out;
  for (const cp::Segment& s : layout.segments(r)) {
    for (std::int64_t t = s.begin; t < s.end; ++t) out.push_back(t);
  }
  return out;
}

template <class T>
class CpSequenceShards : public ::testing::Test {};
using ShardTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CpSequenceShards, ShardTypes);

TYPED_TEST(CpSequenceShards, ShardGivesEachRankItsStepsAndGatherPutsThemBack) {
  using T = TypeParam;
  const int P = comm_size(), rank = comm_rank(), B = 2, C = 3, D = 2;
  for (const auto& layout : layouts(P)) {
    const std::int64_t S = layout.length(), L = layout.local_steps(rank);
    SCOPED_TRACE(::testing::Message() << "S=" << S << " L=" << L);
    const auto steps = global_steps(layout, rank);
    // Rank 4: [B, S, C, D]; the step's elements j = c·D + d.
    std::vector<double> values;
    for (int b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < S; ++s)
        for (int j = 0; j < C * D; ++j) values.push_back(element_value(b, s, j));
    const auto global = to_device<T****>(values, B, S, C, D);
    DeviceView<T****> local("local", B, L, C, D);
    cp::shard(Space(), layout, rank, global, local);
    const auto got = to_host(local);
    std::size_t i = 0;
    for (int b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < L; ++t)
        for (int j = 0; j < C * D; ++j, ++i)
          ASSERT_EQ(got[i], element_value(b, steps[std::size_t(t)], j))
              << "b=" << b << " local step " << t << " j=" << j;
    DeviceView<T****> back("back", B, S, C, D);
    cp::gather(Space(), MPI_COMM_WORLD, layout, local, back);
    EXPECT_EQ(to_host(back), to_host(global));
    // Rank 2 ([B, S]) and rank 3 ([B, S, C]) the same way.
    DeviceView<T**> g2("g2", B, S), l2("l2", B, L), b2("b2", B, S);
    Kokkos::deep_copy(g2, Kokkos::subview(global, Kokkos::ALL, Kokkos::ALL, 1, 0));
    cp::shard(Space(), layout, rank, g2, l2);
    cp::gather(Space(), MPI_COMM_WORLD, layout, l2, b2);
    EXPECT_EQ(to_host(b2), to_host(g2));
  }
}

TYPED_TEST(CpSequenceShards, AStridedGlobalIsReadAndWrittenInPlace) {
  using T = TypeParam;
  const int P = comm_size(), rank = comm_rank(), B = 2, C = 3;
  const auto layout = cp::SequenceLayout::load_balanced(4 * P + 1, P);
  const std::int64_t S = layout.length(), L = layout.local_steps(rank);
  // [B, C, S] storage seen as [B, S, C] through its strides.
  std::vector<double> values;
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c)
      for (std::int64_t s = 0; s < S; ++s) values.push_back(element_value(b, s, c));
  const auto storage = to_device<T***>(values, B, C, S);
  using Strided = Kokkos::View<T***, Kokkos::LayoutStride, typename Space::memory_space>;
  const Strided global(storage.data(), Kokkos::LayoutStride(B, C * S, S, 1, C, S));
  DeviceView<T***> local("local", B, L, C);
  cp::shard(Space(), layout, rank, global, local);
  const auto steps = global_steps(layout, rank);
  const auto got = to_host(local);
  for (int b = 0, i = 0; b < B; ++b)
    for (std::int64_t t = 0; t < L; ++t)
      for (int c = 0; c < C; ++c, ++i)
        ASSERT_EQ(got[std::size_t(i)], element_value(b, steps[std::size_t(t)], c));
  const auto out_storage = to_device<T***>(std::vector<double>(values.size(), -1.0), B, C, S);
  const Strided out(out_storage.data(), Kokkos::LayoutStride(B, C * S, S, 1, C, S));
  cp::gather(Space(), MPI_COMM_WORLD, layout, local, out);
  EXPECT_EQ(to_host(out_storage), values);
}

TEST(CpSequenceShards, BadOrMismatchedArgumentsGiveEveryRankTheSameError) {
  const int P = comm_size(), rank = comm_rank(), odd = P - 1, B = 1, C = 2;
  const std::string on_odd = " (on rank " + std::to_string(odd) + " of " + std::to_string(P) + ")";
  const auto layout = cp::SequenceLayout::load_balanced(2 * P + 1, P);
  const std::int64_t S = layout.length(), L = layout.local_steps(rank);
  DeviceView<double***> global("global", B, S, C), local("local", B, L, C);
  DeviceView<double***> longer("longer", B, L + 1, C);
  EXPECT_EQ(error_of([&] {
              cp::gather(Space(), MPI_COMM_WORLD, layout, rank == odd ? longer : local, global);
            }),
            "cp::gather: local has extent(1)=" + std::to_string(layout.local_steps(odd) + 1) +
                ", expected " + std::to_string(layout.local_steps(odd)) +
                " (the steps the layout gives this rank)" + on_odd);
  if (P > 1) {
    const auto other = cp::SequenceLayout::contiguous(std::vector<std::int64_t>(std::size_t(P), 0));
    DeviceView<double***> none("none", B, 0, C), empty("empty", B, 0, C);
    EXPECT_EQ(error_of([&] {
                if (rank == odd) {
                  cp::gather(Space(), MPI_COMM_WORLD, other, none, empty);
                } else {
                  cp::gather(Space(), MPI_COMM_WORLD, layout, local, global);
                }
              }),
              "cp::gather: layout on rank " + std::to_string(odd) +
                  " differs from rank 0's, expected the same values on every rank (a parameter "
                  "of the whole sequence)");
  }
  const auto wrong_ranks = cp::SequenceLayout::load_balanced(S, P + 1);
  DeviceView<double***> part("part", B, wrong_ranks.local_steps(rank), C);
  EXPECT_EQ(error_of([&] { cp::gather(Space(), MPI_COMM_WORLD, wrong_ranks, part, global); }),
            "cp::gather: the layout has " + std::to_string(P + 1) + " ranks, expected " +
                std::to_string(P) + " (the communicator's) (on rank 0 of " + std::to_string(P) +
                ")");
  EXPECT_KDNN_ERROR(
      cp::shard(Space(), layout, P, global, local),
      "cp::shard: rank=" + std::to_string(P) + ", expected 0 <= rank < " + std::to_string(P));
  EXPECT_KDNN_ERROR(cp::shard(Space(), layout, rank, global, longer),
                    "cp::shard: local has extent(1)=" + std::to_string(L + 1));
  // After the errors, the calls work on every rank.
  EXPECT_EQ(error_of([&] { cp::gather(Space(), MPI_COMM_WORLD, layout, local, global); }), "");
}

}  // namespace
