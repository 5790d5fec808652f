#pragma once
// Mapping of a batch of small matrices onto Kokkos teams. A team owns a tile
// of `tile` consecutive matrices, each kept in its own slice of team scratch.
// Team threads take matrices (TeamThreadRange), and a thread's vector lanes
// split the rows or columns of its matrix (ThreadVectorRange). Matrices are
// independent, so no team barrier is needed; Kokkos synchronises the vector
// lanes at the end of each vector loop.
#include <cstddef>

#include <Kokkos_Core.hpp>

#include "kdnn/core/error.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::sinkhorn::impl {

template <class ExecSpace>
using ScratchSpace = typename ExecSpace::scratch_memory_space;

/// An unmanaged 1-d view carved out of team scratch.
template <class V, class ExecSpace>
using ScratchVec =
    Kokkos::View<V*, ScratchSpace<ExecSpace>, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

template <class V, class ExecSpace>
std::size_t scratch_vec_bytes(std::size_t count) {
  return ScratchVec<V, ExecSpace>::shmem_size(count);
}

/// Row stride of an n×n matrix in scratch: odd, so that lanes walking a row
/// each and lanes walking a column each both hit distinct memory banks.
KOKKOS_INLINE_FUNCTION int scratch_ld(int n) { return n | 1; }

template <class ExecSpace>
struct TeamPlan {
  int tile = 1;
  int team_size = 1;
  int vector_length = 1;
  int league = 0;
  int level = 0;  ///< scratch level (0: fast on-chip; 1: larger, slower)
  std::size_t scratch_bytes = 0;

  Kokkos::TeamPolicy<ExecSpace> policy(const ExecSpace& space) const {
    return Kokkos::TeamPolicy<ExecSpace>(space, league, team_size, vector_length)
        .set_scratch_size(level, Kokkos::PerTeam(scratch_bytes));
  }
};

/// Chooses tile, team size, vector length and scratch level for `batch`
/// matrices whose inner loops have `lanes` iterations; `bytes(tile)` is the
/// team scratch a tile needs. Throws kdnn::Error when a requested shape is
/// invalid or one matrix does not fit in team scratch.
template <class ExecSpace, class Kernel, class BytesFn>
TeamPlan<ExecSpace> plan_launch(const char* op, const ExecSpace& space, int batch,
                                int n, int lanes, const Launch& request,
                                BytesFn bytes) {
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  constexpr bool host = Kokkos::SpaceAccessibility<
      Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;
  if (request.tile < 0) fail(op, ": launch.tile=", request.tile, ", expected >= 0");
  if (request.team_size < 0)
    fail(op, ": launch.team_size=", request.team_size, ", expected >= 0");
  if (request.vector_length < 0)
    fail(op, ": launch.vector_length=", request.vector_length, ", expected >= 0");

  const std::size_t max0 = std::size_t(Policy::scratch_size_max(0));
  const std::size_t max1 = std::size_t(Policy::scratch_size_max(1));
  if (bytes(1) > max1) {
    fail(op, ": n=", n, " needs ", bytes(1),
         " bytes of team scratch per matrix, above the ", max1,
         "-byte limit of this backend's team scratch (level 1)");
  }

  TeamPlan<ExecSpace> plan;
  if (request.vector_length > 0) {
    plan.vector_length = request.vector_length;
  } else if (!host) {
    // A lane per row/column, up to a warp (larger n loop over the lanes).
    plan.vector_length = 1;
    while (plan.vector_length < lanes && plan.vector_length < 32) plan.vector_length *= 2;
  }
  if ((plan.vector_length & (plan.vector_length - 1)) != 0) {
    fail(op, ": launch.vector_length=", plan.vector_length, ", expected a power of two");
  }
  if (plan.vector_length > Policy::vector_length_max()) {
    fail(op, ": launch.vector_length=", plan.vector_length, ", expected at most ",
         Policy::vector_length_max(), " on this backend");
  }
  if (request.tile > 0) {
    plan.tile = request.tile;
  } else if (!host) {
    // One warp per team: 32 / vector_length matrices (2 for n = 16, 8 for
    // n = 4), fewer if they do not fit in fast scratch. Small teams keep the
    // scratch per team small, so many teams share a multiprocessor.
    plan.tile = 32 / plan.vector_length;
    while (plan.tile > 1 && bytes(plan.tile) > max0) plan.tile /= 2;
  }
  plan.scratch_bytes = bytes(plan.tile);
  if (plan.scratch_bytes > max1) {
    fail(op, ": launch.tile=", plan.tile, " needs ", plan.scratch_bytes,
         " bytes of team scratch, above the ", max1, "-byte limit (level 1)");
  }
  plan.level = plan.scratch_bytes <= max0 ? 0 : 1;
  plan.league = (batch + plan.tile - 1) / plan.tile;

  Policy probe(space, 1, 1, plan.vector_length);
  probe.set_scratch_size(plan.level, Kokkos::PerTeam(plan.scratch_bytes));
  const int team_max = probe.team_size_max(Kernel{}, Kokkos::ParallelForTag());
  plan.team_size = request.team_size > 0 ? request.team_size
                                         : (plan.tile < team_max ? plan.tile : team_max);
  if (plan.team_size > team_max) {
    fail(op, ": launch.team_size=", plan.team_size, ", expected at most ", team_max,
         " on this backend");
  }
  return plan;
}

}  // namespace kdnn::sinkhorn::impl
