// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The launch of Sinkhorn's lane forms (KernelForm::gpu at n >= 8; the thread
// forms of matrix_forms.hpp take n <= 4), for a
// compile-time n = N in LaneFormSizes: each matrix is owned by the N
// vector lanes of one team thread, lane k keeping row k and column k of the
// matrix in registers (LaneRegisters), and a team holds several matrices
// (four warps' worth), consecutive in the batch so that the lanes' loads and
// stores are coalesced. Everything a lane shares with the others of its
// matrix goes through the matrix's slice of level-0 scratch.
//
// Per-lane state: on a GPU backend a vector lane is a hardware thread with
// private registers, so a lane keeps only its own values (Private). On a
// host the lanes of a vector loop run one after another in one thread, so
// the state of all N lanes is kept side by side; the arithmetic is the same
// code.
#include <string>

#include <Kokkos_Core.hpp>

#include "kdnn/core/compat.hpp"
#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/compiled_sizes.hpp"
#include "kdnn/core/impl/lane_dot.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/team_plan.hpp"
#include "kdnn/core/impl/unroll.hpp"
#include "kdnn/core/launch.hpp"
#include "kdnn/sinkhorn/impl/first_iteration.hpp"
#include "kdnn/sinkhorn/impl/launch.hpp"

namespace kdnn::sinkhorn::impl {

/// The matrix sizes n the lane forms are compiled for; n <= 4 takes the
/// thread forms (matrix_forms.hpp), whose matrix is too small to share
/// between lanes.
using LaneFormSizes = kdnn::impl::CompiledSizes<8, 16, 32>;

/// M values of T per vector lane, for `Lanes` lanes: one lane's own values
/// if lanes have private registers (a GPU backend), else every lane's side by
/// side (a host backend, whose vector loop is a plain loop).
template <class T, int Lanes, int M, bool Private>
struct LaneRegisters {
  T a[Private ? 1 : Lanes][M];
  KOKKOS_FORCEINLINE_FUNCTION T* operator()(int lane) { return a[Private ? 0 : lane]; }
};

using kdnn::impl::lane_dot;
using kdnn::impl::lane_dot_shared;

/// Base of the GPU forms: Derived provides its per-matrix scratch
/// layout, `Work carve(ScratchCarver&) const` (or static), and
/// `void one_matrix(const Member&, int b, const Work&) const`, run by the N
/// lanes of one team thread.
template <class Derived, class ExecSpace, int N>
struct GpuMatrixKernel {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  /// Vector lanes with private registers (see the file comment).
  static constexpr bool kPrivate = kdnn::impl::BackendTraits<ExecSpace>::is_gpu;
  /// Row stride of an N×N tile in scratch: odd for N >= 2, so lanes walking
  /// its rows and lanes walking its columns both hit distinct banks.
  static constexpr int kLd = N + 1;

  int batch = 0;

  /// Carved scratch bytes of one matrix.
  KOKKOS_INLINE_FUNCTION std::size_t matrix_bytes() const {
    return kdnn::impl::layout_bytes([&](kdnn::impl::ScratchCarver& s) { derived().carve(s); });
  }

  /// Whether one matrix's scratch fits on-chip (level 0), which run() needs.
  bool fits_on_chip() const { return matrix_bytes() <= kdnn::impl::scratch_capacity<ExecSpace>(0); }

  /// Launch: vector length N on a GPU (a lane per row, which the private
  /// registers need), 1 on a host; a team of 128 / N matrices (four warps),
  /// fewer if their scratch does not fit on-chip. launch.team_size, if set,
  /// is the number of matrices per team; launch.tile and
  /// launch.vector_length do not apply to this form, but a vector length no
  /// launch could take (not a power of two, above the backend's) is an error
  /// here as in the host form.
  void run(const char* op, const ExecSpace& space, const Launch& request,
           Step step = Step::launch) const {
    kdnn::impl::check_launch_request(op, request);
    if (request.vector_length > 0) {
      kdnn::impl::check_vector_length<ExecSpace>(op, request.vector_length);
    }
    const std::size_t bytes = matrix_bytes();
    const std::size_t max0 = kdnn::impl::scratch_capacity<ExecSpace>(0);
    int matrices = kPrivate && N < 128 ? 128 / N : 1;
    while (matrices > 1 && matrices * bytes > max0) matrices /= 2;
    kdnn::impl::TeamPlan<ExecSpace> plan;
    plan.vector_length = kPrivate ? N : 1;
    plan.level = 0;
    plan.scratch_bytes = matrices * bytes;
    plan.team_size = kdnn::impl::choose_team_size<ExecSpace, Derived>(
        op, space, plan, request.team_size,
        [&](const auto&, int max) { return matrices < max ? matrices : max; });
    plan.scratch_bytes = plan.team_size * bytes;
    if (plan.scratch_bytes > max0) {
      kdnn::fail(op, ": launch.team_size=", plan.team_size, " needs ", plan.scratch_bytes,
                 " bytes of team scratch, above the ", max0, "-byte on-chip limit (level 0)");
    }
    plan.league = batch / plan.team_size + (batch % plan.team_size != 0 ? 1 : 0);
    if (step == Step::plan_only) return;
    Kokkos::parallel_for(std::string("kdnn::") + op + "[gpu n=" + std::to_string(N) + "]",
                         plan.policy(space), derived());
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::size_t bytes = matrix_bytes();
    char* base =
        static_cast<char*>(kdnn::impl::team_scratch_base(team, 0, team.team_size() * bytes));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, team.team_size()), [&](int t) {
      // In 64 bits: the last team may reach past batch ≈ 2^31.
      const long long b64 = static_cast<long long>(team.league_rank()) * team.team_size() + t;
      if (b64 >= batch) return;
      kdnn::impl::ScratchCarver carver(base + t * bytes);
      derived().one_matrix(team, int(b64), derived().carve(carver));
    });
  }

  /// The forward's iteration 1 (first_iteration.hpp), in double, by the
  /// matrix's lanes, with X read through xd(i, j) where first_column /
  /// first_row need it rather than held in registers (fully unrolled with N
  /// double temporaries per lane, these loops alone took every register at
  /// N = 16 and spilled). Lane j takes column j's statistics into shift[j]
  /// and inv_colsum[j]; lane i recomputes its exponentials (the values the
  /// column pass summed), writes row i of P in T to the tile (row stride
  /// kLd), hands each P_ij to put(i, j, P_ij) and w_i = eps / ρ_i to
  /// row_done(i, w_i). Then lane k takes row k and column k of P from the
  /// tile into its registers `row` and `col`.
  template <class V, class XAt, class Put, class RowDone>
  static KOKKOS_INLINE_FUNCTION void first_iteration_lanes(const Member& team, const XAt& xd,
                                                           double eps, double* shift,
                                                           double* inv_colsum, V* tile,
                                                           const Put& put, const RowDone& row_done,
                                                           LaneRegisters<V, N, N, kPrivate>& row,
                                                           LaneRegisters<V, N, N, kPrivate>& col) {
    const auto lanes = Kokkos::ThreadVectorRange(team, N);
    Kokkos::parallel_for(lanes, [&](int j) {
      first_column(
          N, [&](int i) { return xd(i, j); }, [](int, double) {}, shift[j], inv_colsum[j]);
    });
    Kokkos::parallel_for(lanes, [&](int i) {
      const double w_i = first_row(
          N, [&](int j) { return compat::exp(xd(i, j) - shift[j]); },
          [&](int j) { return xd(i, j); }, [&](int j) { return shift[j]; },
          [&](int j) { return inv_colsum[j]; }, eps,
          [&](int j, double pij) {
            tile[i * kLd + j] = V(pij);
            put(i, j, pij);
          });
      row_done(i, w_i);
    });
    Kokkos::parallel_for(lanes, [&](int k) {
      V* pr = row(k);
      V* pc = col(k);
      KDNN_IMPL_UNROLL
      for (int l = 0; l < N; ++l) {
        pr[l] = tile[k * kLd + l];
        pc[l] = tile[l * kLd + k];
      }
    });
  }

  /// Element (i, j) of a matrix at p with row stride ld, or (j, i) if Tr.
  template <bool Tr, class V>
  static KOKKOS_FORCEINLINE_FUNCTION V& at(V* p, int ld, int i, int j) {
    return Tr ? p[j * ld + i] : p[i * ld + j];
  }

 private:
  KOKKOS_INLINE_FUNCTION const Derived& derived() const {
    return static_cast<const Derived&>(*this);
  }
};

}  // namespace kdnn::sinkhorn::impl
