#pragma once
// Launch planning for team kernels, for the two shapes kdnn's kernels take:
//
//  * cooperative (plan_team): the whole team works on one block (a query
//    block of fused attention, an SSD chunk) and synchronises with team
//    barriers; the caller gives the league, the team's scratch bytes and its
//    default vector length, a kdnn::Launch request may pin team and vector
//    sizes.
//  * one system per team thread (plan_system_tiles): a team owns a tile of
//    small independent systems (Sinkhorn's matrices), each handled by one
//    team thread whose vector lanes split its rows or columns; no barriers.
//
// Both check what the backend allows — vector length a power of two and at
// most its maximum, team size at most team_size_max for the kernel, scratch
// on level 0 (fast, on-chip) when it fits, else level 1, and a level-1 pool
// (below) that kdnn allows — and throw kdnn::Error naming the operation and
// the limit otherwise.
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <string>
#include <type_traits>

#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/launch.hpp"

namespace kdnn::impl {

template <class ExecSpace>
struct TeamPlan {
  int league = 0;
  int team_size = 1;
  int vector_length = 1;
  int tile = 1;                   ///< systems per team (plan_system_tiles)
  int level = 0;                  ///< scratch level: 0 on-chip, 1 larger and slower
  std::size_t scratch_bytes = 0;  ///< carved bytes per team (see scratch_layout.hpp)

  Kokkos::TeamPolicy<ExecSpace> policy(const ExecSpace& space) const {
    return Kokkos::TeamPolicy<ExecSpace>(space, league, team_size, vector_length)
        .set_scratch_size(level, Kokkos::PerTeam(team_scratch_request(scratch_bytes)));
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

/// Team size for `Kernel` with the plan's vector length and scratch: the
/// request if it is allowed (an error if not), else `fallback(max)`.
template <class ExecSpace, class Kernel, class Fallback>
int choose_team_size(const char* op, const ExecSpace& space, const TeamPlan<ExecSpace>& plan,
                     int request, const Fallback& fallback) {
  Kokkos::TeamPolicy<ExecSpace> probe(space, 1, 1, plan.vector_length);
  probe.set_scratch_size(plan.level, Kokkos::PerTeam(team_scratch_request(plan.scratch_bytes)));
  const int max = probe.team_size_max(Kernel{}, Kokkos::ParallelForTag());
  if (request > max) {
    fail(op, ": launch.team_size=", request, ", expected at most ", max, " on this backend");
  }
  return request > 0 ? request : fallback(probe, max);
}

/// Level-1 scratch is device memory that Kokkos sets aside, at the launch,
/// for every team that can run at once: per-team bytes × concurrency() /
/// (team size × vector length) (Kokkos 3.4 on CUDA: 2048 threads per SM, so
/// 8448 teams of one warp on an H100). A plan whose pool exceeds
/// scratch_pool_limit() is a kdnn::Error before anything runs, rather than a
/// failed allocation of tens of gigabytes inside Kokkos.
inline double scratch_pool_bytes(std::size_t bytes, long long concurrency, int team_threads) {
  const long long teams = team_threads > 0 ? concurrency / team_threads : concurrency;
  return double(bytes) * double(teams > 1 ? teams : 1);
}

/// The most a level-1 scratch pool may take: the GPU's memory on CUDA (a
/// larger pool can never be allocated; a smaller one may still fail when
/// other allocations hold the memory, and Kokkos then throws its own
/// error); 0 (not checked) on a host, where level 1 is host memory per
/// thread and scratch_capacity(1) is the limit.
template <class ExecSpace>
std::size_t scratch_pool_limit() {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda>) {
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) return total;
  }
#endif
  return 0;
}

/// Throws kdnn::Error if the plan's level-1 scratch pool, with `concurrency`
/// hardware threads, exceeds `limit` bytes (0: no limit).
template <class ExecSpace>
void check_scratch_pool(const char* op, const TeamPlan<ExecSpace>& plan, long long concurrency,
                        std::size_t limit, const std::string& what) {
  if (plan.level == 0 || limit == 0) return;
  const int threads = plan.team_size * plan.vector_length;
  const double pool = scratch_pool_bytes(plan.scratch_bytes, concurrency, threads);
  if (pool > double(limit)) {
    fail(op, ": ", what, " needs ", plan.scratch_bytes,
         " bytes of team scratch (level 1) for each of ", concurrency / (threads > 0 ? threads : 1),
         " teams of ", threads, " threads that run at once, ", pool, " bytes in all, above the ",
         limit, " bytes of the device's memory");
  }
}

/// Scratch level for `bytes` per team: 0 if it fits, else 1.
template <class ExecSpace>
int scratch_level(std::size_t bytes) {
  return bytes <= scratch_capacity<ExecSpace>(0) ? 0 : 1;
}

/// Cooperative kernels: `league` teams, each with `scratch_bytes` of carved
/// scratch. The request's team size (0 = the backend's recommendation for
/// Kernel) and vector length (0 = `default_vector_length`) are used; its tile
/// has no meaning here. Throws kdnn::Error when the scratch exceeds level 1
/// (`what` names the problem size in the message).
template <class ExecSpace, class Kernel>
TeamPlan<ExecSpace> plan_team(const char* op, const ExecSpace& space, int league,
                              const Launch& request, int default_vector_length,
                              std::size_t scratch_bytes, const std::string& what) {
  check_launch_request(op, request);
  TeamPlan<ExecSpace> plan;
  plan.vector_length = request.vector_length > 0 ? request.vector_length : default_vector_length;
  check_vector_length<ExecSpace>(op, plan.vector_length);
  const std::size_t max1 = scratch_capacity<ExecSpace>(1);
  if (scratch_bytes > max1) {
    fail(op, ": ", what, " needs ", scratch_bytes, " bytes of team scratch, above the ", max1,
         "-byte limit of this backend's team scratch (level 1)");
  }
  plan.league = league;
  plan.scratch_bytes = scratch_bytes;
  plan.level = scratch_level<ExecSpace>(scratch_bytes);
  plan.team_size = choose_team_size<ExecSpace, Kernel>(
      op, space, plan, request.team_size, [](const auto& probe, int) {
        return probe.team_size_recommended(Kernel{}, Kokkos::ParallelForTag());
      });
  check_scratch_pool(op, plan, space.concurrency(), scratch_pool_limit<ExecSpace>(), what);
  return plan;
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
  const std::size_t max1 = scratch_capacity<ExecSpace>(1);
  if (bytes(1) > max1) {
    fail(op, ": ", what, " needs ", bytes(1), " bytes of team scratch per ", unit, ", above the ",
         max1, "-byte limit of this backend's team scratch (level 1)");
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
  if (plan.scratch_bytes > max1) {
    fail(op, ": launch.tile=", plan.tile, " needs ", plan.scratch_bytes,
         " bytes of team scratch, above the ", max1, "-byte limit (level 1)");
  }
  plan.level = scratch_level<ExecSpace>(plan.scratch_bytes);
  plan.league = batch / plan.tile + (batch % plan.tile != 0 ? 1 : 0);  // no batch + tile − 1
  plan.team_size = choose_team_size<ExecSpace, Kernel>(
      op, space, plan, request.team_size,
      [&](const auto&, int max) { return plan.tile < max ? plan.tile : max; });
  check_scratch_pool(op, plan, space.concurrency(), scratch_pool_limit<ExecSpace>(), what);
  return plan;
}

}  // namespace kdnn::impl
