// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::cp context-parallel SSD: Mamba-2's chunked scan (kdnn/ssm/ssd.hpp)
// with the sequence split across the ranks of a communicator, contiguously
// (any lengths: uneven, shorter than a chunk, zero) or under any
// SequenceLayout (cp/sequence_layout.hpp; the load-balanced layout of the
// attention layers included). Each rank passes the single-rank operator's
// argument structs holding its own steps of x, dt, B, C (and dy), its
// segments one after another; A and D are the same on every rank. The
// result on every rank equals the single-rank operator on the whole
// sequence, restricted to the rank's steps, to round-off (a segment's chunks
// start at its first step, so the chunking, and with it the order of the
// sums, differs).
//
// State passing. A segment acts on the state that enters it as h_out =
// Λ·h_in + S, with Λ = exp(Σ dt·A) over the segment and S its final state
// from a zero state (per batch entry and head). Each rank computes its
// segments' summaries (rank 0 also the sequence's initial state's) and
// all-gathers them (MPI_Iallgatherv) while it computes Y_diag + D·x, which
// needs no state. The scan of the summaries before a segment in sequence
// order gives its true initial state h_in; the chunk states are corrected
// by it (H_c += (Π_{c'<c} decay_c')·h_in) and Y_off is added.
// (cp/impl/ssd_summaries.hpp.)
//
// The backward mirrors it: each segment's reverse summary (Λ and the
// gradient of its initial state from the gradients inside it) is gathered
// with the forward summary while the Y_diag backward runs; a reverse scan
// over the segments after it gives the gradient of the state leaving it.
//
// A rank with several segments runs the single-rank steps on each: on
// views of its memory when B = 1, else on copies of the segment's rows
// (cp/impl/segment_views.hpp).
//
// Traffic: each rank sends its segments' summaries, B·H·(1 + P·N) values
// each (1 + 2·P·N in the backward), rank 0 one more (the initial state's),
// to each of the other R − 1 ranks; independent of L.
//
// Packed sequences (seq_idx [B, L_r] on every rank, or on none): the ranks
// all-gather the ids at their segments' edges; where a segment's first step
// starts a sequence (its id differs from the step before it), the state
// entering the segment is dropped and its summary passes none of it on (Λ =
// 0, and dS = 0 in the backward). Starts inside a segment reset its chunks
// as on one rank.
// With one batch entry, cu_seqlens [S_r + 1] (optional, any rank holding
// one segment) are the rank's own offsets: 0, each start inside its steps,
// then L_r; the rank's sequence_states [S_r, H, P, N] receive the state after each of those
// segments' last step (the true state, the other ranks' included): the
// final state of each sequence that ends on the rank, wherever it started,
// and for the last segment the state at the rank's end.
//
// Per rank: initial_state (forward and backward) and dinitial_state belong
// to the start of the sequence, rank 0 only; final_state (optional, any
// rank) receives the state at the end of the rank's last segment (the
// sequence's final state on the rank whose last segment ends it),
// dfinal_state (optional, any rank) is the gradient of that state. dA and
// dD receive this rank's partial sums: cp::allreduce_sum adds them over the
// ranks. Checks are collective, as in
// cp/conv_dt.hpp: every rank throws the same kdnn::Error.
#include <mpi.h>

#include <cstdint>

#include "kdnn/cp/sequence_layout.hpp"
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

/// y (and the final state at the end of this rank's steps) on this rank,
/// the sequence split contiguously (each rank's length gathered by the
/// checks). Collective over `comm`.
template <class ExecSpace, class T>
StateStats ssd_forward(const ExecSpace& space, MPI_Comm comm,
                       const ssm::SsdForward<T, ExecSpace>& args,
                       const ssm::SsdOptions& opts = {}) {
  return impl::ssd_forward(space, comm, nullptr, args, opts);
}

/// As above, under `layout` (the same on every rank of `comm`): x holds
/// this rank's segments one after another.
template <class ExecSpace, class T>
StateStats ssd_forward(const ExecSpace& space, MPI_Comm comm, const SequenceLayout& layout,
                       const ssm::SsdForward<T, ExecSpace>& args,
                       const ssm::SsdOptions& opts = {}) {
  return impl::ssd_forward(space, comm, &layout, args, opts);
}

/// dx, ddt, dB, dC on this rank's steps, this rank's partial sums of dA and
/// dD, and d(initial state) on rank 0. Collective over `comm`.
template <class ExecSpace, class T>
StateStats ssd_backward(const ExecSpace& space, MPI_Comm comm,
                        const ssm::SsdBackward<T, ExecSpace>& args,
                        const ssm::SsdOptions& opts = {}) {
  return impl::ssd_backward(space, comm, nullptr, args, opts);
}

/// As above, under `layout`.
template <class ExecSpace, class T>
StateStats ssd_backward(const ExecSpace& space, MPI_Comm comm, const SequenceLayout& layout,
                        const ssm::SsdBackward<T, ExecSpace>& args,
                        const ssm::SsdOptions& opts = {}) {
  return impl::ssd_backward(space, comm, &layout, args, opts);
}

}  // namespace kdnn::cp
