#pragma once
// Sinkhorn's launch shape: one team thread per matrix, a tile of matrices per
// team (kdnn::impl::plan_system_tiles), each matrix's working set carved out
// of team scratch by its kernel's layout function.
#include <string>

#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/team_plan.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::sinkhorn::impl {

using kdnn::impl::ScratchCarver;
using kdnn::impl::TeamPlan;

/// Row stride of an n×n matrix in scratch: odd, so that lanes walking a row
/// each and lanes walking a column each both hit distinct memory banks.
KOKKOS_INLINE_FUNCTION int scratch_ld(int n) { return n | 1; }

/// Plans `Kernel` over `batch` matrices of size n whose vector loops have
/// `lanes` iterations; `matrix_bytes` is the carved scratch of one matrix.
template <class ExecSpace, class Kernel>
TeamPlan<ExecSpace> plan_matrices(const char* op, const ExecSpace& space, int batch, int n,
                                  int lanes, const Launch& request, std::size_t matrix_bytes) {
  return kdnn::impl::plan_system_tiles<ExecSpace, Kernel>(
      op, space, batch, lanes, request, [&](int tile) { return tile * matrix_bytes; },
      "n=" + std::to_string(n), "matrix");
}

/// Runs `one_matrix(b, carver)` for each of the team's matrices b, with a
/// carver over that matrix's slice of the team's scratch.
template <class Member, class OneMatrix>
KOKKOS_INLINE_FUNCTION void for_each_matrix(const Member& team, int level, int tile,
                                            int batch, std::size_t matrix_bytes,
                                            const OneMatrix& one_matrix) {
  char* base = static_cast<char*>(
      kdnn::impl::team_scratch_base(team, level, tile * matrix_bytes));
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tile), [&](int t) {
    const int b = team.league_rank() * tile + t;
    if (b >= batch) return;
    ScratchCarver carver(base + t * matrix_bytes);
    one_matrix(b, carver);
  });
}

}  // namespace kdnn::sinkhorn::impl
