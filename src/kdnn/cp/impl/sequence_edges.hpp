// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The sequence ids at the edges of every rank's steps, for packed sequences
// split across ranks (seq_idx [B, L_r] on each rank): each rank's first id
// and its last `tail` ids per batch entry, gathered on every rank. From them
// a rank knows the ids of the steps before its first one (the conv's halo)
// and whether its first step starts a sequence (the SSD's state reset).
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/tensor.hpp"
#include "kdnn/cp/impl/mpi_memory.hpp"

namespace kdnn::cp::impl {

/// This rank's edges on the host, [b][first id, then the last `tail` ids]
/// (0 where the rank holds fewer steps).
template <class ExecSpace>
Kokkos::View<int*, Kokkos::HostSpace> pack_sequence_edges(
    const ExecSpace& space, const Matrix<const int, ExecSpace>& seq_idx, int tail) {
  const int B = int(seq_idx.extent(0)), width = 1 + tail, L = int(seq_idx.extent(1));
  Kokkos::View<int*, typename ExecSpace::memory_space> packed("kdnn::cp::sequence_edges",
                                                              std::size_t(B) * width);
  if (L > 0 && B > 0) {
    Kokkos::parallel_for(
        "kdnn::cp::pack_sequence_edges",
        Kokkos::RangePolicy<ExecSpace>(space, 0, std::size_t(B) * width),
        KOKKOS_LAMBDA(std::size_t i) {
          const int b = int(i / width), j = int(i % width);
          const int s = j == 0 ? 0 : L - tail + j - 1;  // the first step, then the tail
          packed(i) = s >= 0 ? seq_idx(b, s) : 0;
        });
  }
  space.fence();
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), packed);
}

class SequenceEdges {
 public:
  /// Throws (inside agree(), so on every rank) when a rank's edges, B·(1 +
  /// tail) ids, do not fit one MPI count.
  template <class SeqIdx>
  static void check_size(const char* op, const SeqIdx& seq_idx, int tail) {
    const std::size_t B = seq_idx.extent(0);
    if (B * std::size_t(1 + tail) > std::size_t(INT_MAX)) {
      fail(op, ": seq_idx has B=", B, " batch entries, expected B·", 1 + tail,
           " (the sequence ids at a rank's edges) <= 2^31 - 1");
    }
  }

  /// Collective over `comm`; `lock` (the caller's, on `space`) is released
  /// while the ranks exchange. `offsets`: the split's step offsets (R + 1).
  template <class ExecSpace>
  SequenceEdges(const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock,
                const Matrix<const int, ExecSpace>& seq_idx, std::vector<std::int64_t> offsets,
                int tail)
      : B_(int(seq_idx.extent(0))), tail_(tail), offsets_(std::move(offsets)) {
    const auto mine = pack_sequence_edges(space, seq_idx, tail);
    int ranks = 1;
    MPI_Comm_size(comm, &ranks);
    const int count = B_ * (1 + tail);
    ids_.resize(std::size_t(count) * ranks);
    lock.released_while([&] {
      MPI_Allgather(mine.data(), count, mpi_type<int>(), ids_.data(), count, mpi_type<int>(), comm);
    });
  }

  /// The id of step p (global index) in batch entry b: p must be among the
  /// last `tail` steps of the rank that holds it, or before the sequence (p
  /// < 0: the first step's id, which the initial state continues). 0 when
  /// no rank holds a step.
  int id(int b, std::int64_t p) const {
    const std::int64_t total = offsets_.back();
    if (total == 0) return 0;
    if (p < 0) return at(holder(0), b, 0);
    const int q = holder(p);
    const std::int64_t from_end = offsets_[q + 1] - 1 - p;  // < tail
    return at(q, b, int(1 + tail_ - 1 - from_end));
  }

  /// Whether rank r's first step starts a sequence: r holds steps, a step
  /// precedes them, and that step's id differs from r's first.
  bool starts_sequence(int r, int b) const {
    const std::int64_t begin = offsets_[r];
    return offsets_[r + 1] > begin && begin > 0 && id(b, begin - 1) != at(r, b, 0);
  }

 private:
  /// The rank that holds step p (0 ≤ p < the total): the last whose offset
  /// is at most p (a rank with no steps shares its offset with the next).
  int holder(std::int64_t p) const {
    return int(std::upper_bound(offsets_.begin(), offsets_.end(), p) - offsets_.begin()) - 1;
  }
  int at(int r, int b, int j) const { return ids_[(std::size_t(r) * B_ + b) * (1 + tail_) + j]; }

  int B_, tail_;
  std::vector<std::int64_t> offsets_;
  std::vector<int> ids_;  ///< [rank][b][first id, then the last `tail` ids]
};

}  // namespace kdnn::cp::impl
