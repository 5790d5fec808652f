// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The all_gather form of context-parallel attention (cp/attention.hpp): the
// K/V heads are taken a slice at a time (`kv_heads` of them, so the
// gathered keys stay bounded); each slice's K/V of every rank is gathered
// (MPI_Iallgatherv) and put in sequence order, and each of this rank's
// query segments attends to all of it in one single-rank call, placed by
// the mask's positions (piece by piece, block_pieces.hpp): no merge; the
// sinks join at the end. Backward: the slice is gathered again,
// each segment's call gives dQ (its own rows) and a dK/dV over the whole
// sequence, summed over the segments, and every rank's rows of that sum go
// back to it summed over the ranks (MPI_Ireduce_scatter).
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
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

/// The K/V heads of one all-gathered slice: ⌈Hkv/R⌉ unless the caller
/// chose (`asked` > 0), so that a slice of the whole sequence is about
/// the size of a rank's own K/V.
inline int gather_slice_heads(int asked, int Hkv, int R) {
  return std::max(1, std::min(Hkv, asked > 0 ? asked : (Hkv + R - 1) / R));
}

/// One slice of K/V heads gathered from every rank, in sequence order.
template <class ExecSpace, class T>
struct GatheredKv {
  const SequenceLayout& layout;
  SequenceMap<ExecSpace> map;
  int B, D, Dv, heads;  ///< heads: the largest slice
  MpiBuffer<T, ExecSpace> send, recv;
  Tensor4<T, ExecSpace> k, v;  ///< [B, heads, S, ·]

  GatheredKv(const ExecSpace& space, const SequenceLayout& l, int rank, int B_, int D_, int Dv_,
             int heads_)
      : layout(l),
        map(space, l),
        B(B_),
        D(D_),
        Dv(Dv_),
        heads(heads_),
        send("kdnn::cp::gather_send", elements(l.local_steps(rank))),
        recv("kdnn::cp::gather_recv", elements(l.length())),
        k("kdnn::cp::gathered_k", B, heads, l.length(), D),
        v("kdnn::cp::gathered_v", B, heads, l.length(), Dv) {}

  std::size_t elements(std::int64_t L, int h = -1) const {
    return std::size_t(B) * std::size_t(h < 0 ? heads : h) * std::size_t(L) * (D + Dv);
  }
  /// Every rank's piece of a slice of h heads in the gathered buffer: its
  /// size and start (MPI's counts and displacements), and where its k and
  /// its v begin.
  struct Pieces {
    std::vector<int> counts, displs;
    std::vector<std::size_t> k_at, v_at;
    std::size_t total = 0;
  };
  Pieces pieces(int h) const {
    Pieces p;
    for (int r = 0; r < layout.ranks(); ++r) {
      const std::int64_t L = layout.local_steps(r);
      p.counts.push_back(int(elements(L, h)));
      p.displs.push_back(int(p.total));
      p.k_at.push_back(p.total);
      p.v_at.push_back(p.total + std::size_t(B) * h * std::size_t(L) * D);
      p.total += elements(L, h);
    }
    return p;
  }

  /// k, v ← the slice `kv` of every rank's (k_mine, v_mine), in sequence order.
  void gather(const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock, int rank,
              const StridedTensor4<const T, ExecSpace>& k_mine,
              const StridedTensor4<const T, ExecSpace>& v_mine, HeadRange kv,
              ExchangeStats& stats) {
    const int h = kv.count(), R = layout.ranks();
    const std::int64_t L = layout.local_steps(rank);
    pack_rows(space, StridedTensor4<const T, ExecSpace>(heads_of(k_mine, kv.range())),
              send.device.data());
    pack_rows(space, StridedTensor4<const T, ExecSpace>(heads_of(v_mine, kv.range())),
              send.device.data() + std::size_t(B) * h * std::size_t(L) * D);
    send.to_mpi(space);
    const Pieces p = pieces(h);
    const int own = p.counts[std::size_t(rank)];
    std::vector<MPI_Request> request(1);
    MPI_Iallgatherv(send.mpi_data(), own, mpi_type<T>(), recv.mpi_data(), p.counts.data(),
                    p.displs.data(), mpi_type<T>(), comm, request.data());
    count(stats, R, std::size_t(own), p.total - std::size_t(own));
    ExchangeStats step;
    timed_wait(space, request, MPI_Wtime(), lock, step);
    stats.waited_seconds += step.waited_seconds;
    recv.from_mpi(space);
    const std::pair<int, int> slice(0, h);
    to_sequence(space, map, recv.device.data(), part_offsets(space, p.k_at),
                StridedTensor4<T, ExecSpace>(heads_of(k, slice)));
    to_sequence(space, map, recv.device.data(), part_offsets(space, p.v_at),
                StridedTensor4<T, ExecSpace>(heads_of(v, slice)));
  }

  /// The bytes of one collective: `out` values to each of the other ranks,
  /// `in` values from them all.
  static void count(ExchangeStats& stats, int R, std::size_t out, std::size_t in) {
    stats.bytes_sent += std::int64_t(out * sizeof(T)) * (R - 1);
    stats.bytes_received += std::int64_t(in * sizeof(T));
    stats.messages_sent += R - 1, stats.messages_received += R - 1;
  }
};

/// Whether `pieces` (of disjoint query rows) reach all `rows` queries.
inline bool reach_every_query(const std::vector<BlockPiece>& pieces, int rows) {
  int n = 0;
  for (const BlockPiece& p : pieces) n += p.q_rows.second - p.q_rows.first;
  return n == rows;
}

/// The all_gather forward on checked arguments (agreed on every rank).
template <class ExecSpace, class T>
ExchangeStats gather_forward(const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock,
                             const SequenceLayout& layout, const Packing& packing, int rank,
                             const attention::FusedAttentionForward<T, ExecSpace>& a,
                             const attention::FusedAttentionOptions& opts, int slice_heads) {
  const int H = int(a.q.extent(1)), Hkv = int(a.k.extent(1)), g = H / Hkv;
  const Segment everything{0, layout.length()};
  GatheredKv<ExecSpace, T> kv(space, layout, rank, int(a.q.extent(0)), int(a.k.extent(3)),
                              int(a.v.extent(3)), slice_heads);
  const auto& mine = layout.segments(rank);
  const auto rows = local_rows(mine);
  ExchangeStats stats;
  for (int k0 = 0; k0 < Hkv; k0 += slice_heads) {
    const HeadRange slice{k0, std::min(Hkv, k0 + slice_heads)};
    const HeadRange heads{slice.begin * g, slice.end * g};
    kv.gather(space, comm, lock, rank, a.k, a.v, slice, stats);
    const auto mask = mask_for(space, a.mask, heads, H);  // the slice's, for every segment
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const auto pieces = block_pieces(packing, a.mask, mine[i], everything);
      attention::FusedAttentionForward<T, ExecSpace> blk;  // no sinks: they join at the end
      blk.q = block_of(a.q, heads.range(), rows[i].range());
      blk.k = heads_of(kv.k, slice.from(k0));
      blk.v = heads_of(kv.v, slice.from(k0));
      blk.o = block_of(a.o, heads.range(), rows[i].range());
      blk.lse = lse_block(space, a.lse, heads.range(), rows[i].range(), false);
      blk.mask = mask;
      if (!reach_every_query(pieces, rows[i].steps)) {  // rows that see no key
        kdnn::impl::fill_strided(space, blk.o, T(0));
        Kokkos::deep_copy(space, blk.lse, -std::numeric_limits<T>::infinity());
      }
      forward_pieces(space, blk, opts, packing, pieces);
      put_lse_block(space, a.lse, blk.lse, heads.range(), rows[i].range());
    }
  }
  if (validate::given(a.sinks)) merge_sinks(space, a.o, a.lse, a.sinks);
  return stats;
}

/// The all_gather backward on checked arguments (agreed on every rank).
template <class ExecSpace, class T>
ExchangeStats gather_backward(const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock,
                              const SequenceLayout& layout, const Packing& packing, int rank,
                              const attention::FusedAttentionBackward<T, ExecSpace>& a,
                              const attention::FusedAttentionOptions& opts, int slice_heads) {
  const int H = int(a.q.extent(1)), Hkv = int(a.k.extent(1)), g = H / Hkv;
  const int B = int(a.q.extent(0)), D = int(a.k.extent(3)), Dv = int(a.v.extent(3));
  const int S = int(layout.length()), R = layout.ranks();
  const Segment everything{0, layout.length()};
  GatheredKv<ExecSpace, T> kv(space, layout, rank, B, D, Dv, slice_heads);
  // dK, dV of the slice over the whole sequence, summed over this rank's queries.
  Tensor4<T, ExecSpace> dk("kdnn::cp::gathered_dk", B, slice_heads, S, D),
      dv("kdnn::cp::gathered_dv", B, slice_heads, S, Dv);
  const auto& mine = layout.segments(rank);
  const auto rows = local_rows(mine);
  // The sums go back through the gather's own buffers, free once a slice
  // is in sequence order: every rank's rows out of `recv`, this rank's into
  // `send`.
  const auto &out = kv.recv, &in = kv.send;
  kdnn::impl::fill_strided(space, a.dq, T(0));
  ExchangeStats stats;
  for (int k0 = 0; k0 < Hkv; k0 += slice_heads) {
    const HeadRange slice{k0, std::min(Hkv, k0 + slice_heads)};
    const HeadRange heads{slice.begin * g, slice.end * g};
    const auto local = slice.from(k0);
    kv.gather(space, comm, lock, rank, a.k, a.v, slice, stats);
    const StridedTensor4<T, ExecSpace> dk_all = heads_of(dk, local), dv_all = heads_of(dv, local);
    kdnn::impl::fill_strided(space, dk_all, T(0));
    kdnn::impl::fill_strided(space, dv_all, T(0));
    const auto mask = mask_for(space, a.mask, heads, H);  // the slice's, for every segment
    for (std::size_t i = 0; i < mine.size(); ++i) {
      attention::FusedAttentionBackward<T, ExecSpace> blk;  // lse holds the sinks already
      blk.q = block_of(a.q, heads.range(), rows[i].range());
      blk.k = heads_of(kv.k, local);
      blk.v = heads_of(kv.v, local);
      blk.o = block_of(a.o, heads.range(), rows[i].range());
      blk.lse = lse_block(space, a.lse, heads.range(), rows[i].range(), true);
      blk.dout = block_of(a.dout, heads.range(), rows[i].range());
      blk.dq = block_of(a.dq, heads.range(), rows[i].range());
      blk.dk = dk_all, blk.dv = dv_all;
      blk.mask = mask;
      backward_pieces(space, blk, opts, packing,
                      block_pieces(packing, a.mask, mine[i], everything));
    }
    // Every rank's rows of the sums, to it, summed over the ranks.
    const int h = slice.count();
    const auto p = kv.pieces(h);
    from_sequence(space, kv.map, StridedTensor4<const T, ExecSpace>(dk_all), out.device.data(),
                  part_offsets(space, p.k_at));
    from_sequence(space, kv.map, StridedTensor4<const T, ExecSpace>(dv_all), out.device.data(),
                  part_offsets(space, p.v_at));
    out.to_mpi(space);
    std::vector<MPI_Request> request(1);
    MPI_Ireduce_scatter(out.mpi_data(), in.mpi_data(), p.counts.data(), mpi_sum_type<T>(), MPI_SUM,
                        comm, request.data());
    const std::size_t own = std::size_t(p.counts[std::size_t(rank)]);
    stats.bytes_sent += std::int64_t((p.total - own) * sizeof(T));
    stats.bytes_received += std::int64_t(own * sizeof(T)) * (R - 1);
    stats.messages_sent += R - 1, stats.messages_received += R - 1;
    ExchangeStats step;
    timed_wait(space, request, MPI_Wtime(), lock, step);
    stats.waited_seconds += step.waited_seconds;
    in.from_mpi(space);
    const std::size_t L = std::size_t(layout.local_steps(rank));
    unpack_rows(space, in.device.data(),
                StridedTensor4<T, ExecSpace>(heads_of(a.dk, slice.range())), false);
    unpack_rows(space, in.device.data() + std::size_t(B) * h * L * D,
                StridedTensor4<T, ExecSpace>(heads_of(a.dv, slice.range())), false);
  }
  return stats;
}

}  // namespace kdnn::cp::impl
