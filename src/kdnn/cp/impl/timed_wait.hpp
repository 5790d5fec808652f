// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::cp::impl::timed_wait: how every exchange of kdnn::cp ends. The
// compute launched while its messages were in flight is fenced first (so
// that the overlap is measured to when that compute finished), then the
// requests are waited for with the space's lock released (another thread may
// launch on the space meanwhile), and the two spans are recorded in the
// call's statistics (HaloStats, StateStats: overlapped_seconds,
// waited_seconds).
#include <mpi.h>

#include <vector>

#include "kdnn/core/impl/space_lock.hpp"

namespace kdnn::cp::impl {

/// Fences `space`, waits for `requests` (posted at MPI_Wtime() `posted`)
/// with `lock` released, and sets stats.overlapped_seconds (posted → the
/// fence's end) and stats.waited_seconds (then → the requests' end).
template <class ExecSpace, class Stats>
void timed_wait(const ExecSpace& space, std::vector<MPI_Request>& requests, double posted,
                kdnn::impl::SpaceLock& lock, Stats& stats) {
  space.fence();  // the compute launched while the messages were in flight
  const double before = MPI_Wtime();
  lock.released_while(
      [&] { MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE); });
  stats.overlapped_seconds = before - posted;
  stats.waited_seconds = MPI_Wtime() - before;
}

}  // namespace kdnn::cp::impl
