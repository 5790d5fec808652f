// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The ring backward of context-parallel attention (cp/attention.hpp). Two
// streams of messages go round the ring: the K/V blocks, as in the forward
// (ring_attention.hpp), and each block's accumulated gradient dK/dV, which
// follows one step behind. At step s a rank holds rank (rank − s) mod R's
// K/V; it waits for that block's dK/dV accumulator, which the rank before
// it (that computed the block at step s − 1) sent at the end of its step,
// adds its queries' contributions into it and into dQ (the single-rank
// backward per pair of segments, with the whole sequence's O and lse, so
// each pair's probabilities are the whole softmax's), and sends it on.
// After R steps each accumulator has visited every rank and arrives at its
// owner. dQ stays local. Buffers: two K/V blocks and two accumulators.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/impl/strided_fill.hpp"
#include "kdnn/cp/exchange_stats.hpp"
#include "kdnn/cp/impl/block_calls.hpp"
#include "kdnn/cp/impl/mpi_memory.hpp"
#include "kdnn/cp/impl/ring_attention.hpp"
#include "kdnn/cp/impl/segment_views.hpp"
#include "kdnn/cp/impl/sequence_rows.hpp"
#include "kdnn/cp/impl/timed_wait.hpp"
#include "kdnn/cp/sequence_layout.hpp"

namespace kdnn::cp::impl {

constexpr int kRingGradientTag = 0x6b67;

/// Scratch for one rank's pairs of segments: per query segment its lse rows
/// (contiguous), and a piece's gradients.
template <class ExecSpace, class T>
struct PairScratch {
  std::vector<Tensor3<T, ExecSpace>> lse;
  PieceGradients<ExecSpace, T> piece;
};

/// This rank's queries against one K/V block (rank `src`'s): each pair of
/// segments, piece by piece, adds its dQ into a.dq and its dK, dV into
/// `dk`, `dv` [B, Hkv, L_src, ·] (the block's contributions from this rank).
template <class ExecSpace, class T>
void backward_block(const ExecSpace& space, const SequenceLayout& layout, const Packing& packing,
                    int rank, int src, const attention::FusedAttentionBackward<T, ExecSpace>& a,
                    const attention::FusedAttentionOptions& opts,
                    const StridedTensor4<const T, ExecSpace>& k,
                    const StridedTensor4<const T, ExecSpace>& v,
                    const StridedTensor4<T, ExecSpace>& dk, const StridedTensor4<T, ExecSpace>& dv,
                    PairScratch<ExecSpace, T>& scratch) {
  const auto& mine = layout.segments(rank);
  const auto& theirs = layout.segments(src);
  const auto q_rows = local_rows(mine), k_rows = local_rows(theirs);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    for (std::size_t j = 0; j < theirs.size(); ++j) {
      const auto pieces = block_pieces(packing, a.mask, mine[i], theirs[j]);
      if (pieces.empty()) continue;
      attention::FusedAttentionBackward<T, ExecSpace> blk;  // lse holds the sinks already
      blk.q = rows_in(a.q, q_rows[i].range());
      blk.k = rows_in(k, k_rows[j].range());
      blk.v = rows_in(v, k_rows[j].range());
      blk.o = rows_in(a.o, q_rows[i].range());
      blk.lse = scratch.lse[i];
      blk.dout = rows_in(a.dout, q_rows[i].range());
      blk.dq = rows_in(a.dq, q_rows[i].range());
      blk.dk = rows_in(dk, k_rows[j].range());
      blk.dv = rows_in(dv, k_rows[j].range());
      blk.mask = a.mask;
      backward_pieces(space, blk, opts, packing, pieces, scratch.piece);
    }
  }
}

/// The ring backward on checked arguments (agreed on every rank). `lock`
/// (held, on `space`) is released while the ranks wait.
template <class ExecSpace, class T>
ExchangeStats ring_backward(const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock,
                            const SequenceLayout& layout, const Packing& packing, int rank,
                            const attention::FusedAttentionBackward<T, ExecSpace>& a,
                            const attention::FusedAttentionOptions& opts) {
  const int R = layout.ranks(), B = int(a.q.extent(0)), H = int(a.q.extent(1));
  const int Hkv = int(a.k.extent(1)), D = int(a.k.extent(3)), Dv = int(a.v.extent(3));
  const KvBlock kv{B, Hkv, D, Dv};  // also the layout of a block's gradient: dK then dV
  std::int64_t longest = 0;
  for (int r = 0; r < R; ++r) longest = std::max(longest, layout.local_steps(r));
  const std::size_t most = R > 1 ? kv.elements(longest) : 0;
  std::array<MpiBuffer<T, ExecSpace>, 2> blocks{MpiBuffer<T, ExecSpace>("kdnn::cp::ring_kv", most),
                                                MpiBuffer<T, ExecSpace>("kdnn::cp::ring_kv", most)};
  std::array<MpiBuffer<T, ExecSpace>, 2> grads{MpiBuffer<T, ExecSpace>("kdnn::cp::ring_dkv", most),
                                               MpiBuffer<T, ExecSpace>("kdnn::cp::ring_dkv", most)};
  if (R > 1) {
    pack_kv(space, a.k, a.v, blocks[0].device);
    blocks[0].to_mpi(space);
  }
  kdnn::impl::fill_strided(space, a.dq, T(0));
  kdnn::impl::fill_strided(space, a.dk, T(0));
  kdnn::impl::fill_strided(space, a.dv, T(0));
  PairScratch<ExecSpace, T> scratch;
  for (const auto& r : local_rows(layout.segments(rank))) {
    Tensor3<T, ExecSpace> lse("kdnn::cp::ring_lse", B, H, r.steps);
    Kokkos::deep_copy(space, lse, Kokkos::subview(a.lse, Kokkos::ALL, Kokkos::ALL, r.range()));
    scratch.lse.push_back(lse);
  }
  ExchangeStats stats;
  const int right = (rank + 1) % R, left = (rank + R - 1) % R;
  const auto count = [&](std::vector<MPI_Request>& requests, std::size_t n, bool out) {
    (out ? stats.bytes_sent : stats.bytes_received) += std::int64_t(n * sizeof(T));
    ++(out ? stats.messages_sent : stats.messages_received);
    requests.emplace_back();
    return &requests.back();
  };
  const auto wait = [&](std::vector<MPI_Request>& requests, double posted) {
    ExchangeStats step;
    timed_wait(space, requests, posted, lock, step);
    stats.overlapped_seconds += step.overlapped_seconds;
    stats.waited_seconds += step.waited_seconds;
    requests.clear();
  };
  std::vector<MPI_Request> sends;  // the previous step's gradient, still in flight
  for (int s = 0; s < R; ++s) {
    const int src = (rank + R - s) % R, next = (rank + 2 * R - s - 1) % R;
    const std::size_t here = kv.elements(layout.local_steps(src));
    std::vector<MPI_Request> requests;
    requests.reserve(3);
    if (s + 1 < R) {
      const std::size_t in = kv.elements(layout.local_steps(next));
      MPI_Irecv(blocks[(s + 1) % 2].mpi_data(), int(in), mpi_type<T>(), left, kRingTag, comm,
                count(requests, in, false));
      MPI_Isend(blocks[s % 2].mpi_data(), int(here), mpi_type<T>(), right, kRingTag, comm,
                count(requests, here, true));
    }
    std::vector<MPI_Request> gradient;
    if (s > 0) {  // the block's accumulator from the rank that computed it last step
      MPI_Irecv(grads[s % 2].mpi_data(), int(here), mpi_type<T>(), left, kRingGradientTag, comm,
                count(gradient, here, false));
    }
    const double posted = MPI_Wtime();
    const std::int64_t L = layout.local_steps(src);
    const T* block = blocks[s % 2].device.data();
    const auto k = s == 0 ? a.k : kv.k<T, ExecSpace>(block, L);
    const auto v = s == 0 ? a.v : kv.v<T, ExecSpace>(block, L);
    if (R == 1) {
      backward_block(space, layout, packing, rank, src, a, opts, k, v, a.dk, a.dv, scratch);
      break;
    }
    // This step's contributions add into the block's accumulator, which the
    // rank before sent at the end of its last step: no buffer of their own.
    auto& acc = grads[s % 2];
    if (s == 0) {
      Kokkos::deep_copy(
          space, Kokkos::subview(acc.device, std::pair<std::size_t, std::size_t>(0, here)), T(0));
    } else {
      wait(gradient, posted);
      acc.from_mpi(space);
    }
    const StridedTensor4<T, ExecSpace> dk_acc =
        Tensor4<T, ExecSpace>(acc.device.data(), B, Hkv, L, D);
    const StridedTensor4<T, ExecSpace> dv_acc = Tensor4<T, ExecSpace>(
        acc.device.data() + std::size_t(B) * Hkv * std::size_t(L) * D, B, Hkv, L, Dv);
    backward_block(space, layout, packing, rank, src, a, opts, k, v, dk_acc, dv_acc, scratch);
    if (!sends.empty()) wait(sends, posted);  // the last step's gradient, out of its buffer
    wait(requests, posted);
    acc.to_mpi(space);
    MPI_Isend(acc.mpi_data(), int(here), mpi_type<T>(), right, kRingGradientTag, comm,
              count(sends, here, true));
    if (s + 1 < R) blocks[(s + 1) % 2].from_mpi(space);
  }
  if (R > 1) {  // this rank's own block's gradient, back from the last rank to compute it
    const std::size_t own = kv.elements(layout.local_steps(rank));
    auto& acc = grads[R % 2];
    std::vector<MPI_Request> last;
    MPI_Irecv(acc.mpi_data(), int(own), mpi_type<T>(), left, kRingGradientTag, comm,
              count(last, own, false));
    const double posted = MPI_Wtime();
    wait(sends, posted);
    wait(last, posted);
    acc.from_mpi(space);
    const std::int64_t L = layout.local_steps(rank);
    add_rows(space, a.dk, 0, kv.k<T, ExecSpace>(acc.device.data(), L));
    add_rows(space, a.dv, 0, kv.v<T, ExecSpace>(acc.device.data(), L));
  }
  return stats;
}

}  // namespace kdnn::cp::impl
