// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The work items of a team kernel and where each team's scratch lives.
//
// A team kernel is written per work item (an attention block, an SSD chunk,
// a tile of Sinkhorn matrices), and its launch has one team per item, with
// the scratch in Kokkos' team scratch:
//
//   work.for_each(team, [&](int item, void* scratch) { ... });
//
// On a GPU that is right while the scratch fits on-chip (level 0). Past that,
// Kokkos' level 1 is a device pool of per-team bytes times every team it
// considers resident (Kokkos 3.4: concurrency / team threads, 8448 one-warp
// teams on an H100, whatever the league), which reached tens of gigabytes.
// So a GPU launch whose scratch does not fit on-chip takes a workspace of its
// own instead: `slots` team slots in global memory, slots × bytes at most
// kTeamWorkspaceBudget, and a league of `slots` teams, each striding over the
// items (team r does items r, r + slots, r + 2·slots, ...) in its one slot.
// Same kernel code, same results; the memory is bounded and known before the
// launch.
//
// Where an item waits on lower items (a sum taken in a fixed order across
// teams, fused_backward_mma_kernels.hpp), the launch gives `claims`, a
// counter zeroed before it: each team takes its next item from the counter,
// so an item is only ever started after every lower one has been started by
// a team that is running. Whatever order the backend starts teams in (a GPU
// need not start blocks in index order, a host thread may take a later
// chunk first), the lowest unfinished item never waits, and waiting cannot
// deadlock.
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/impl/scratch_layout.hpp"

namespace kdnn::impl {

/// Most global memory one GPU launch takes for its team workspace (bytes).
/// A launch whose one team needs more is a kdnn::Error.
constexpr std::size_t kTeamWorkspaceBudget = std::size_t(256) << 20;

/// Team slots of a workspace for `items` work items with `stride` bytes per
/// team and `team_threads` threads per team, on a backend with `concurrency`
/// hardware threads: no more teams than items, than the backend can run at
/// once, or than the budget holds; at least 1. (An H100 under Kokkos 3.4:
/// concurrency 132 × 2048.)
inline int workspace_slots(long long items, std::size_t stride, long long team_threads,
                           long long concurrency, std::size_t budget = kTeamWorkspaceBudget) {
  long long slots = team_threads > 0 ? concurrency / team_threads : concurrency;
  if (stride > 0 && slots > static_cast<long long>(budget / stride)) {
    slots = static_cast<long long>(budget / stride);
  }
  if (slots > items) slots = items;
  return slots > 1 ? static_cast<int>(slots) : 1;
}

struct TeamWork {
  int items = 0;              ///< work items of the launch
  int level = 0;              ///< Kokkos scratch level, if workspace is null
  std::size_t bytes = 0;      ///< carved scratch bytes per team
  char* workspace = nullptr;  ///< else one slot of `stride` bytes per team
  std::size_t stride = 0;
  int* claims = nullptr;  ///< where set, items are claimed in order from it (above)

  /// Calls body(item, scratch) for this team's items, with its scratch
  /// (kScratchAlign-aligned, `bytes` long). Every thread of the team must
  /// call it (the items are the same for all of them).
  template <class Member, class Body>
  KOKKOS_INLINE_FUNCTION void for_each(const Member& team, const Body& body) const {
    const int first = team.league_rank();
    void* scratch = workspace != nullptr
                        ? static_cast<void*>(workspace + std::size_t(first) * stride)
                        : team_scratch_base(team, level, bytes);
    if (claims != nullptr) {
      for (int item = claim(team); item < items; item = claim(team)) body(item, scratch);
      return;
    }
    // In 64 bits: item + league_size may pass 2^31 on the last step.
    for (long long item = first; item < items; item += team.league_size()) {
      if (item != first) team.team_barrier();  // the last item is done with the scratch
      body(static_cast<int>(item), scratch);
    }
  }

 private:
  /// The team's next item from `claims`, the same on each of its threads
  /// (the broadcast is a barrier: the last item is done with the scratch).
  template <class Member>
  KOKKOS_INLINE_FUNCTION int claim(const Member& team) const {
    int item = 0;
    Kokkos::single(
        Kokkos::PerTeam(team), [&](int& x) { x = Kokkos::atomic_fetch_add(claims, 1); }, item);
    return item;
  }
};

}  // namespace kdnn::impl
