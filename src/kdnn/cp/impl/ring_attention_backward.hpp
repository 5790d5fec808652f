// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The ring backward of context-parallel attention (cp/attention.hpp). The
// K/V blocks go round the ring as in the forward (ring_attention.hpp), each
// sent on while it is computed. Each block's gradient dK/dV follows it in
// one accumulator per rank: at step s a rank holds rank (rank − s) mod R's
// K/V and that block's accumulator, which has visited the ranks before it;
// it adds its queries' contributions (the single-rank backward per pair of
// segments, with the whole sequence's O and lse, so each pair's
// probabilities are the whole softmax's, adding into dQ and the
// accumulator) and the accumulators then shift one rank along the ring in
// place (ring_shift.hpp). After R steps each rank holds its own block's
// gradient. dQ stays local. Buffers: two K/V blocks and one accumulator.
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
#include "kdnn/cp/impl/ring_shift.hpp"
#include "kdnn/cp/impl/segment_views.hpp"
#include "kdnn/cp/impl/sequence_rows.hpp"
#include "kdnn/cp/impl/timed_wait.hpp"
#include "kdnn/cp/sequence_layout.hpp"

namespace kdnn::cp::impl {

constexpr int kRingGradientTag = 0x6b67;

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
                    const std::vector<Tensor3<T, ExecSpace>>& lse) {
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
      blk.lse = lse[i];
      blk.dout = rows_in(a.dout, q_rows[i].range());
      blk.dq = rows_in(a.dq, q_rows[i].range());
      blk.dk = rows_in(dk, k_rows[j].range());
      blk.dv = rows_in(dv, k_rows[j].range());
      blk.mask = a.mask;
      backward_pieces(space, blk, opts, packing, pieces);
    }
  }
}

/// Values per message of the gradients' shift (ring_shift.hpp): 1 MiB of
/// float.
constexpr std::size_t kGradientChunk = std::size_t(1) << 18;

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
  kdnn::impl::fill_strided(space, a.dq, T(0));
  kdnn::impl::fill_strided(space, a.dk, T(0));
  kdnn::impl::fill_strided(space, a.dv, T(0));
  std::vector<Tensor3<T, ExecSpace>> lse;  // per query segment, its rows of a.lse (contiguous)
  for (const auto& r : local_rows(layout.segments(rank))) {
    lse.emplace_back("kdnn::cp::ring_lse", B, H, r.steps);
    Kokkos::deep_copy(space, lse.back(),
                      Kokkos::subview(a.lse, Kokkos::ALL, Kokkos::ALL, r.range()));
  }
  if (R == 1) {
    backward_block(space, layout, packing, rank, rank, a, opts, a.k, a.v, a.dk, a.dv, lse);
    return {};
  }
  std::int64_t longest = 0;
  for (int r = 0; r < R; ++r) longest = std::max(longest, layout.local_steps(r));
  const std::size_t most = kv.elements(longest);
  std::array<MpiBuffer<T, ExecSpace>, 2> blocks{MpiBuffer<T, ExecSpace>("kdnn::cp::ring_kv", most),
                                                MpiBuffer<T, ExecSpace>("kdnn::cp::ring_kv", most)};
  const MpiBuffer<T, ExecSpace> acc("kdnn::cp::ring_dkv", most);
  const MpiBuffer<T, ExecSpace> stage("kdnn::cp::ring_dkv_chunk", std::min(most, kGradientChunk));
  pack_kv(space, a.k, a.v, blocks[0].device);
  blocks[0].to_mpi(space);
  ExchangeStats stats;
  const int right = (rank + 1) % R, left = (rank + R - 1) % R;
  for (int s = 0; s < R; ++s) {
    const int src = (rank + R - s) % R, next = (rank + 2 * R - s - 1) % R;
    const std::int64_t L = layout.local_steps(src);
    const std::size_t here = kv.elements(L), in = kv.elements(layout.local_steps(next));
    std::vector<MPI_Request> requests;
    if (s + 1 < R) {  // the next block arrives while this one is computed
      requests.resize(2);
      MPI_Irecv(blocks[(s + 1) % 2].mpi_data(), int(in), mpi_type<T>(), left, kRingTag, comm,
                &requests[0]);
      MPI_Isend(blocks[s % 2].mpi_data(), int(here), mpi_type<T>(), right, kRingTag, comm,
                &requests[1]);
      stats.bytes_sent += std::int64_t(here * sizeof(T)), ++stats.messages_sent;
      stats.bytes_received += std::int64_t(in * sizeof(T)), ++stats.messages_received;
    }
    const double posted = MPI_Wtime();
    if (s == 0) {  // this rank's own block's accumulator starts here
      Kokkos::deep_copy(
          space, Kokkos::subview(acc.device, std::pair<std::size_t, std::size_t>(0, here)), T(0));
    }
    const T* block = blocks[s % 2].device.data();
    const auto k = s == 0 ? a.k : kv.k<T, ExecSpace>(block, L);
    const auto v = s == 0 ? a.v : kv.v<T, ExecSpace>(block, L);
    const StridedTensor4<T, ExecSpace> dk_acc =
        Tensor4<T, ExecSpace>(acc.device.data(), B, Hkv, L, D);
    const StridedTensor4<T, ExecSpace> dv_acc = Tensor4<T, ExecSpace>(
        acc.device.data() + std::size_t(B) * Hkv * std::size_t(L) * D, B, Hkv, L, Dv);
    backward_block(space, layout, packing, rank, src, a, opts, k, v, dk_acc, dv_acc, lse);
    ExchangeStats step;
    timed_wait(space, requests, posted, lock, step);
    stats.overlapped_seconds += step.overlapped_seconds;
    stats.waited_seconds += step.waited_seconds;
    // The accumulator goes on to the right; the left's (block `next`'s, or at
    // the last step this rank's own) takes its place.
    stats += shift_in_place(space, comm, lock, left, right, kRingGradientTag, acc, here, in, stage);
    if (s + 1 < R) blocks[(s + 1) % 2].from_mpi(space);
  }
  // After R shifts the accumulator holds this rank's own block's gradient.
  const std::int64_t L = layout.local_steps(rank);
  add_rows(space, a.dk, 0, kv.k<T, ExecSpace>(acc.device.data(), L));
  add_rows(space, a.dv, 0, kv.v<T, ExecSpace>(acc.device.data(), L));
  return stats;
}

}  // namespace kdnn::cp::impl
