// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::impl::RegisterTeam: what every register-tiled GPU form's team kernel
// shares (the fused attention forward and backward, the SSD chunk kernels).
// A team has NT threads, each holding its micro-tile in registers
// (register_tile.hpp); on a host one thread plays the NT in turn, their
// registers side by side (ThreadRegisters with kPrivate false). The launch
// is plan_register_team (team_plan.hpp).
//
// Derived provides `work` (the TeamWork the launch sets), a static
// `carve(ScratchCarver&, args...)` (its scratch layout) and
// `one_block(team, item, scratch)` (one work item).
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"

namespace kdnn::impl {

template <class Derived, class ExecSpace, int Threads>
struct RegisterTeam {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  /// Threads per team (on a GPU).
  static constexpr int NT = Threads;
  /// Whether a thread's registers are its own (a GPU backend), not side by
  /// side in the one thread that plays the team (a host).
  static constexpr bool kPrivate = BackendTraits<ExecSpace>::is_gpu;

  /// Calls f(t) for each of the team's threads t, once (on a host, one after
  /// another).
  template <class F>
  static KOKKOS_INLINE_FUNCTION void threads(const Member& team, const F& f) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, Threads), f);
  }

  /// The bytes of scratch Derived::carve(s, args...) takes.
  template <class... Args>
  static std::size_t scratch_bytes(const Args&... args) {
    return layout_bytes([&](ScratchCarver& s) { Derived::carve(s, args...); });
  }

  /// The launch body: each of the team's work items, with its scratch.
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const Derived& self = static_cast<const Derived&>(*this);
    self.work.for_each(team, [&](int item, void* scratch) { self.one_block(team, item, scratch); });
  }
};

}  // namespace kdnn::impl
