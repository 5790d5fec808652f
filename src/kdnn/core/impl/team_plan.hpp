// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Launch planning for team kernels, for the two kinds of team kdnn's kernels use:
//
//  * cooperative (plan_team): the whole team works on one block (a query
//    block of fused attention, an SSD chunk) and synchronises with team
//    barriers; the caller gives the number of blocks, the team's scratch
//    bytes and its default vector length, a kdnn::Launch request may pin team
//    and vector sizes.
//  * one system per team thread (plan_system_tiles): a team owns a tile of
//    small independent systems (Sinkhorn's matrices), each handled by one
//    team thread whose vector lanes split its rows or columns; no barriers.
//
// Both check what the backend allows — vector length a power of two and at
// most its maximum, team size at most team_size_max for the kernel — and put
// the scratch on level 0 (fast, on-chip) when it fits. When it does not: on a
// host, level 1 (host memory, up to the backend's limit); for a GPU launch
// (any launch on a GPU backend, or KernelForm::gpu anywhere), a bounded
// team workspace (team_work.hpp) of at most kTeamWorkspaceBudget bytes,
// never a Kokkos level-1 pool. Past a limit they throw kdnn::Error naming the
// operation and the limit. Kernels run through TeamPlan::launch and take
// their items and scratch from the TeamWork it hands them.
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <string>

#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/team_work.hpp"
#include "kdnn/core/launch.hpp"

namespace kdnn::impl {

template <class ExecSpace>
struct TeamPlan {
  int league = 0;  ///< work items: one team each, or strided over `slots` teams
  int team_size = 1;
  int vector_length = 1;
  int tile = 1;                   ///< systems per team (plan_system_tiles)
  int level = 0;                  ///< scratch level: 0 on-chip, 1 larger and slower
  std::size_t scratch_bytes = 0;  ///< carved bytes per team (see scratch_layout.hpp)
  int slots = 0;                  ///< > 0: teams of a team workspace instead of level 1

  Kokkos::TeamPolicy<ExecSpace> policy(const ExecSpace& space) const {
    if (slots > 0) return Kokkos::TeamPolicy<ExecSpace>(space, slots, team_size, vector_length);
    return Kokkos::TeamPolicy<ExecSpace>(space, league, team_size, vector_length)
        .set_scratch_size(level, Kokkos::PerTeam(team_scratch_request(scratch_bytes)));
  }

  /// Bytes of one team's workspace slot.
  std::size_t slot_stride() const {
    return (scratch_bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
  }

  /// Runs `kernel`, whose `work` member (a TeamWork) this sets, over the
  /// plan; `claims`, where given, a zeroed counter from which teams claim
  /// their items in order (team_work.hpp). A team workspace is allocated
  /// for this launch and freed after it (the space is fenced first, so the
  /// kernel has finished with it).
  template <class Kernel>
  void launch(const std::string& name, const ExecSpace& space, Kernel kernel,
              int* claims = nullptr) const {
    kernel.work = TeamWork{league, level, scratch_bytes, nullptr, 0, claims};
    Kokkos::View<char*, typename ExecSpace::memory_space> workspace;
    if (slots > 0) {
      workspace = decltype(workspace)(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kdnn::team_workspace")),
          std::size_t(slots) * slot_stride());
      kernel.work.workspace = workspace.data();
      kernel.work.stride = slot_stride();
    }
    Kokkos::parallel_for(name, policy(space), kernel);
    if (slots > 0) space.fence();
  }
};

/// Largest team scratch request a level holds on this backend.
template <class ExecSpace>
std::size_t scratch_capacity(int level) {
  const std::size_t max = Kokkos::TeamPolicy<ExecSpace>::scratch_size_max(level);
  return max > kScratchAlign ? max - kScratchAlign : 0;
}

inline void check_launch_request(const char* op, const Launch& request) {
  if (request.tile < 0) fail(op, ": launch.tile=", request.tile, ", expected >= 0");
  if (request.team_size < 0) fail(op, ": launch.team_size=", request.team_size, ", expected >= 0");
  if (request.vector_length < 0)
    fail(op, ": launch.vector_length=", request.vector_length, ", expected >= 0");
}

template <class ExecSpace>
void check_vector_length(const char* op, int vector_length) {
  if (vector_length < 1 || (vector_length & (vector_length - 1)) != 0) {
    fail(op, ": launch.vector_length=", vector_length, ", expected a power of two");
  }
  const int max = Kokkos::TeamPolicy<ExecSpace>::vector_length_max();
  if (vector_length > max) {
    fail(op, ": launch.vector_length=", vector_length, ", expected at most ", max,
         " on this backend");
  }
}

/// A team kernel that does nothing: what the backend allows any team.
template <class ExecSpace>
struct EmptyTeamKernel {
  KOKKOS_INLINE_FUNCTION void operator()(
      const typename Kokkos::TeamPolicy<ExecSpace>::member_type&) const {}
};

/// For a form that chooses its own team size and vector length (a
/// register-tiled team, a thread per system): the request's are still
/// checked as the other forms check them (not negative, a vector length a
/// power of two up to the backend's maximum, a team size up to the most
/// threads any team may have), so that a request is valid or not whichever
/// form runs.
template <class ExecSpace>
void check_launch_limits(const char* op, const Launch& request) {
  check_launch_request(op, request);
  if (request.vector_length > 0) check_vector_length<ExecSpace>(op, request.vector_length);
  if (request.team_size > 0) {
    const int max = Kokkos::TeamPolicy<ExecSpace>(1, 1).team_size_max(EmptyTeamKernel<ExecSpace>{},
                                                                      Kokkos::ParallelForTag());
    if (request.team_size > max) {
      fail(op, ": launch.team_size=", request.team_size, ", expected at most ", max,
           " on this backend");
    }
  }
}

/// Team size for `Kernel` with the plan's vector length and scratch: the
/// request if it is allowed (an error if not), else `fallback(max)`.
template <class ExecSpace, class Kernel, class Fallback>
int choose_team_size(const char* op, const ExecSpace& space, const TeamPlan<ExecSpace>& plan,
                     int request, const Fallback& fallback) {
  Kokkos::TeamPolicy<ExecSpace> probe(space, 1, 1, plan.vector_length);
  if (plan.slots == 0) {  // a team workspace takes no team scratch
    probe.set_scratch_size(plan.level, Kokkos::PerTeam(team_scratch_request(plan.scratch_bytes)));
  }
  const int max = probe.team_size_max(Kernel{}, Kokkos::ParallelForTag());
  if (request > max) {
    fail(op, ": launch.team_size=", request, ", expected at most ", max, " on this backend");
  }
  return request > 0 ? request : fallback(probe, max);
}

/// Whether a launch is bounded as on a GPU (a team workspace past level 0):
/// every launch on a GPU backend, whatever form it asks for (Kokkos' level-1
/// pool is the backend's, not the form's), and a GPU form on a host, so that
/// the host tests run the same launch.
template <class ExecSpace>
bool is_gpu_launch(const Launch& request) {
  return BackendTraits<ExecSpace>::is_gpu || request.form == KernelForm::gpu;
}

/// The most scratch a team may have on this launch, and what that limit is
/// (for messages): the team workspace's budget for a GPU launch, else level
/// 1's limit.
template <class ExecSpace>
std::size_t scratch_limit(bool gpu_launch, const char*& what) {
  what = gpu_launch ? "-byte budget of a GPU launch's team workspace"
                    : "-byte limit of this backend's team scratch (level 1)";
  return gpu_launch ? kTeamWorkspaceBudget : scratch_capacity<ExecSpace>(1);
}

/// Puts the plan's scratch_bytes on level 0 if they fit; else in a team
/// workspace for a GPU launch (slots = 1 until the team size is known, see
/// bound_workspace), or on level 1.
template <class ExecSpace>
void place_scratch(TeamPlan<ExecSpace>& plan, bool gpu_launch) {
  plan.level = plan.scratch_bytes <= scratch_capacity<ExecSpace>(0) ? 0 : 1;
  plan.slots = plan.level == 1 && gpu_launch ? 1 : 0;
}

/// With the team size known: the workspace's slots (workspace_slots).
template <class ExecSpace>
void bound_workspace(TeamPlan<ExecSpace>& plan, const ExecSpace& space) {
  if (plan.slots == 0) return;
  plan.slots = workspace_slots(plan.league, plan.slot_stride(),
                               static_cast<long long>(plan.team_size) * plan.vector_length,
                               space.concurrency());
}

/// Cooperative kernels: `league` blocks, each with `scratch_bytes` of carved
/// scratch. The request's team size (0 = the backend's recommendation for
/// Kernel), vector length (0 = `default_vector_length`) and form are used;
/// its tile has no meaning here. Throws kdnn::Error when the scratch exceeds
/// its limit (scratch_limit; `what` names the problem size in the message).
template <class ExecSpace, class Kernel>
TeamPlan<ExecSpace> plan_team(const char* op, const ExecSpace& space, int league,
                              const Launch& request, int default_vector_length,
                              std::size_t scratch_bytes, const std::string& what) {
  check_launch_request(op, request);
  TeamPlan<ExecSpace> plan;
  plan.vector_length = request.vector_length > 0 ? request.vector_length : default_vector_length;
  check_vector_length<ExecSpace>(op, plan.vector_length);
  const bool gpu_launch = is_gpu_launch<ExecSpace>(request);
  const char* limit_what = nullptr;
  const std::size_t limit = scratch_limit<ExecSpace>(gpu_launch, limit_what);
  if (scratch_bytes > limit) {
    fail(op, ": ", what, " needs ", scratch_bytes, " bytes of team scratch, above the ", limit,
         limit_what);
  }
  plan.league = league;
  plan.scratch_bytes = scratch_bytes;
  place_scratch(plan, gpu_launch);
  plan.team_size = choose_team_size<ExecSpace, Kernel>(
      op, space, plan, request.team_size, [](const auto& probe, int) {
        return probe.team_size_recommended(Kernel{}, Kokkos::ParallelForTag());
      });
  bound_workspace(plan, space);
  return plan;
}

/// The launch plan of a register-tiled GPU form (core/impl/register_tile.hpp)
/// over `league` teams: Kernel::NT threads per team on a GPU (one thread on
/// a host, which plays them in turn), no vector lanes, `scratch_bytes` of
/// scratch; the request's team size and vector length do not apply (they
/// are checked: check_launch_limits), its form does.
template <class ExecSpace, class Kernel>
TeamPlan<ExecSpace> plan_register_team(const char* op, const ExecSpace& space, int league,
                                       const Launch& launch, std::size_t scratch_bytes,
                                       const std::string& what) {
  check_launch_limits<ExecSpace>(op, launch);
  Launch request;
  request.team_size = BackendTraits<ExecSpace>::is_gpu ? Kernel::NT : 1;
  request.vector_length = 1;
  request.form = launch.form;
  return plan_team<ExecSpace, Kernel>(op, space, league, request, 1, scratch_bytes, what);
}

/// One system per team thread: `batch` independent systems whose inner loops
/// have `lanes` iterations; `bytes(tile)` is the carved scratch of a team
/// owning `tile` systems. `what` and `unit` name a system in messages ("n=16",
/// "matrix"). Defaults: on a GPU, a lane per row up to a warp and one warp
/// per team (warp / vector_length systems, fewer if they do not fit on-chip);
/// on a host, one system per team, no vector lanes.
template <class ExecSpace, class Kernel, class BytesFn>
TeamPlan<ExecSpace> plan_system_tiles(const char* op, const ExecSpace& space, int batch, int lanes,
                                      const Launch& request, const BytesFn& bytes,
                                      const std::string& what, const char* unit) {
  check_launch_request(op, request);
  const std::size_t max0 = scratch_capacity<ExecSpace>(0);
  const bool gpu_launch = is_gpu_launch<ExecSpace>(request);
  const char* limit_what = nullptr;
  const std::size_t limit = scratch_limit<ExecSpace>(gpu_launch, limit_what);
  if (bytes(1) > limit) {
    fail(op, ": ", what, " needs ", bytes(1), " bytes of team scratch per ", unit, ", above the ",
         limit, limit_what);
  }

  const int warp = BackendTraits<ExecSpace>::warp_width();
  TeamPlan<ExecSpace> plan;
  if (request.vector_length > 0) {
    plan.vector_length = request.vector_length;
  } else {
    while (plan.vector_length < lanes && plan.vector_length < warp) plan.vector_length *= 2;
  }
  check_vector_length<ExecSpace>(op, plan.vector_length);
  if (request.tile > 0) {
    plan.tile = request.tile;
  } else if (warp > 1) {
    plan.tile = warp / plan.vector_length > 0 ? warp / plan.vector_length : 1;
    while (plan.tile > 1 && bytes(plan.tile) > max0) plan.tile /= 2;
  }
  plan.scratch_bytes = bytes(plan.tile);
  if (plan.scratch_bytes > limit) {
    fail(op, ": launch.tile=", plan.tile, " needs ", plan.scratch_bytes,
         " bytes of team scratch, above the ", limit, limit_what);
  }
  place_scratch(plan, gpu_launch);
  plan.league = batch / plan.tile + (batch % plan.tile != 0 ? 1 : 0);  // no batch + tile − 1
  plan.team_size = choose_team_size<ExecSpace, Kernel>(
      op, space, plan, request.team_size,
      [&](const auto&, int max) { return plan.tile < max ? plan.tile : max; });
  bound_workspace(plan, space);
  return plan;
}

}  // namespace kdnn::impl
