// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::cp context-parallel SSD: Mamba-2's chunked scan (kdnn/ssm/ssd.hpp)
// with the sequence split contiguously across the ranks of a communicator
// (any lengths: uneven, shorter than a chunk, zero). Each rank passes the
// single-rank operator's argument structs holding its own steps of x, dt, B,
// C (and dy); A and D are the same on every rank. The result on every rank
// equals the single-rank operator on the whole sequence, restricted to the
// rank's steps, to round-off (a rank's chunks start at its first step, so
// the chunking, and with it the order of the sums, differs).
//
// State passing. A rank's segment acts on the state that enters it as
// h_out = Λ_r·h_in + S_r, with Λ_r = exp(Σ dt·A) over the segment and S_r
// its final state from a zero state (per batch entry and head). Each rank
// computes its summary (Λ_r, S_r; rank 0's S_0 includes the sequence's
// initial state) and all-gathers it (MPI_Iallgather) while it computes
// Y_diag + D·x, which needs no state. The exclusive scan of the summaries of
// the ranks before it gives its true initial state
// h_in = Σ_{q<r} (Π_{q<k<r} Λ_k)·S_q; the chunk states are corrected by it
// (H_c += (Π_{c'<c} decay_c')·h_in) and Y_off is added.
//
// The backward mirrors it: each rank's reverse summary (Λ_r and the
// gradient of its initial state from the gradients inside it) is gathered
// with the forward summary while the Y_diag backward runs; a reverse scan
// over the ranks after it gives the gradient of the state leaving it.
//
// Traffic: each rank sends its summary, B·H·(1 + P·N) values (1 + 2·P·N
// in the backward), to each of the other R − 1 ranks; independent of L.
//
// Packed sequences (seq_idx [B, L_r] on every rank, or on none): the ranks
// all-gather the ids at their edges; where a rank's first step starts a
// sequence (its id differs from the step before it), the state entering the
// rank is dropped and its summary passes none of it on (Λ_r = 0, and dS_r =
// 0 in the backward). Starts inside a rank reset its chunks as on one rank.
// With one batch entry, cu_seqlens [S_r + 1] (optional, any rank) are the
// rank's own offsets: 0, each start inside its steps, then L_r; the rank's
// sequence_states [S_r, H, P, N] receive the state after each of those
// segments' last step (the true state, the other ranks' included): the
// final state of each sequence that ends on the rank, wherever it started,
// and for the last segment the state at the rank's end.
//
// Per rank: initial_state (forward and backward) and dinitial_state belong
// to the start of the sequence, rank 0 only; final_state (optional, any
// rank) receives the state at the end of the rank's steps (the last rank's
// is the sequence's final state), dfinal_state (optional, any rank) is the
// gradient of that state. dA and dD receive this rank's partial sums:
// cp::allreduce_sum adds them over the ranks. Checks are collective, as in
// cp/conv_dt.hpp: every rank throws the same kdnn::Error.
#include <mpi.h>

#include <cstdint>

#include "kdnn/ssm/ssd.hpp"

namespace kdnn::cp {

/// What one call's summary exchange moved, and the time it overlapped.
struct StateStats {
  /// Bytes of this rank's summary times the R − 1 ranks that receive it.
  std::int64_t bytes_sent = 0;
  /// Bytes of the other ranks' summaries this rank receives.
  std::int64_t bytes_received = 0;
  /// Seconds from starting the all-gather to waiting for it: the compute
  /// (Y_diag, or its backward) that ran while it was in flight.
  double overlapped_seconds = 0;
  /// Seconds then blocked waiting for it (communication not hidden).
  double waited_seconds = 0;
};

}  // namespace kdnn::cp

#include "kdnn/cp/impl/ssd_impl.hpp"

namespace kdnn::cp {

/// y (and the final state at the end of this rank's steps) on this rank.
/// Collective over `comm`.
template <class ExecSpace, class T>
StateStats ssd_forward(const ExecSpace& space, MPI_Comm comm,
                       const ssm::SsdForward<T, ExecSpace>& args,
                       const ssm::SsdOptions& opts = {}) {
  return impl::ssd_forward(space, comm, args, opts);
}

/// dx, ddt, dB, dC on this rank's steps, this rank's partial sums of dA and
/// dD, and d(initial state) on rank 0. Collective over `comm`.
template <class ExecSpace, class T>
StateStats ssd_backward(const ExecSpace& space, MPI_Comm comm,
                        const ssm::SsdBackward<T, ExecSpace>& args,
                        const ssm::SsdOptions& opts = {}) {
  return impl::ssd_backward(space, comm, args, opts);
}

}  // namespace kdnn::cp
