// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::cp::HaloPlan: the halo exchange of a causal convolution of width K
// over a sequence split contiguously across the ranks of a communicator,
// built once and used by every call on that split (every layer, every
// training step), as a halo is built once in Cabana.
//
// Rank r holds steps [offsets[r], offsets[r+1]) (any lengths, zero
// included). gather() brings each rank the K−1 steps before its first one
// (its halo [B, K−1, C], from one or more predecessors; before step 0 rank
// 0's initial state, or zeros); scatter_add() sends the halo's gradient back
// and adds it to the owners' dx (rank 0: to d(initial state)). Both return
// the exchange in flight: launch the work that does not need it, then
// finish().
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
#include "kdnn/cp/sequence_split.hpp"

namespace kdnn::cp {

/// What one call's halo exchange moved, and the time it overlapped.
struct HaloStats {
  std::int64_t bytes_sent = 0, bytes_received = 0;
  int messages_sent = 0, messages_received = 0;
  /// Seconds from posting the messages to waiting for them: the compute that
  /// ran while they were in flight.
  double overlapped_seconds = 0;
  /// Seconds then blocked waiting for them (communication not hidden).
  double waited_seconds = 0;
};

template <class T, class ExecSpace>
struct HaloExchange;

class HaloPlan {
 public:
  /// Collective over `comm`: each rank gives its own number of steps (≥ 0)
  /// and the same K ≥ 1. One all-gather; a bad or differing argument throws
  /// the same kdnn::Error on every rank.
  HaloPlan(MPI_Comm comm, std::int64_t steps, int K) : comm_(comm), K_(K) {
    const char* op = "cp::HaloPlan";
    check_communicator(op, comm);
    const auto all = agree_on_signature(
        comm, op,
        [&] {
          if (steps < 0)
            fail(op, ": steps=", steps, ", expected >= 0 (this rank's sequence steps)");
          if (K < 1) fail(op, ": K=", K, ", expected >= 1 (the convolution's width)");
        },
        {{"K", K}, {"steps", steps, Field::any}});
    set_split(offsets_of(all, 1));
  }

  /// Local: from the split's step offsets (P + 1, the same on every rank),
  /// as a call that has gathered every rank's length holds them.
  HaloPlan(MPI_Comm comm, std::vector<std::int64_t> offsets, int K) : comm_(comm), K_(K) {
    set_split(std::move(offsets));
  }

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int ranks() const { return int(offsets_.size()) - 1; }
  int width() const { return K_; }  ///< K
  const std::vector<std::int64_t>& offsets() const { return offsets_; }
  std::int64_t begin() const { return offsets_[rank_]; }  ///< this rank's first step
  std::int64_t steps() const { return offsets_[rank_ + 1] - offsets_[rank_]; }
  /// The forward's pieces, every rank's (halo_pieces), with rank 0's initial
  /// state or without it.
  const std::vector<HaloPiece>& pieces(bool with_initial) const {
    return with_initial ? with_initial_ : without_initial_;
  }

  /// Starts the forward exchange: x [B, steps(), C] of this rank's steps,
  /// initial_state [B, K−1, C] on rank 0 only (optional) → halo [B, K−1, C],
  /// the K−1 steps before this rank's first. Collective; the arguments are
  /// checked on every rank together (one all-gather). The halo is complete
  /// after the exchange's finish().
  template <class T, class ExecSpace>
  HaloExchange<T, ExecSpace> gather(const ExecSpace& space,
                                    const StridedTensor3<const T, ExecSpace>& x,
                                    const StridedTensor3<const T, ExecSpace>& initial_state,
                                    const Tensor3<T, ExecSpace>& halo) const;

  /// Starts the backward exchange, gather()'s adjoint: dhalo [B, K−1, C],
  /// the gradient of the forward's halo, goes back to the ranks that own its
  /// steps and is added to their dx [B, steps(), C] and, on rank 0, to
  /// dinitial_state [B, K−1, C] (given there to receive the initial state's
  /// share; rank 0's own dhalo is added to it at once). What comes from
  /// other ranks is added by the exchange's finish(). Collective, checked as
  /// gather().
  template <class T, class ExecSpace>
  HaloExchange<T, ExecSpace> scatter_add(const ExecSpace& space,
                                         const Tensor3<const T, ExecSpace>& dhalo,
                                         const StridedTensor3<T, ExecSpace>& dx,
                                         const StridedTensor3<T, ExecSpace>& dinitial_state) const;

 private:
  void set_split(std::vector<std::int64_t> offsets) {
    MPI_Comm_rank(comm_, &rank_);
    offsets_ = std::move(offsets);
    with_initial_ = halo_pieces(offsets_, K_ - 1, true);
    without_initial_ = halo_pieces(offsets_, K_ - 1, false);
  }

  MPI_Comm comm_;
  int rank_ = 0, K_;
  std::vector<std::int64_t> offsets_;
  std::vector<HaloPiece> with_initial_, without_initial_;
};

}  // namespace kdnn::cp

#include "kdnn/cp/impl/halo_exchange.hpp"
