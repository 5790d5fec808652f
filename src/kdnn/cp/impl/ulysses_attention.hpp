// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The all_to_all form of context-parallel attention (DeepSpeed-Ulysses;
// cp/attention.hpp): one MPI_Ialltoallv trades each rank's steps of every
// head for every rank's steps of its own heads (head_split.hpp), so that
// each rank holds the whole sequence of its query heads and of the K/V
// heads they read; the single-rank fused attention runs on them (one call
// per run of heads, block_calls.hpp), and a second all-to-all returns O and
// lse to the ranks that hold the steps. Backward: q, k, v, o, dout and lse
// go out the same way, and dQ, dK, dV come back; a K/V head that two ranks
// read gets the sum of their gradients.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/impl/strided_fill.hpp"
#include "kdnn/cp/exchange_stats.hpp"
#include "kdnn/cp/impl/block_calls.hpp"
#include "kdnn/cp/impl/gather_attention.hpp"
#include "kdnn/cp/impl/head_split.hpp"
#include "kdnn/cp/impl/mpi_memory.hpp"
#include "kdnn/cp/impl/sequence_rows.hpp"
#include "kdnn/cp/impl/timed_wait.hpp"
#include "kdnn/cp/sequence_layout.hpp"

namespace kdnn::cp::impl {

/// What one rank's message holds: parts [B, heads, L, E] one after another.
struct MessageParts {
  int B;
  std::vector<std::array<int, 2>> parts;  ///< {heads, E}
  std::size_t offset(std::size_t part, std::int64_t L) const {
    std::size_t at = 0;
    for (std::size_t i = 0; i < part; ++i) {
      at += std::size_t(B) * std::size_t(parts[i][0]) * std::size_t(L) * std::size_t(parts[i][1]);
    }
    return at;
  }
  std::size_t size(std::int64_t L) const { return offset(parts.size(), L); }
};

/// The all-to-alls of the Ulysses form: every rank's heads (HeadSplit)
/// and the trades of tensors between "this rank's steps of every head" and
/// "the whole sequence of this rank's heads".
template <class ExecSpace, class T>
struct HeadExchange {
  /// A tensor [B, heads, L, E] to trade, and whether its heads are K/V heads.
  using Part = std::pair<StridedTensor4<const T, ExecSpace>, bool>;
  /// One message per rank, with its parts, as MPI_Ialltoallv needs it.
  struct Plan {
    std::vector<MessageParts> parts;  ///< [R]
    std::vector<std::int64_t> steps;  ///< [R]: L of each message
    std::vector<int> counts, displs;
    std::size_t total() const { return std::size_t(displs.back()) + std::size_t(counts.back()); }
    /// Where part i of rank r's message starts.
    std::size_t at(int r, std::size_t i) const {
      return std::size_t(displs[std::size_t(r)]) +
             parts[std::size_t(r)].offset(i, steps[std::size_t(r)]);
    }
  };
  /// What a trade brought to this rank.
  struct Received {
    MpiBuffer<T, ExecSpace> buf;
    Plan plan;
  };

  const SequenceLayout& layout;
  int rank, R, B;
  std::vector<HeadSplit> split;  ///< [R]
  SequenceMap<ExecSpace> map;

  HeadExchange(const ExecSpace& space, const SequenceLayout& l, int rank_, int B_, int H, int Hkv)
      : layout(l), rank(rank_), R(l.ranks()), B(B_), map(space, l) {
    for (int r = 0; r < R; ++r) split.push_back(HeadSplit::of(H, Hkv, R, r));
  }
  const HeadSplit& own() const { return split[std::size_t(rank)]; }
  const HeadRange& heads(int r, bool kv) const {
    return kv ? split[std::size_t(r)].kv : split[std::size_t(r)].query;
  }

  /// Out: each rank r gets its heads of every part at this rank's steps;
  /// in: this rank's heads of every rank's steps (gather_sequence reads them).
  Received heads_to_sequence(const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock,
                             const std::vector<Part>& parts, ExchangeStats& stats) const {
    const auto send = plan(
        parts, [](int r) { return r; }, true);
    const auto recv = plan(
        parts, [&](int) { return rank; }, false);
    MpiBuffer<T, ExecSpace> out("kdnn::cp::ulysses_send", send.total());
    Received in{MpiBuffer<T, ExecSpace>("kdnn::cp::ulysses_recv", recv.total()), recv};
    for (std::size_t i = 0; i < parts.size(); ++i) {
      for (int r = 0; r < R; ++r) {
        pack_rows(space,
                  StridedTensor4<const T, ExecSpace>(
                      heads_of(parts[i].first, heads(r, parts[i].second).range())),
                  out.device.data() + send.at(r, i));
      }
    }
    exchange(space, comm, lock, out, send, in, stats);
    return in;
  }
  /// The way back: out, each rank r gets every part's rows at its steps
  /// (this rank's heads of the whole sequence); in: every rank's heads at
  /// this rank's steps (gather_heads reads them).
  Received sequence_to_heads(const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock,
                             const std::vector<Part>& wholes, ExchangeStats& stats) const {
    const auto send = plan(
        wholes, [&](int) { return rank; }, false);
    const auto recv = plan(
        wholes, [](int r) { return r; }, true);
    MpiBuffer<T, ExecSpace> out("kdnn::cp::ulysses_send", send.total());
    Received in{MpiBuffer<T, ExecSpace>("kdnn::cp::ulysses_recv", recv.total()), recv};
    for (std::size_t i = 0; i < wholes.size(); ++i) {
      std::vector<std::size_t> at;
      for (int r = 0; r < R; ++r) at.push_back(send.at(r, i));
      from_sequence(space, map, wholes[i].first, out.device.data(), part_offsets(space, at));
    }
    exchange(space, comm, lock, out, send, in, stats);
    return in;
  }

  /// whole [B, own heads, S, E] ← part i of every rank's message.
  void gather_sequence(const ExecSpace& space, const Received& in, std::size_t i,
                       const StridedTensor4<T, ExecSpace>& whole) const {
    std::vector<std::size_t> at;
    for (int r = 0; r < R; ++r) at.push_back(in.plan.at(r, i));
    to_sequence(space, map, in.buf.device.data(), part_offsets(space, at), whole);
  }
  /// Part i of every rank's message as a new [B, own heads, S, E] tensor.
  Tensor4<T, ExecSpace> whole_part(const ExecSpace& space, const Received& in, std::size_t i,
                                   const char* label) const {
    const auto& part = in.plan.parts[0].parts[i];  // {this rank's heads, E} in every message
    Tensor4<T, ExecSpace> whole(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
                                B, part[0], layout.length(), part[1]);
    gather_sequence(space, in, i, whole);
    return whole;
  }
  /// local's heads of each rank r ← part i of its message (`kv`: K/V heads,
  /// summed, as several ranks may send one).
  void gather_heads(const ExecSpace& space, const Received& in, std::size_t i, bool kv,
                    const StridedTensor4<T, ExecSpace>& local) const {
    for (int r = 0; r < R; ++r) {
      unpack_rows(space, in.buf.device.data() + in.plan.at(r, i),
                  StridedTensor4<T, ExecSpace>(heads_of(local, heads(r, kv).range())), kv);
    }
  }

 private:
  /// The messages of a trade of `parts`: to or from rank r, the heads of
  /// rank heads_of(r) at the steps of rank r (own_steps false) or this
  /// rank's (true).
  template <class HeadsOf>
  Plan plan(const std::vector<Part>& parts, HeadsOf heads_of_rank, bool own_steps) const {
    Plan p;
    int at = 0;
    for (int r = 0; r < R; ++r) {
      MessageParts m{B, {}};
      for (const auto& [tensor, kv] : parts) {
        m.parts.push_back({heads(heads_of_rank(r), kv).count(), int(tensor.extent(3))});
      }
      p.parts.push_back(m);
      p.steps.push_back(layout.local_steps(own_steps ? rank : r));
      p.displs.push_back(at);
      p.counts.push_back(int(m.size(p.steps.back())));
      at += p.counts.back();
    }
    return p;
  }
  void exchange(const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock,
                const MpiBuffer<T, ExecSpace>& out, const Plan& send, const Received& in,
                ExchangeStats& stats) const {
    out.to_mpi(space);
    std::vector<MPI_Request> request(1);
    MPI_Ialltoallv(out.mpi_data(), send.counts.data(), send.displs.data(), mpi_type<T>(),
                   in.buf.mpi_data(), in.plan.counts.data(), in.plan.displs.data(), mpi_type<T>(),
                   comm, request.data());
    for (int r = 0; r < R; ++r) {
      if (r == rank) continue;
      const auto sent = send.counts[std::size_t(r)], got = in.plan.counts[std::size_t(r)];
      stats.bytes_sent += std::int64_t(sent) * std::int64_t(sizeof(T));
      stats.bytes_received += std::int64_t(got) * std::int64_t(sizeof(T));
      stats.messages_sent += sent > 0;
      stats.messages_received += got > 0;
    }
    ExchangeStats step;
    timed_wait(space, request, MPI_Wtime(), lock, step);
    stats.waited_seconds += step.waited_seconds;
    in.buf.from_mpi(space);
  }
};

/// The all_to_all forward on checked arguments (agreed on every rank),
/// over `layout`'s ranks of `comm`: `attend(blk)` computes each run of this
/// rank's heads over all of `layout`'s steps (the single-rank fused
/// attention, or a ring across groups in two_level_attention.hpp), without
/// the sinks, and returns its exchanges. The sinks join at the end.
template <class ExecSpace, class T, class Attend>
ExchangeStats scattered_heads_forward(const ExecSpace& space, MPI_Comm comm,
                                      kdnn::impl::SpaceLock& lock, const SequenceLayout& layout,
                                      int rank,
                                      const attention::FusedAttentionForward<T, ExecSpace>& a,
                                      Attend attend) {
  const int B = int(a.q.extent(0)), H = int(a.q.extent(1)), Hkv = int(a.k.extent(1));
  const int Dv = int(a.v.extent(3)), S = int(layout.length());
  const HeadExchange<ExecSpace, T> x(space, layout, rank, B, H, Hkv);
  const HeadSplit mine = x.own();
  const int Hq = mine.query.count();
  ExchangeStats stats;
  const auto in =
      x.heads_to_sequence(space, comm, lock, {{a.q, false}, {a.k, true}, {a.v, true}}, stats);
  const auto q = x.whole_part(space, in, 0, "kdnn::cp::ulysses_q");
  const auto k = x.whole_part(space, in, 1, "kdnn::cp::ulysses_k");
  const auto v = x.whole_part(space, in, 2, "kdnn::cp::ulysses_v");
  Tensor4<T, ExecSpace> o("kdnn::cp::ulysses_o", B, Hq, S, Dv);
  Tensor3<T, ExecSpace> lse("kdnn::cp::ulysses_lse", B, Hq, S);
  const std::pair<int, int> all(0, S);
  for (const HeadRun& run : head_runs(mine.query, H / Hkv)) {
    const auto qh = run.query.from(mine.query.begin), kh = run.kv.from(mine.kv.begin);
    attention::FusedAttentionForward<T, ExecSpace> blk;
    blk.q = heads_of(q, qh), blk.k = heads_of(k, kh), blk.v = heads_of(v, kh);
    blk.o = heads_of(o, qh);
    blk.lse = lse_block(space, lse, qh, all, false);
    blk.mask = mask_for(space, a.mask, run.query, H);
    stats += attend(blk);
    put_lse_block(space, lse, blk.lse, qh, all);
  }
  const auto back = x.sequence_to_heads(
      space, comm, lock, {{o, false}, {as_rows(Tensor3<const T, ExecSpace>(lse)), false}}, stats);
  x.gather_heads(space, back, 0, false, a.o);
  x.gather_heads(space, back, 1, false, as_rows(a.lse));
  if (validate::given(a.sinks)) merge_sinks(space, a.o, a.lse, a.sinks);
  return stats;
}

/// The all_to_all backward on checked arguments (agreed on every rank),
/// as scattered_heads_forward.
template <class ExecSpace, class T, class Attend>
ExchangeStats scattered_heads_backward(const ExecSpace& space, MPI_Comm comm,
                                       kdnn::impl::SpaceLock& lock, const SequenceLayout& layout,
                                       int rank,
                                       const attention::FusedAttentionBackward<T, ExecSpace>& a,
                                       Attend attend) {
  const int B = int(a.q.extent(0)), H = int(a.q.extent(1)), Hkv = int(a.k.extent(1));
  const int D = int(a.q.extent(3)), Dv = int(a.v.extent(3)), S = int(layout.length());
  const HeadExchange<ExecSpace, T> x(space, layout, rank, B, H, Hkv);
  const HeadSplit mine = x.own();
  const int Hq = mine.query.count(), Hk = mine.kv.count();
  ExchangeStats stats;
  const auto in = x.heads_to_sequence(space, comm, lock,
                                      {{a.q, false},
                                       {a.k, true},
                                       {a.v, true},
                                       {a.o, false},
                                       {a.dout, false},
                                       {as_rows(a.lse), false}},
                                      stats);
  const auto q = x.whole_part(space, in, 0, "kdnn::cp::ulysses_q");
  const auto k = x.whole_part(space, in, 1, "kdnn::cp::ulysses_k");
  const auto v = x.whole_part(space, in, 2, "kdnn::cp::ulysses_v");
  const auto o = x.whole_part(space, in, 3, "kdnn::cp::ulysses_o");
  const auto dout = x.whole_part(space, in, 4, "kdnn::cp::ulysses_dout");
  Tensor3<T, ExecSpace> lse("kdnn::cp::ulysses_lse", B, Hq, S);
  x.gather_sequence(space, in, 5, as_rows(lse));
  // Zeroed: the pieces add into them.
  Tensor4<T, ExecSpace> dq("kdnn::cp::ulysses_dq", B, Hq, S, D),
      dk("kdnn::cp::ulysses_dk", B, Hk, S, D), dv("kdnn::cp::ulysses_dv", B, Hk, S, Dv);
  const std::pair<int, int> all(0, S);
  for (const HeadRun& run : head_runs(mine.query, H / Hkv)) {
    const auto qh = run.query.from(mine.query.begin), kh = run.kv.from(mine.kv.begin);
    attention::FusedAttentionBackward<T, ExecSpace> blk;
    blk.q = heads_of(q, qh), blk.k = heads_of(k, kh), blk.v = heads_of(v, kh);
    blk.o = heads_of(o, qh), blk.dout = heads_of(dout, qh);
    blk.lse = lse_block(space, Tensor3<const T, ExecSpace>(lse), qh, all, true);  // with the sinks
    blk.dq = heads_of(dq, qh), blk.dk = heads_of(dk, kh), blk.dv = heads_of(dv, kh);
    blk.mask = mask_for(space, a.mask, run.query, H);
    stats += attend(blk);
  }
  const auto back =
      x.sequence_to_heads(space, comm, lock, {{dq, false}, {dk, true}, {dv, true}}, stats);
  kdnn::impl::fill_strided(space, a.dk, T(0));  // K/V heads add up over the ranks that read them
  kdnn::impl::fill_strided(space, a.dv, T(0));
  x.gather_heads(space, back, 0, false, a.dq);
  x.gather_heads(space, back, 1, true, a.dk);
  x.gather_heads(space, back, 2, true, a.dv);
  return stats;
}

/// all_to_all (Ulysses): each run of heads over the whole sequence, piece
/// by piece.
template <class ExecSpace, class T>
ExchangeStats ulysses_forward(const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock,
                              const SequenceLayout& layout, const Packing& packing, int rank,
                              const attention::FusedAttentionForward<T, ExecSpace>& a,
                              const attention::FusedAttentionOptions& opts) {
  const Segment all{0, layout.length()};
  return scattered_heads_forward(
      space, comm, lock, layout, rank, a,
      [&](const attention::FusedAttentionForward<T, ExecSpace>& run) {
        const auto pieces = block_pieces(packing, run.mask, all, all);
        if (!reach_every_query(pieces, int(all.steps()))) {  // rows that see no key
          kdnn::impl::fill_strided(space, run.o, T(0));
          Kokkos::deep_copy(space, run.lse, -std::numeric_limits<T>::infinity());
        }
        forward_pieces(space, run, opts, packing, pieces);
        return ExchangeStats{};
      });
}

template <class ExecSpace, class T>
ExchangeStats ulysses_backward(const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock,
                               const SequenceLayout& layout, const Packing& packing, int rank,
                               const attention::FusedAttentionBackward<T, ExecSpace>& a,
                               const attention::FusedAttentionOptions& opts) {
  const Segment all{0, layout.length()};
  return scattered_heads_backward(space, comm, lock, layout, rank, a,
                                  [&](const attention::FusedAttentionBackward<T, ExecSpace>& run) {
                                    backward_pieces(space, run, opts, packing,
                                                    block_pieces(packing, run.mask, all, all));
                                    return ExchangeStats{};
                                  });
}

}  // namespace kdnn::cp::impl
