// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The sequence ids at the edges of every segment of a SequenceLayout, for
// packed sequences split across ranks (seq_idx [B, L_r] on each rank, its
// segments one after another): each segment's first id and its last `tail`
// ids per batch entry, gathered on every rank. From them a rank knows the
// ids of the steps before each of its segments (the conv's halo) and
// whether a segment's first step starts a sequence (the SSD's state reset).
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <climits>
#include <cstdint>
#include <vector>

#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/tensor.hpp"
#include "kdnn/cp/impl/mpi_memory.hpp"
#include "kdnn/cp/sequence_layout.hpp"

namespace kdnn::cp::impl {

/// This rank's edges on the host, [segment][b][first id, then the last
/// `tail` ids] (0 where the segment holds fewer steps).
template <class ExecSpace>
Kokkos::View<int*, Kokkos::HostSpace> pack_sequence_edges(
    const ExecSpace& space, const Matrix<const int, ExecSpace>& seq_idx,
    const std::vector<Segment>& segments, int tail) {
  const int B = int(seq_idx.extent(0)), width = 1 + tail;
  const std::size_t per_segment = std::size_t(B) * width;
  Kokkos::View<int*, typename ExecSpace::memory_space> packed("kdnn::cp::sequence_edges",
                                                              per_segment * segments.size());
  int first = 0;  // the segment's first local step
  for (std::size_t k = 0; k < segments.size(); ++k) {
    const int n = int(segments[k].steps()), at = first;
    first += n;
    if (n == 0 || B == 0) continue;
    const std::size_t out = k * per_segment;
    Kokkos::parallel_for(
        "kdnn::cp::pack_sequence_edges", Kokkos::RangePolicy<ExecSpace>(space, 0, per_segment),
        KOKKOS_LAMBDA(std::size_t i) {
          const int b = int(i / width), j = int(i % width);
          const int s = j == 0 ? 0 : n - tail + j - 1;  // the first step, then the tail
          packed(out + i) = s >= 0 ? seq_idx(b, at + s) : 0;
        });
  }
  space.fence();
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), packed);
}

class SequenceEdges {
 public:
  /// Throws (inside agree(), so on every rank) when the edges of all the
  /// layout's `segments`, B·(1 + tail) ids each, do not fit one MPI count.
  template <class SeqIdx>
  static void check_size(const char* op, const SeqIdx& seq_idx, int tail, std::size_t segments) {
    const std::size_t B = seq_idx.extent(0);
    if (B * std::size_t(1 + tail) * segments > std::size_t(INT_MAX)) {
      fail(op, ": seq_idx has B=", B, " batch entries, expected B·", 1 + tail, "·", segments,
           " (the sequence ids at the edges of the layout's segments) <= 2^31 - 1");
    }
  }

  /// Collective over `comm`; `lock` (the caller's, on `space`) is released
  /// while the ranks exchange.
  template <class ExecSpace>
  SequenceEdges(const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock,
                const Matrix<const int, ExecSpace>& seq_idx, const SequenceLayout& layout, int rank,
                int tail)
      : B_(int(seq_idx.extent(0))), tail_(tail), layout_(layout) {
    const auto mine = pack_sequence_edges(space, seq_idx, layout.segments(rank), tail);
    const int per_segment = B_ * (1 + tail);
    std::vector<int> counts(std::size_t(layout.ranks())), displs(counts.size());
    int at = 0, slot = 0;
    for (int r = 0; r < layout.ranks(); ++r) {
      const int segments = int(layout.segments(r).size());
      first_slot_.push_back(slot);
      slot += segments;
      counts[std::size_t(r)] = segments * per_segment;
      displs[std::size_t(r)] = at;
      at += counts[std::size_t(r)];
    }
    ids_.resize(std::size_t(at));
    lock.released_while([&] {
      MPI_Allgatherv(mine.data(), counts[std::size_t(rank)], mpi_type<int>(), ids_.data(),
                     counts.data(), displs.data(), mpi_type<int>(), comm);
    });
  }

  /// The id of step p (global index) in batch entry b: p must be among the
  /// last `tail` steps of the segment that holds it, or before the sequence
  /// (p < 0: step 0's id, which the initial state continues). 0 when no rank
  /// holds a step.
  int id(int b, std::int64_t p) const {
    if (layout_.length() == 0) return 0;
    if (p < 0) {
      const Placement& run = layout_.holding(0);
      return at(run.rank, run.segment, b, 0);
    }
    const Placement& run = layout_.holding(p);
    const std::int64_t from_end = run.global.end - 1 - p;  // < tail
    return at(run.rank, run.segment, b, int(tail_ - from_end));
  }

  /// Whether segment s of rank r starts a sequence: it holds steps, a step
  /// precedes them, and that step's id differs from its first.
  bool starts_sequence(int r, int s, int b) const {
    const Segment& seg = layout_.segments(r)[std::size_t(s)];
    return seg.steps() > 0 && seg.begin > 0 && id(b, seg.begin - 1) != at(r, s, b, 0);
  }

 private:
  int at(int r, int s, int b, int j) const {
    const std::size_t slot = std::size_t(first_slot_[std::size_t(r)]) + std::size_t(s);
    return ids_[(slot * B_ + b) * (1 + tail_) + j];
  }

  int B_, tail_;
  SequenceLayout layout_;
  std::vector<int> first_slot_;  ///< each rank's first segment's slot
  std::vector<int> ids_;         ///< [slot][b][first id, then the last `tail` ids]
};

}  // namespace kdnn::cp::impl
