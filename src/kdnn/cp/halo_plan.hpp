// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::cp::HaloPlan: the halo exchange of a causal convolution of width K
// over a sequence laid out on the ranks of a communicator by a
// SequenceLayout (cp/sequence_layout.hpp; the contiguous split by default),
// built once and used by every call on that layout (every layer, every
// training step), as a halo is built once in Cabana.
//
// gather() brings each rank the K−1 steps before each of its segments (its
// halo [B, segments·(K−1), C], from one or more ranks, itself included when
// it holds the steps before one of its segments; before step 0 rank 0's
// initial state, or zeros); scatter_add() sends the halo's gradient back and
// adds it to the owners' dx (rank 0: to d(initial state)). Both return the
// exchange in flight: launch the work that does not need it, then finish().
//
// The plan holds the communicator's handle, not a copy: it must stay valid
// while the plan is used. One exchange at a time per communicator (as for
// every kdnn::cp call): two in flight on one communicator would take each
// other's messages.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <utility>
#include <vector>

#include "kdnn/core/tensor.hpp"
#include "kdnn/cp/agree.hpp"
#include "kdnn/cp/exchange_stats.hpp"
#include "kdnn/cp/impl/layout_checks.hpp"
#include "kdnn/cp/sequence_layout.hpp"
#include "kdnn/cp/sequence_split.hpp"

namespace kdnn::cp {

/// What one call's halo exchange moved, and the time it overlapped.
using HaloStats = ExchangeStats;

template <class T, class ExecSpace>
struct HaloExchange;

class HaloPlan {
 public:
  /// For a caller that has agreed on the layout and K with every rank: no
  /// collective, no check.
  struct Agreed {};

  /// The contiguous split. Collective over `comm`: each rank gives its own
  /// number of steps (≥ 0) and the same K ≥ 1. One all-gather; a bad or
  /// differing argument throws the same kdnn::Error on every rank.
  HaloPlan(MPI_Comm comm, std::int64_t steps, int K) : comm_(comm), K_(K) {
    const char* op = "cp::HaloPlan";
    check_communicator(op, comm);
    const auto all = agree_on_signature(comm, op,
                                        [&] {
                                          if (steps < 0)
                                            fail(op, ": steps=", steps,
                                                 ", expected >= 0 (this rank's sequence steps)");
                                          check_width(op, K);
                                        },
                                        {{"K", K}, {"steps", steps, Field::any}});
    set_layout(SequenceLayout::contiguous(lengths_of(all, 1)));
  }

  /// Any layout, the same on every rank of `comm` (layout.ranks() of them).
  /// Collective: one all-gather checks K and the layout on every rank.
  HaloPlan(MPI_Comm comm, SequenceLayout layout, int K) : comm_(comm), K_(K) {
    const char* op = "cp::HaloPlan";
    check_communicator(op, comm);
    agree_on_signature(comm, op,
                       [&] {
                         check_width(op, K);
                         impl::check_layout_ranks(op, comm, layout);
                       },
                       {{"K", K}, impl::layout_field("layout", layout)});
    set_layout(std::move(layout));
  }

  /// As above, local (Agreed).
  HaloPlan(MPI_Comm comm, SequenceLayout layout, int K, Agreed) : comm_(comm), K_(K) {
    set_layout(std::move(layout));
  }

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int ranks() const { return layout_.ranks(); }
  int width() const { return K_; }  ///< K
  const SequenceLayout& layout() const { return layout_; }
  /// This rank's segments, in the order of its local steps.
  const std::vector<Segment>& segments() const { return layout_.segments(rank_); }
  std::int64_t steps() const { return layout_.local_steps(rank_); }  ///< this rank's steps
  /// The rows of this rank's halo: K−1 per segment.
  std::int64_t halo_rows() const { return std::int64_t(segments().size()) * (K_ - 1); }
  /// The forward's pieces, every rank's (halo_pieces), with rank 0's initial
  /// state or without it.
  const std::vector<HaloPiece>& pieces(bool with_initial) const {
    return with_initial ? with_initial_ : without_initial_;
  }

  /// Starts the forward exchange: x [B, steps(), C] of this rank's steps,
  /// initial_state [B, K−1, C] on rank 0 only (optional) → halo [B,
  /// halo_rows(), C], the K−1 steps before each of this rank's segments.
  /// Collective; the arguments are checked on every rank together (one
  /// all-gather). The halo is complete after the exchange's finish().
  template <class T, class ExecSpace>
  HaloExchange<T, ExecSpace> gather(const ExecSpace& space,
                                    const StridedTensor3<const T, ExecSpace>& x,
                                    const StridedTensor3<const T, ExecSpace>& initial_state,
                                    const Tensor3<T, ExecSpace>& halo) const;

  /// Starts the backward exchange, gather()'s adjoint: dhalo [B,
  /// halo_rows(), C], the gradient of the forward's halo, goes back to the
  /// ranks that own its steps and is added to their dx [B, steps(), C] and,
  /// on rank 0, to dinitial_state [B, K−1, C] (given there to receive the
  /// initial state's share). The exchange's finish() adds what arrived and
  /// this rank's own share. Collective, checked as gather().
  template <class T, class ExecSpace>
  HaloExchange<T, ExecSpace> scatter_add(const ExecSpace& space,
                                         const Tensor3<const T, ExecSpace>& dhalo,
                                         const StridedTensor3<T, ExecSpace>& dx,
                                         const StridedTensor3<T, ExecSpace>& dinitial_state) const;

 private:
  static void check_width(const char* op, int K) {
    if (K < 1) fail(op, ": K=", K, ", expected >= 1 (the convolution's width)");
  }
  void set_layout(SequenceLayout layout) {
    MPI_Comm_rank(comm_, &rank_);
    layout_ = std::move(layout);
    with_initial_ = halo_pieces(layout_, K_ - 1, true);
    without_initial_ = halo_pieces(layout_, K_ - 1, false);
  }

  MPI_Comm comm_;
  int rank_ = 0, K_;
  SequenceLayout layout_;
  std::vector<HaloPiece> with_initial_, without_initial_;
};

}  // namespace kdnn::cp

#include "kdnn/cp/impl/halo_exchange.hpp"
