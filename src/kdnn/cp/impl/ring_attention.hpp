// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The ring of context-parallel attention (cp/attention.hpp): every rank's
// K/V block visits every rank, passed to the next rank (rank + 1) while the
// block before it is computed. At step s a rank holds the block of rank
// (rank − s) mod R; it posts the receive of the next block and the send of
// this one, computes its queries' segments against the block's segments
// with the single-rank fused attention told their positions (a pair that
// the causal mask or the band hides entirely is skipped), merges each
// result into its (O, lse) (attention_merge.hpp), then waits. A block is
// one message: k [B, Hkv, L_src, D] then v [B, Hkv, L_src, Dv], packed.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/impl/strided_fill.hpp"
#include "kdnn/cp/exchange_stats.hpp"
#include "kdnn/cp/impl/attention_merge.hpp"
#include "kdnn/cp/impl/block_calls.hpp"
#include "kdnn/cp/impl/mpi_memory.hpp"
#include "kdnn/cp/impl/segment_views.hpp"
#include "kdnn/cp/impl/sequence_rows.hpp"
#include "kdnn/cp/impl/timed_wait.hpp"
#include "kdnn/cp/sequence_layout.hpp"

namespace kdnn::cp::impl {

constexpr int kRingTag = 0x6b66;

/// A rank's K/V block as one message: its size and its views.
struct KvBlock {
  int B, Hkv, D, Dv;
  std::size_t elements(std::int64_t L) const {
    return std::size_t(B) * Hkv * std::size_t(L) * (D + Dv);
  }
  template <class T, class ExecSpace>
  StridedTensor4<const T, ExecSpace> k(const T* data, std::int64_t L) const {
    return Tensor4<const T, ExecSpace>(data, B, Hkv, L, D);
  }
  template <class T, class ExecSpace>
  StridedTensor4<const T, ExecSpace> v(const T* data, std::int64_t L) const {
    return Tensor4<const T, ExecSpace>(data + std::size_t(B) * Hkv * std::size_t(L) * D, B, Hkv, L,
                                       Dv);
  }
};

/// buf ← k then v (any strides), packed row-major.
template <class ExecSpace, class T>
void pack_kv(const ExecSpace& space, const StridedTensor4<const T, ExecSpace>& k,
             const StridedTensor4<const T, ExecSpace>& v,
             const Kokkos::View<T*, typename ExecSpace::memory_space>& buf) {
  pack_rows(space, k, buf.data());
  pack_rows(space, v, buf.data() + k.size());
}

/// This rank's queries against one K/V block (rank `src`'s, k and v of its
/// local steps): each pair of segments, piece by piece (block_pieces.hpp),
/// computed into o_b/lse_b and merged into a's (O, lse).
template <class ExecSpace, class T>
void attend_block(const ExecSpace& space, const SequenceLayout& layout, const Packing& packing,
                  int rank, int src, const attention::FusedAttentionForward<T, ExecSpace>& a,
                  const attention::FusedAttentionOptions& opts,
                  const StridedTensor4<const T, ExecSpace>& k,
                  const StridedTensor4<const T, ExecSpace>& v,
                  const std::vector<Tensor4<T, ExecSpace>>& o_b,
                  const std::vector<Tensor3<T, ExecSpace>>& lse_b) {
  const auto& mine = layout.segments(rank);
  const auto& theirs = layout.segments(src);
  const auto q_rows = local_rows(mine), k_rows = local_rows(theirs);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    for (std::size_t j = 0; j < theirs.size(); ++j) {
      const auto pieces = block_pieces(packing, a.mask, mine[i], theirs[j]);
      if (pieces.empty()) continue;
      attention::FusedAttentionForward<T, ExecSpace> blk;  // no sinks: they join at the end
      blk.q = rows_in(a.q, q_rows[i].range());
      blk.k = rows_in(k, k_rows[j].range());
      blk.v = rows_in(v, k_rows[j].range());
      blk.o = o_b[i], blk.lse = lse_b[i], blk.mask = a.mask;
      if (!one_whole_piece(pieces, q_rows[i].steps, k_rows[j].steps)) {
        kdnn::impl::fill_strided(space, blk.o, T(0));  // rows no piece reaches see no key here
        Kokkos::deep_copy(space, lse_b[i], -std::numeric_limits<T>::infinity());
      }
      forward_pieces(space, blk, opts, packing, pieces);
      merge_block(space, a.o, a.lse, q_rows[i].first, StridedTensor4<const T, ExecSpace>(o_b[i]),
                  Tensor3<const T, ExecSpace>(lse_b[i]));
    }
  }
}

/// The ring forward on checked arguments (agreed on every rank). `lock`
/// (held, on `space`) is released while the ranks wait.
template <class ExecSpace, class T>
ExchangeStats ring_forward(const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock,
                           const SequenceLayout& layout, const Packing& packing, int rank,
                           const attention::FusedAttentionForward<T, ExecSpace>& a,
                           const attention::FusedAttentionOptions& opts) {
  const int R = layout.ranks(), B = int(a.q.extent(0)), H = int(a.q.extent(1));
  const KvBlock kv{B, int(a.k.extent(1)), int(a.k.extent(3)), int(a.v.extent(3))};
  std::int64_t longest = 0;
  for (int r = 0; r < R; ++r) longest = std::max(longest, layout.local_steps(r));
  // Two buffers: the block computed and the one arriving.
  std::array<MpiBuffer<T, ExecSpace>, 2> buf{
      MpiBuffer<T, ExecSpace>("kdnn::cp::ring_kv", R > 1 ? kv.elements(longest) : 0),
      MpiBuffer<T, ExecSpace>("kdnn::cp::ring_kv", R > 1 ? kv.elements(longest) : 0)};
  if (R > 1) {
    pack_kv(space, a.k, a.v, buf[0].device);
    buf[0].to_mpi(space);
  }
  kdnn::impl::fill_strided(space, a.o, T(0));
  Kokkos::deep_copy(space, a.lse, -std::numeric_limits<T>::infinity());
  std::vector<Tensor4<T, ExecSpace>> o_b;
  std::vector<Tensor3<T, ExecSpace>> lse_b;
  for (const Segment& s : layout.segments(rank)) {
    o_b.emplace_back("kdnn::cp::ring_o", B, H, s.steps(), a.v.extent(3));
    lse_b.emplace_back("kdnn::cp::ring_lse", B, H, s.steps());
  }

  ExchangeStats stats;
  const int right = (rank + 1) % R, left = (rank + R - 1) % R;
  for (int s = 0; s < R; ++s) {
    const int src = (rank + R - s) % R, next = (rank + 2 * R - s - 1) % R;
    std::vector<MPI_Request> requests;
    double posted = 0;
    if (s + 1 < R) {
      const std::size_t in = kv.elements(layout.local_steps(next));
      const std::size_t out = kv.elements(layout.local_steps(src));
      requests.resize(2);
      MPI_Irecv(buf[(s + 1) % 2].mpi_data(), int(in), mpi_type<T>(), left, kRingTag, comm,
                &requests[0]);
      MPI_Isend(buf[s % 2].mpi_data(), int(out), mpi_type<T>(), right, kRingTag, comm,
                &requests[1]);
      stats.bytes_sent += std::int64_t(out * sizeof(T));
      stats.bytes_received += std::int64_t(in * sizeof(T));
      ++stats.messages_sent, ++stats.messages_received;
      posted = MPI_Wtime();
    }
    const std::int64_t L = layout.local_steps(src);
    const T* block = buf[s % 2].device.data();
    attend_block(space, layout, packing, rank, src, a, opts,
                 s == 0 ? a.k : kv.k<T, ExecSpace>(block, L),
                 s == 0 ? a.v : kv.v<T, ExecSpace>(block, L), o_b, lse_b);
    if (!requests.empty()) {
      ExchangeStats step;
      timed_wait(space, requests, posted, lock, step);
      stats.overlapped_seconds += step.overlapped_seconds;
      stats.waited_seconds += step.waited_seconds;
      buf[(s + 1) % 2].from_mpi(space);
    }
  }
  if (validate::given(a.sinks)) merge_sinks(space, a.o, a.lse, a.sinks);
  return stats;
}

}  // namespace kdnn::cp::impl
