// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::cp context-parallel Mamba-2 conv1d (+ SiLU) and dt softplus: the
// sequence is split across the ranks of a communicator, contiguously (any
// lengths, zero included) or, with a HaloPlan, under any SequenceLayout
// (each rank's segments one after another), each rank holding x [B, L_r, C]
// and dt [B, L_r, H] of its steps. The result on every rank equals the single-rank operators
// (kdnn/ssm/) applied to the whole sequence, restricted to the rank's steps.
//
// Forward: a segment's first K−1 outputs read the K−1 steps before its
// first one (its halo), owned by one or more ranks (several when they hold
// fewer than K−1 steps; the rank itself when it holds the steps before one
// of its segments; rank 0 owns the sequence's initial state). The halo
// pieces travel point to point (MPI_Isend/Irecv) while the rank computes
// dt_out and the outputs that need no halo; then the first K−1 outputs.
// Every rank receives exactly B·min(K−1, steps before it)·C elements, which
// does not depend on L or on the number of ranks; a rank sends as much when
// the ranks after it hold at least K−1 steps each.
// Backward: the gradient of each halo piece goes back to the rank that owns
// those steps and is added to its dx (rank 0: to d(initial state)), sent
// before, and received after, the rank's dx, dw, dbias and dt backward.
// dw, dbias and ddt_bias are this rank's partial sums: allreduce_sum adds
// them over the ranks.
//
// Packed sequences (conv.seq_idx [B, L_r] on every rank, or on none): the
// ranks all-gather the ids at their edges (each rank's first id and last K−1
// ids), so that each rank knows the sequence ids of its halo's steps; a
// window then stops at a start wherever it falls, as on one rank.
//
// Checks are collective: a bad argument on any rank, or a shape, dtype,
// K or option that differs between ranks, throws the same kdnn::Error on
// every rank before any message is sent. They take one all-gather per call
// (and one more with seq_idx, for the ids at the ranks' edges).
//
// The exchange is a HaloPlan's (cp/halo_plan.hpp): the caller's, made once
// for the split and K and used by every layer and step, or one each call
// makes from the lengths its checks gathered.
//
// Device memory is staged through host buffers unless the MPI library is
// CUDA-aware (cp/impl/mpi_memory.hpp).
//
// Types as the single-rank operators': T for the activations, the halo and
// dt; compute_t<T> for the conv's weight and bias, dt_bias, dt_out and their
// gradients. T is float or double for now: with a 16-bit T the gradient of
// the halo, a partial sum, must travel and be added in float so that dx is
// rounded once, as on one rank (a static_assert says so).
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdint>

#include "kdnn/core/tensor.hpp"
#include "kdnn/cp/halo_plan.hpp"
#include "kdnn/ssm/causal_conv1d.hpp"
#include "kdnn/ssm/dt_softplus.hpp"

namespace kdnn::cp {

struct ConvDtOptions {
  ssm::CausalConv1dOptions conv;
  ssm::DtSoftplusOptions dt;
};

/// The arguments of conv_dt_forward on one rank.
template <class T, class ExecSpace>
struct ConvDtForward {
  /// The conv on this rank's steps: x [B, L_r, C], w, bias as in
  /// ssm::ConvForward; initial_state is the sequence's, given on rank 0 only
  /// (or nowhere: zeros); final_state (optional, any rank) receives the last
  /// K−1 steps before the end of this rank's last segment (the sequence's
  /// final state on the rank whose last segment ends the sequence).
  ssm::ConvForward<T, ExecSpace> conv;
  /// Output [B, K−1, C], or with a plan [B, plan.halo_rows(), C]: the K−1
  /// steps before each of this rank's segments (zeros before the sequence
  /// without an initial state). Keep it for the backward.
  Tensor3<T, ExecSpace> halo;
  Tensor3<const T, ExecSpace> dt;                 ///< [B, L_r, H] (H may be 0)
  Vector<const compute_t<T>, ExecSpace> dt_bias;  ///< [H]
  Tensor3<compute_t<T>, ExecSpace> dt_out;        ///< output [B, L_r, H]
};

/// The arguments of conv_dt_backward on one rank.
template <class T, class ExecSpace>
struct ConvDtBackward {
  /// As ssm::ConvBackward on this rank's steps, with initial_state = the
  /// forward's halo (required when K > 1); dfinal_state optional on any rank
  /// (the gradient of its final_state); dinitial_state is the sequence's, on
  /// rank 0 only. dw and dbias receive this rank's partial sums.
  ssm::ConvBackward<T, ExecSpace> conv;
  Tensor3<const T, ExecSpace> dt;                  ///< [B, L_r, H]
  Vector<const compute_t<T>, ExecSpace> dt_bias;   ///< [H]
  Tensor3<const compute_t<T>, ExecSpace> ddt_out;  ///< [B, L_r, H]
  Tensor3<T, ExecSpace> ddt;                       ///< output [B, L_r, H]
  Vector<compute_t<T>, ExecSpace> ddt_bias;        ///< output [H]: this rank's partial sum
};

}  // namespace kdnn::cp

#include "kdnn/cp/impl/conv_dt_impl.hpp"

namespace kdnn::cp {

/// y, final state, halo and dt_out on this rank (see above). Collective over
/// `comm`; returns when the exchange is complete (the kernels it launched
/// after it are asynchronous on `space`). Makes the halo plan of the call's
/// split from the lengths its checks gather (no collective more).
template <class ExecSpace, class T>
HaloStats conv_dt_forward(const ExecSpace& space, MPI_Comm comm,
                          const ConvDtForward<T, ExecSpace>& args, const ConvDtOptions& opts = {}) {
  return impl::conv_dt_forward(space, comm, nullptr, args, opts);
}

/// As above, with a plan made once for this split and K (cp/halo_plan.hpp),
/// over its communicator: x must hold plan.steps() steps, w K = plan.width().
template <class ExecSpace, class T>
HaloStats conv_dt_forward(const ExecSpace& space, const HaloPlan& plan,
                          const ConvDtForward<T, ExecSpace>& args, const ConvDtOptions& opts = {}) {
  return impl::conv_dt_forward(space, plan.comm(), &plan, args, opts);
}

/// dx, dw, dbias, d(initial state), ddt and ddt_bias on this rank (see
/// above). Collective over `comm`.
template <class ExecSpace, class T>
HaloStats conv_dt_backward(const ExecSpace& space, MPI_Comm comm,
                           const ConvDtBackward<T, ExecSpace>& args,
                           const ConvDtOptions& opts = {}) {
  return impl::conv_dt_backward(space, comm, nullptr, args, opts);
}

/// As above, with the forward's plan.
template <class ExecSpace, class T>
HaloStats conv_dt_backward(const ExecSpace& space, const HaloPlan& plan,
                           const ConvDtBackward<T, ExecSpace>& args,
                           const ConvDtOptions& opts = {}) {
  return impl::conv_dt_backward(space, plan.comm(), &plan, args, opts);
}

/// Sums `view` (contiguous, float or double) over the ranks of `comm`, in
/// place: the parameter gradients' partial sums become the totals.
/// Collective; blocks until done.
template <class View>
void allreduce_sum(MPI_Comm comm, const View& view) {
  using T = typename View::non_const_value_type;
  static_assert(!std::is_const_v<typename View::value_type>, "allreduce_sum: a writable View");
  using Space = typename View::execution_space;
  using Flat =
      Kokkos::View<T*, typename View::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const int n = int(view.span());
  if (impl::mpi_reaches<typename View::memory_space>()) {
    Space().fence();
    MPI_Allreduce(MPI_IN_PLACE, view.data(), n, impl::mpi_sum_type<T>(), MPI_SUM, comm);
    return;
  }
  impl::MpiBuffer<T, Space> buffer("kdnn::cp::allreduce_sum", view.span());
  Kokkos::deep_copy(buffer.device, Flat(view.data(), view.span()));
  buffer.to_mpi(Space());
  MPI_Allreduce(MPI_IN_PLACE, buffer.mpi_data(), n, impl::mpi_sum_type<T>(), MPI_SUM, comm);
  buffer.from_mpi(Space());
  Kokkos::deep_copy(Flat(view.data(), view.span()), buffer.device);
}

}  // namespace kdnn::cp
