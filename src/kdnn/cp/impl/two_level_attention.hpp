// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The two-level form of context-parallel attention (all_to_all_ring;
// cp/attention.hpp) over a grid of R = R_h × R_s ranks: the caller's
// heads_comm splits the ranks into groups of R_h. Inside a group, one
// all-to-all (ulysses_attention.hpp) gives each member its heads of all the
// group's steps (the members' steps one after another); across the groups,
// the members with the same heads form a ring (ring_attention*.hpp) whose
// layout gives each group the segments of its members, in that order. A
// rank sends its ring R_s − 1 blocks of B·Hkv_r·L_group·(D + Dv) values,
// with Hkv_r its K/V heads, and its group an all-to-all each way.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <utility>
#include <vector>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/cp/exchange_stats.hpp"
#include "kdnn/cp/impl/ring_attention.hpp"
#include "kdnn/cp/impl/ring_attention_backward.hpp"
#include "kdnn/cp/impl/ulysses_attention.hpp"
#include "kdnn/cp/sequence_layout.hpp"

namespace kdnn::cp::impl {

/// The grid of one call: this rank's group (heads_comm) and ring, and the
/// layouts of each.
struct RankGrid {
  MPI_Comm ring = MPI_COMM_NULL;
  int group_rank = 0, ring_rank = 0;
  SequenceLayout group;  ///< the group's steps, member after member
  SequenceLayout rings;  ///< each group's members' segments, over the ring

  RankGrid(MPI_Comm comm, MPI_Comm heads_comm, const SequenceLayout& layout) {
    int rank = 0, members = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_rank(heads_comm, &group_rank);
    MPI_Comm_size(heads_comm, &members);
    MPI_Comm_split(comm, group_rank, rank, &ring);
    MPI_Comm_rank(ring, &ring_rank);
    int groups = 0;
    MPI_Comm_size(ring, &groups);
    std::vector<int> in_group(static_cast<std::size_t>(members), 0),
        all(static_cast<std::size_t>(members * groups), 0);
    MPI_Allgather(&rank, 1, MPI_INT, in_group.data(), 1, MPI_INT, heads_comm);
    MPI_Allgather(in_group.data(), members, MPI_INT, all.data(), members, MPI_INT, ring);
    std::vector<std::int64_t> lengths;
    for (int m : in_group) lengths.push_back(layout.local_steps(m));
    group = SequenceLayout::contiguous(lengths);
    std::vector<std::vector<Segment>> per_group(static_cast<std::size_t>(groups));
    for (int g = 0; g < groups; ++g) {
      for (int m = 0; m < members; ++m) {
        const auto& s = layout.segments(all[std::size_t(g) * members + std::size_t(m)]);
        per_group[std::size_t(g)].insert(per_group[std::size_t(g)].end(), s.begin(), s.end());
      }
    }
    rings = SequenceLayout(std::move(per_group));
  }
  ~RankGrid() { MPI_Comm_free(&ring); }
  RankGrid(const RankGrid&) = delete;
  RankGrid& operator=(const RankGrid&) = delete;
};

/// The two-level forward on checked arguments (agreed on every rank).
template <class ExecSpace, class T>
ExchangeStats two_level_forward(const ExecSpace& space, MPI_Comm comm, MPI_Comm heads_comm,
                                kdnn::impl::SpaceLock& lock, const SequenceLayout& layout,
                                const Packing& packing,
                                const attention::FusedAttentionForward<T, ExecSpace>& a,
                                const attention::FusedAttentionOptions& opts) {
  const RankGrid grid(comm, heads_comm, layout);
  return scattered_heads_forward(space, heads_comm, lock, grid.group, grid.group_rank, a,
                                 [&](const attention::FusedAttentionForward<T, ExecSpace>& run) {
                                   return ring_forward(space, grid.ring, lock, grid.rings, packing,
                                                       grid.ring_rank, run, opts);
                                 });
}

/// The two-level backward on checked arguments (agreed on every rank).
template <class ExecSpace, class T>
ExchangeStats two_level_backward(const ExecSpace& space, MPI_Comm comm, MPI_Comm heads_comm,
                                 kdnn::impl::SpaceLock& lock, const SequenceLayout& layout,
                                 const Packing& packing,
                                 const attention::FusedAttentionBackward<T, ExecSpace>& a,
                                 const attention::FusedAttentionOptions& opts) {
  const RankGrid grid(comm, heads_comm, layout);
  return scattered_heads_backward(space, heads_comm, lock, grid.group, grid.group_rank, a,
                                  [&](const attention::FusedAttentionBackward<T, ExecSpace>& run) {
                                    return ring_backward(space, grid.ring, lock, grid.rings,
                                                         packing, grid.ring_rank, run, opts);
                                  });
}

}  // namespace kdnn::cp::impl
