// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// How many blocking collectives this process has called, counted through
// MPI's profiling interface: collective_counts.cpp defines MPI_Allgather,
// MPI_Allreduce and MPI_Bcast, which count and call PMPI_*. Linked into the
// context-parallel tests only.
#pragma once

namespace kdnn_test {

struct CollectiveCounts {
  long allgather = 0, allreduce = 0, bcast = 0;
  CollectiveCounts operator-(const CollectiveCounts& o) const {
    return {allgather - o.allgather, allreduce - o.allreduce, bcast - o.bcast};
  }
};

/// The counts so far (this process, every thread).
CollectiveCounts collective_counts();

}  // namespace kdnn_test
