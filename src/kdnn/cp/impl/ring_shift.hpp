// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::cp::impl::shift_in_place: one step of a ring in a single buffer.
// Every rank sends the first `out` values of its buffer to the rank on its
// right and receives its left's `in` values in their place. Sending a buffer
// while receiving into it would need a second one of the same size; instead
// the values go a chunk at a time: chunk c is copied to a small staging
// buffer and sent from there, and the left's chunk c is received straight
// into the place it leaves. Every rank posts both messages of a chunk before
// it waits, so the ring cannot deadlock; the memory it costs is one chunk.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/cp/exchange_stats.hpp"
#include "kdnn/cp/impl/mpi_memory.hpp"
#include "kdnn/cp/impl/timed_wait.hpp"

namespace kdnn::cp::impl {

/// buf's first `out` values go to `right`; the `in` values of `left`'s
/// buffer take their place (buf holds at least `in`), through `stage`
/// (whose size is the chunk). The lock (held, on `space`) is released while
/// the ranks wait. Collective over the ring: every rank calls it.
template <class ExecSpace, class T>
ExchangeStats shift_in_place(const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock,
                             int left, int right, int tag, const MpiBuffer<T, ExecSpace>& buf,
                             std::size_t out, std::size_t in,
                             const MpiBuffer<T, ExecSpace>& stage) {
  const std::size_t chunk = stage.device.extent(0);
  const std::size_t chunks = (std::max(out, in) + chunk - 1) / chunk;
  ExchangeStats stats;
  buf.to_mpi(space);
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t at = c * chunk;
    const std::size_t n_out = out > at ? std::min(chunk, out - at) : 0;
    const std::size_t n_in = in > at ? std::min(chunk, in - at) : 0;
    std::vector<MPI_Request> requests;
    if (n_out > 0) {  // this chunk to the stage, so that its place can be received into
      if (buf.staged) {
        std::copy_n(buf.host.data() + at, n_out, stage.host.data());
      } else {
        using Range = std::pair<std::size_t, std::size_t>;
        Kokkos::deep_copy(space, Kokkos::subview(stage.device, Range(0, n_out)),
                          Kokkos::subview(buf.device, Range(at, at + n_out)));
        space.fence();
      }
    }
    if (n_in > 0) {
      requests.emplace_back();
      MPI_Irecv(buf.mpi_data() + at, int(n_in), mpi_type<T>(), left, tag, comm, &requests.back());
      stats.bytes_received += std::int64_t(n_in * sizeof(T)), ++stats.messages_received;
    }
    if (n_out > 0) {
      requests.emplace_back();
      MPI_Isend(stage.mpi_data(), int(n_out), mpi_type<T>(), right, tag, comm, &requests.back());
      stats.bytes_sent += std::int64_t(n_out * sizeof(T)), ++stats.messages_sent;
    }
    ExchangeStats step;
    timed_wait(space, requests, MPI_Wtime(), lock, step);
    stats.waited_seconds += step.waited_seconds;
  }
  buf.from_mpi(space);
  return stats;
}

}  // namespace kdnn::cp::impl
