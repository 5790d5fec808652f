// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Sinkhorn's host-form launch: one team thread per matrix, a tile of matrices per
// team (kdnn::impl::plan_system_tiles), each matrix's working set carved out
// of team scratch by its kernel's layout function.
#include <string>

#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/team_plan.hpp"
#include "kdnn/sinkhorn/sinkhorn.hpp"

namespace kdnn::sinkhorn::impl {

using kdnn::impl::ScratchCarver;

/// Row stride of an n×n matrix in scratch: odd, so that lanes walking a row
/// each and lanes walking a column each both hit distinct memory banks.
KOKKOS_INLINE_FUNCTION int scratch_ld(int n) { return n | 1; }

/// What a kernel's run() does: plan the launch and run it, or only plan it
/// (its errors, e.g. scratch the backend lacks, without running anything).
enum class Step { launch, plan_only };

/// Base of the kernels that give each matrix of a batch to one team thread.
/// Derived provides its layout, `Work carve(ScratchCarver&) const`, and
/// `void one_matrix(const Member&, int b, const Work&) const`; or, if it sets
/// `grouped` and `group = G` (matrices side by side in SIMD lanes,
/// core/impl/lanes.hpp; G may be 1), a layout for G matrices and
/// `void one_group(const Member&, int b0, int count, const Work&) const` for
/// matrices b0 .. b0 + count − 1 (count <= G). A team's tile of matrices is
/// then cut into groups of G, the last one possibly partial.
template <class Derived, class ExecSpace>
struct PerMatrixKernel {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  static constexpr bool grouped = false;
  static constexpr int group = 1;

  int batch = 0, n = 0;
  /// Rows first is columns first on the transposed matrices: with transpose
  /// set, at() reads and writes element (j, i) for (i, j).
  bool transpose = false;
  int tile = 1;               // set by run()
  kdnn::impl::TeamWork work;  // set by the launch: items are tiles

  /// Element (i, j) of matrix b of a [B, n, n] view, or (j, i) if transpose.
  template <class View>
  KOKKOS_INLINE_FUNCTION typename View::reference_type at(const View& v, int b, int i,
                                                          int j) const {
    return transpose ? v(b, j, i) : v(b, i, j);
  }

  /// Carved scratch bytes of one matrix (of one group of them).
  KOKKOS_INLINE_FUNCTION std::size_t matrix_bytes() const {
    return kdnn::impl::layout_bytes([&](ScratchCarver& s) { derived().carve(s); });
  }

  /// Plans the launch (vector loops of `lanes` iterations) and runs it. The
  /// default tile of a grouped kernel is one group.
  void run(const char* op, const ExecSpace& space, int lanes, Launch request,
           Step step = Step::launch) {
    constexpr int G = Derived::group;
    if (G > 1 && request.tile == 0) request.tile = G;
    const std::size_t bytes = matrix_bytes();
    const auto plan = kdnn::impl::plan_system_tiles<ExecSpace, Derived>(
        op, space, batch, lanes, request,
        [&](int tiles) { return std::size_t(groups(tiles)) * bytes; }, "n=" + std::to_string(n),
        "matrix");
    tile = plan.tile;
    if (step == Step::launch) plan.launch(std::string("kdnn::") + op, space, derived());
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    work.for_each(team, [&](int item, void* scratch) { one_tile(team, item, scratch); });
  }

 private:
  /// Matrices item·tile ... of the batch, by the team's threads.
  KOKKOS_INLINE_FUNCTION void one_tile(const Member& team, int item, void* scratch) const {
    constexpr int G = Derived::group;
    const std::size_t bytes = matrix_bytes();
    char* base = static_cast<char*>(scratch);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, groups(tile)), [&](int g) {
      const int t = g * G;
      // In 64 bits: the last tile may reach past batch ≈ 2^31.
      const long long b64 = static_cast<long long>(item) * tile + t;
      if (b64 >= batch) return;
      const int b = int(b64);
      ScratchCarver carver(base + g * bytes);
      if constexpr (!Derived::grouped) {
        derived().one_matrix(team, b, derived().carve(carver));
      } else {
        const int left = tile - t < batch - b ? tile - t : batch - b;
        derived().one_group(team, b, left < G ? left : G, derived().carve(carver));
      }
    });
  }

  /// Groups in `matrices` matrices.
  static KOKKOS_INLINE_FUNCTION int groups(int matrices) {
    return (matrices + Derived::group - 1) / Derived::group;
  }
  KOKKOS_INLINE_FUNCTION const Derived& derived() const {
    return static_cast<const Derived&>(*this);
  }
};

}  // namespace kdnn::sinkhorn::impl
