// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// cp::agree (kdnn/cp/agree.hpp) with the caller's hold on an execution
// space: the checks run while it is held, the ranks' exchange while it is
// released (a thread waiting for the other ranks must not keep this rank's
// other threads off the space), and it is held again on return, with or
// without an error; the error is the lowest failing rank's, on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "expect_error.hpp"
#include "kdnn/core/error.hpp"
#include "kdnn/cp/agree.hpp"
#include "rank_splits.hpp"

namespace {

using namespace kdnn_test;

/// A stand-in for the space lock that records when it is held.
struct RecordingLock {
  bool held = true;
  int releases = 0;
  bool exchanged_released = false;  ///< the exchange ran inside a release

  template <class Wait>
  void released_while(const Wait& wait) {
    held = false;
    ++releases;
    wait();
    exchanged_released = true;
    held = true;
  }
};

TEST(CpAgree, ChecksRunHeldAndTheExchangeReleased) {
  RecordingLock lock;
  bool held_in_checks = false;
  kdnn::cp::agree(MPI_COMM_WORLD, lock, [&] { held_in_checks = lock.held; });
  EXPECT_TRUE(held_in_checks);
  EXPECT_EQ(lock.releases, 1);
  EXPECT_TRUE(lock.exchanged_released);
  EXPECT_TRUE(lock.held);
}

TEST(CpAgree, OneRanksFailureIsEveryRanksWithTheLockHeldAgain) {
  const int R = comm_size(), rank = comm_rank();
  RecordingLock lock;
  const std::string error = error_of([&] {
    kdnn::cp::agree(MPI_COMM_WORLD, lock, [&] {
      if (rank >= R / 2) kdnn::fail("x has extent(0)=", rank, ", expected 1");
    });
  });
  EXPECT_EQ(error, "x has extent(0)=" + std::to_string(R / 2) + ", expected 1 (on rank " +
                       std::to_string(R / 2) + " of " + std::to_string(R) + ")");
  EXPECT_EQ(lock.releases, 1);
  EXPECT_TRUE(lock.held);
}

}  // namespace
