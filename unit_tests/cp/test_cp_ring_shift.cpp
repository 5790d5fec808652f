// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// cp::impl::shift_in_place (kdnn/cp/impl/ring_shift.hpp), the ring backward's
// gradient shift: every rank's buffer ends with its left neighbour's values,
// for chunks smaller than, equal to and larger than the messages, message
// lengths that differ from rank to rank, and a rank that sends nothing.
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstddef>
#include <vector>

#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/cp/impl/ring_shift.hpp"
#include "rank_splits.hpp"

namespace {
namespace ring_shift_test {  // one name for this file's helpers (unity builds)

using namespace kdnn_test;
using Space = Kokkos::DefaultExecutionSpace;
namespace impl = kdnn::cp::impl;

/// The values rank r sends: a length that differs by rank (rank 1 sends none).
std::size_t length_of(int r) { return std::vector<std::size_t>{7, 0, 10, 3}[std::size_t(r % 4)]; }

double value_of(int r, std::size_t i) { return 1000.0 * r + double(i); }

TEST(CpRingShift, EveryRankGetsItsLeftNeighboursValues) {
  const int R = comm_size(), rank = comm_rank();
  const int left = (rank + R - 1) % R, right = (rank + 1) % R;
  std::size_t capacity = 0;
  for (int r = 0; r < R; ++r) capacity = std::max(capacity, length_of(r));
  for (const std::size_t chunk :
       {std::size_t(1), std::size_t(3), std::size_t(10), std::size_t(64)}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const Space space;
    const impl::MpiBuffer<double, Space> buf("buf", capacity), stage("stage", chunk);
    const auto host = Kokkos::create_mirror_view(buf.device);
    for (std::size_t i = 0; i < capacity; ++i)
      host(i) = i < length_of(rank) ? value_of(rank, i) : -1;
    Kokkos::deep_copy(buf.device, host);
    kdnn::impl::SpaceLock lock(space);
    const auto stats = impl::shift_in_place(space, MPI_COMM_WORLD, lock, left, right, 7, buf,
                                            length_of(rank), length_of(left), stage);
    space.fence();
    Kokkos::deep_copy(host, buf.device);
    for (std::size_t i = 0; i < length_of(left); ++i) EXPECT_EQ(host(i), value_of(left, i)) << i;
    EXPECT_EQ(stats.bytes_sent, std::int64_t(length_of(rank) * sizeof(double)));
    EXPECT_EQ(stats.bytes_received, std::int64_t(length_of(left) * sizeof(double)));
    EXPECT_EQ(stats.messages_sent, int((length_of(rank) + chunk - 1) / chunk));
  }
}

}  // namespace ring_shift_test
}  // namespace
