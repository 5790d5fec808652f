// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::cp context-parallel fused attention: self-attention over a sequence
// laid out on the ranks of a communicator by a SequenceLayout
// (cp/sequence_layout.hpp), each rank holding q [B, H, L_r, D], k
// [B, Hkv, L_r, D], v [B, Hkv, L_r, Dv], o [B, H, L_r, Dv] and lse
// [B, H, L_r] of its steps (its segments one after another along the
// sequence dimension). The result on every rank equals the single-rank
// fused attention (kdnn/attention/fused_attention.hpp) over the whole
// sequence, restricted to the rank's steps, to round-off.
//
// Communication (CpAttentionOptions::comm):
//  * ring: the K/V blocks travel around the ring of ranks with
//    MPI_Isend/MPI_Irecv while the block before is computed; each block's
//    (O, lse) merges into the running ones by their log-sum-exp, in T (a
//    row that has seen no key stays (0, −inf), never NaN). Pairs of
//    segments that the causal mask or the band hides are skipped; the
//    others run the single-rank kernels with the mask's positions (causal,
//    band, ALiBi, the padding lengths and dropout's numbering are those of
//    the whole sequence). Attention sinks join once, at the end. GQA/MQA
//    blocks travel with their Hkv heads. A rank sends R − 1 blocks of
//    B·Hkv·L_src·(D + Dv) values. Backward: the K/V blocks go round again,
//    and each block's dK/dV accumulator follows one step behind, to its
//    owner (ring_attention_backward.hpp); dQ stays local. Every pair uses
//    the whole sequence's O and lse. A rank sends R − 1 blocks and R
//    gradients of that size.
//  * all_gather: K/V heads are taken ⌈Hkv/R⌉ at a time (or
//    CpAttentionOptions::gather_kv_heads): every rank's K/V of those heads
//    is gathered (MPI_Iallgatherv) into sequence order, and each of the
//    rank's query segments attends to all of it in one single-rank call
//    (gather_attention.hpp). A rank sends its B·Hkv·L_r·(D + Dv) values to
//    every other rank. Backward: the same gather, and each rank's rows of
//    the dK/dV sums go back to it (MPI_Ireduce_scatter). The form for
//    sliding windows, where the ring's skipping gains little.
//  * all_to_all (DeepSpeed-Ulysses): the query heads are dealt out
//    ⌈H/R⌉ / ⌊H/R⌋ (any H; a rank may get none), each rank with the K/V
//    heads they read (a K/V head whose group is cut, always when Hkv < R,
//    goes to each rank that reads it, and its gradients are summed); one
//    MPI_Ialltoallv gives each rank the whole sequence of its heads, the
//    single-rank attention runs on it, and a second returns O and lse
//    (ulysses_attention.hpp, head_split.hpp).
//  * all_to_all_ring: over a grid of R = R_h × R_s ranks, split by the
//    caller into groups of R_h (CpAttentionOptions::heads_comm): the
//    all_to_all inside each group gives its members their heads of the
//    group's steps, and the ranks with the same heads in every group run
//    the ring over the groups' steps (two_level_attention.hpp).
//
// Packed sequences (CpAttentionOptions::cu_seqlens) under every type: each
// pair of blocks runs one single-rank call per sequence both reach, placed
// in its sequence (block_pieces.hpp), so the result is the single-rank
// packed call's (fused_attention_varlen.hpp), dropout's numbering included.
//
// The mask is the whole sequence's: causal (top-left), the band
// (bottom-right, flash-attn's window), ALiBi's slopes, seq_q and seq_k
// (lengths in the sequence); lo_win, hi_win and positions are refused (the
// call sets the positions). Checks are collective: a bad argument on one
// rank, or an option, shape, dtype, layout or parameter that differs
// between ranks, is the same kdnn::Error on every rank (one all-gather).
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/core/impl/fingerprint.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/cp/agree.hpp"
#include "kdnn/cp/exchange_stats.hpp"
#include "kdnn/cp/impl/gather_attention.hpp"
#include "kdnn/cp/impl/layout_checks.hpp"
#include "kdnn/cp/impl/ring_attention.hpp"
#include "kdnn/cp/impl/ring_attention_backward.hpp"
#include "kdnn/cp/impl/two_level_attention.hpp"
#include "kdnn/cp/impl/ulysses_attention.hpp"
#include "kdnn/cp/sequence_layout.hpp"

namespace kdnn::cp {

/// How the ranks exchange what attention needs.
enum class AttentionComm {
  ring,        ///< K/V blocks around the ring, overlapped with the compute
  all_gather,  ///< every rank's K/V gathered, a slice of heads at a time
  all_to_all,  ///< heads scattered and the sequence gathered (Ulysses)
  /// all_to_all inside groups of ranks (CpAttentionOptions::heads_comm),
  /// ring across them
  all_to_all_ring,
};

struct CpAttentionOptions {
  AttentionComm comm = AttentionComm::ring;
  /// all_gather: the K/V heads gathered at a time (0: ⌈Hkv/R⌉, a slice of
  /// the whole sequence about the size of a rank's own K/V).
  int gather_kv_heads = 0;
  /// all_to_all_ring: this rank's group, a split of the call's comm into
  /// groups of one size (MPI_Comm_split); the ranks of one rank in each
  /// group form a ring.
  MPI_Comm heads_comm = MPI_COMM_NULL;
  /// Packed sequences (flash-attn's cu_seqlens over the whole sequence):
  /// N + 1 offsets, 0 first and S last, never decreasing, with B = 1; a
  /// query sees only its own sequence's keys, and the result equals the
  /// single-rank packed call's (fused_attention_varlen.hpp). Empty: one
  /// sequence of S steps per batch entry.
  std::vector<std::int64_t> cu_seqlens;
};

namespace impl {

/// The size of cp_opts.heads_comm (0 when none, or not a live intracommunicator).
inline std::int64_t heads_comm_size(const CpAttentionOptions& cp_opts) {
  if (cp_opts.heads_comm == MPI_COMM_NULL) return 0;
  int inter = 0, size = 0;
  MPI_Comm_test_inter(cp_opts.heads_comm, &inter);
  if (inter) return 0;
  MPI_Comm_size(cp_opts.heads_comm, &size);
  return size;
}

/// heads_comm for all_to_all_ring: a live communicator of ranks of `comm`
/// whose size divides comm's.
inline void check_heads_comm(const char* op, MPI_Comm comm, const CpAttentionOptions& cp_opts) {
  if (cp_opts.comm != AttentionComm::all_to_all_ring) return;
  int R = 0;
  MPI_Comm_size(comm, &R);
  const auto size = heads_comm_size(cp_opts);
  if (size == 0) {
    fail(op,
         ": cp_opts.heads_comm is not given (or not an intracommunicator), expected this "
         "rank's group for all_to_all_ring");
  }
  if (R % size != 0) {
    fail(op, ": cp_opts.heads_comm has ", size, " ranks, expected a divisor of comm's ", R);
  }
  MPI_Group whole, group;
  MPI_Comm_group(comm, &whole);
  MPI_Comm_group(cp_opts.heads_comm, &group);
  std::vector<int> members(static_cast<std::size_t>(size)), there(members.size());
  for (int i = 0; i < int(size); ++i) members[std::size_t(i)] = i;
  MPI_Group_translate_ranks(group, int(size), members.data(), whole, there.data());
  MPI_Group_free(&group);
  MPI_Group_free(&whole);
  for (int r : there) {
    if (r == MPI_UNDEFINED)
      fail(op, ": cp_opts.heads_comm has a rank outside comm, expected a split of comm");
  }
}

/// cu_seqlens: offsets of packed sequences over the whole S steps of one
/// batch entry, without per-entry lengths, ALiBi's slopes [1 or N, H].
template <class ExecSpace>
void check_packing(const char* op, const std::vector<std::int64_t>& cu, std::int64_t S,
                   std::size_t B, const attention::AttentionMask<ExecSpace>& mask) {
  if (cu.empty()) return;
  if (cu.size() < 2 || cu.front() != 0 || cu.back() != S) {
    fail(op, ": cp_opts.cu_seqlens has ", cu.size(), " offsets from ", cu.front(), " to ",
         cu.back(), ", expected N + 1 >= 2 offsets from 0 to S=", S);
  }
  for (std::size_t n = 0; n + 1 < cu.size(); ++n) {
    if (cu[n + 1] < cu[n]) {
      fail(op, ": cp_opts.cu_seqlens[", n + 1, "]=", cu[n + 1], " < cu_seqlens[", n, "]=", cu[n],
           ", expected offsets that never decrease");
    }
  }
  if (B != 1) fail(op, ": q has B=", B, " with cp_opts.cu_seqlens, expected 1 (packed sequences)");
  if (mask.seq_q.extent(0) > 0 || mask.seq_k.extent(0) > 0) {
    fail(op,
         ": mask.seq_q or seq_k given with cp_opts.cu_seqlens, expected none (packed "
         "sequences have their own lengths)");
  }
  const std::size_t N = cu.size() - 1, rows = mask.alibi_slopes.extent(0);
  if (mask.alibi_slopes.size() > 0 && rows != 1 && rows != N) {
    fail(op, ": mask.alibi_slopes has ", rows, " rows with cp_opts.cu_seqlens of ", N,
         " sequences, expected 1 or ", N);
  }
}

/// A 64-bit hash of cu_seqlens, to compare the ranks'.
inline std::int64_t packing_fingerprint(const std::vector<std::int64_t>& cu) {
  std::uint64_t h = kdnn::impl::mix64(cu.size());
  for (const std::int64_t c : cu) h = kdnn::impl::mix64(h + std::uint64_t(c) + 1);
  return std::int64_t(h);
}

/// The fields every rank of an attention call must agree on: the dtype,
/// the shapes, the options and the mask, and the parameters' values (sinks,
/// ALiBi's slopes, the padding lengths, by fingerprint).
template <class T, class ExecSpace, class Args>
std::vector<Field> attention_fields(const ExecSpace& space, const SequenceLayout& layout,
                                    const Args& a, const attention::FusedAttentionOptions& opts,
                                    const CpAttentionOptions& cp_opts) {
  const auto values = [&](const char* name, const auto& v) {
    return Field::values(space, name, v);
  };
  return {{"q", std::int64_t(sizeof(T)), Field::same_dtype},
          {"B", std::int64_t(a.q.extent(0))},
          {"H", std::int64_t(a.q.extent(1))},
          {"Hkv", std::int64_t(a.k.extent(1))},
          {"D", std::int64_t(a.q.extent(3))},
          {"Dv", std::int64_t(a.v.extent(3))},
          layout_field("layout", layout),
          {"comm", std::int64_t(cp_opts.comm)},
          {"gather_kv_heads", std::int64_t(cp_opts.gather_kv_heads)},
          {"heads_comm size", heads_comm_size(cp_opts)},
          {"cu_seqlens", packing_fingerprint(cp_opts.cu_seqlens), Field::same_values},
          {"mask.causal", a.mask.causal},
          {"mask.band_left", a.mask.band_left},
          {"mask.band_right", a.mask.band_right},
          values("mask.alibi_slopes", a.mask.alibi_slopes),
          values("mask.seq_q", a.mask.seq_q),
          values("mask.seq_k", a.mask.seq_k),
          values("sinks", a.sinks),
          Field::real("opts.scale", opts.scale),
          Field::real("opts.softcap", opts.softcap),
          Field::real("opts.dropout.p", opts.dropout.p),
          {"opts.dropout.seed", std::int64_t(opts.dropout.seed)},
          {"opts.dropout.offset", std::int64_t(opts.dropout.offset)}};
}

/// The checks of this rank's arguments (inside agree_on_signature): the
/// layout's, the single-rank operator's on the rank's whole steps (the
/// mask's positions those of the sequence), and the message sizes.
template <class T, class ExecSpace, class Args>
void check_attention(const char* op, const ExecSpace& space, MPI_Comm comm,
                     const SequenceLayout& layout, const Args& a,
                     const attention::FusedAttentionOptions& opts,
                     const CpAttentionOptions& cp_opts) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  check_layout_ranks(op, comm, layout);
  const auto steps = std::size_t(layout.local_steps(rank));
  validate::extent(op, "q", a.q, 2, steps, "the layout's steps on this rank");
  validate::extent(op, "k", a.k, 2, steps, "the layout's steps on this rank");
  const auto refuse_window = [&](const char* name, std::size_t given) {
    if (given > 0) {
      fail(op, ": mask.", name,
           " given, expected none (a window per query of the rank's own keys; use the band)");
    }
  };
  refuse_window("lo_win", a.mask.lo_win.extent(0));
  refuse_window("hi_win", a.mask.hi_win.extent(0));
  if (a.mask.positions.query_length != -1 || a.mask.positions.key_length != -1 ||
      a.mask.positions.head_count != -1) {
    fail(op, ": mask.positions given, expected none (the call places each block itself)");
  }
  check_packing(op, cp_opts.cu_seqlens, layout.length(), a.q.extent(0), a.mask);
  auto whole = a;  // the rank's steps, placed in the sequence
  const int S = int(layout.length());
  whole.mask.positions = {0, S, 0, S};
  if (!cp_opts.cu_seqlens.empty() && a.mask.alibi_slopes.extent(0) > 1) {
    // One row of slopes per packed sequence: checked here, the rest as one entry's.
    attention::impl::check_alibi<ExecSpace>(op, a.mask.alibi_slopes, cp_opts.cu_seqlens.size() - 1,
                                            a.q.extent(1), std::size_t(S), std::size_t(S));
    whole.mask.alibi_slopes =
        Kokkos::subview(a.mask.alibi_slopes, std::make_pair(0, 1), Kokkos::ALL);
  }
  if constexpr (std::is_same_v<Args, attention::FusedAttentionForward<T, ExecSpace>>) {
    const attention::impl::EntryRows queries{int(a.q.extent(0)), int(a.q.extent(2))},
        keys{int(a.k.extent(0)), int(a.k.extent(2))};
    attention::impl::forward_data<ExecSpace, T>(op, space, whole, opts,
                                                attention::impl::MaskCheck::here, queries, keys);
  } else {
    attention::impl::check_fused_backward<ExecSpace, T>(op, space, whole, opts);
    attention::impl::check_mask(op, whole.mask, a.q.extent(0), a.q.extent(2), a.k.extent(2),
                                a.q.extent(1));
  }
  check_heads_comm(op, comm, cp_opts);
  if (cp_opts.gather_kv_heads < 0) {
    fail(op, ": cp_opts.gather_kv_heads=", cp_opts.gather_kv_heads,
         ", expected 0 (automatic) or a number of K/V heads >= 1");
  }
  // What one message or collective of the chosen form holds, in values.
  const std::size_t B = a.q.extent(0), H = a.q.extent(1), Hkv = a.k.extent(1);
  const std::size_t D = a.q.extent(3), Dv = a.v.extent(3), steps_all = std::size_t(S);
  const int R = layout.ranks();
  std::int64_t longest = 0;
  for (int r = 0; r < R; ++r) longest = std::max(longest, layout.local_steps(r));
  std::size_t values = 0;
  const char* what = "";
  switch (cp_opts.comm) {
    case AttentionComm::ring:
      values = B * Hkv * std::size_t(longest) * (D + Dv);
      what = "a K/V block (B·Hkv·L·(D + Dv), L the layout's most steps on a rank)";
      break;
    case AttentionComm::all_gather:
      values = B * std::size_t(gather_slice_heads(cp_opts.gather_kv_heads, int(Hkv), R)) *
               steps_all * (D + Dv);
      what = "a gathered K/V slice (B·heads·S·(D + Dv))";
      break;
    case AttentionComm::all_to_all:  // the backward's: q, k, v, o, dout, lse (K/V heads cut twice)
    case AttentionComm::all_to_all_ring:  // and at most as much in a ring's block
      values = B * steps_all *
               (((H + std::size_t(R) - 1) / std::size_t(R)) * (D + 2 * Dv + 1) +
                ((Hkv + std::size_t(R) - 1) / std::size_t(R) + 1) * (D + Dv));
      what = "a rank's all-to-all (B·S·(⌈H/R⌉·(D + 2·Dv + 1) + (⌈Hkv/R⌉ + 1)·(D + Dv)))";
      break;
    default:
      fail(op, ": cp_opts.comm=", int(cp_opts.comm), ", expected ring, all_gather or all_to_all");
  }
  if (values > std::size_t(INT_MAX)) {
    fail(op, ": ", what, " of ", values, " values, expected at most 2^31 - 1 (one message)");
  }
}

}  // namespace impl

/// o and lse on this rank's steps (see above). Collective over `comm`;
/// returns when the exchange is complete.
template <class ExecSpace, class T>
ExchangeStats fused_attention_forward(const ExecSpace& space, MPI_Comm comm,
                                      const SequenceLayout& layout,
                                      const attention::FusedAttentionForward<T, ExecSpace>& args,
                                      const attention::FusedAttentionOptions& opts = {},
                                      const CpAttentionOptions& cp_opts = {}) {
  const char* op = "cp::fused_attention_forward";
  check_communicator(op, comm);
  agree_on_signature(
      comm, op, [&] { impl::check_attention<T>(op, space, comm, layout, args, opts, cp_opts); },
      impl::attention_fields<T>(space, layout, args, opts, cp_opts));
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  kdnn::impl::SpaceLock exclusive(space);  // after the collective checks
  const impl::Packing packing(cp_opts.cu_seqlens, layout.length());
  switch (cp_opts.comm) {
    case AttentionComm::all_gather:
      return impl::gather_forward(
          space, comm, exclusive, layout, packing, rank, args, opts,
          impl::gather_slice_heads(cp_opts.gather_kv_heads, int(args.k.extent(1)), layout.ranks()));
    case AttentionComm::all_to_all:
      return impl::ulysses_forward(space, comm, exclusive, layout, packing, rank, args, opts);
    case AttentionComm::all_to_all_ring:
      return impl::two_level_forward(space, comm, cp_opts.heads_comm, exclusive, layout, packing,
                                     args, opts);
    default:
      return impl::ring_forward(space, comm, exclusive, layout, packing, rank, args, opts);
  }
}

/// dq, dk, dv on this rank's steps from the forward's o and lse (this
/// rank's rows, as the forward gave them) and dout, with the forward's
/// options; dsinks (optional, with sinks) receives this rank's partial sum:
/// cp::allreduce_sum adds them over the ranks. Collective over `comm`.
template <class ExecSpace, class T>
ExchangeStats fused_attention_backward(const ExecSpace& space, MPI_Comm comm,
                                       const SequenceLayout& layout,
                                       const attention::FusedAttentionBackward<T, ExecSpace>& args,
                                       const attention::FusedAttentionOptions& opts = {},
                                       const CpAttentionOptions& cp_opts = {}) {
  const char* op = "cp::fused_attention_backward";
  check_communicator(op, comm);
  auto fields = impl::attention_fields<T>(space, layout, args, opts, cp_opts);
  fields.push_back({"dsinks given", validate::given(args.dsinks)});
  agree_on_signature(
      comm, op, [&] { impl::check_attention<T>(op, space, comm, layout, args, opts, cp_opts); },
      fields);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  kdnn::impl::SpaceLock exclusive(space);  // after the collective checks
  if (validate::given(args.dsinks)) {      // the sinks' share of this rank's rows
    Tensor3<T, ExecSpace> delta("kdnn::cp::attention_delta", args.q.extent(0), args.q.extent(1),
                                args.q.extent(2));
    attention::impl::row_deltas<ExecSpace, T>(space, args.dout, args.o, delta);
    attention::impl::sink_gradients<ExecSpace, T>(space, args.sinks, args.lse, delta, args.dsinks);
  }
  const impl::Packing packing(cp_opts.cu_seqlens, layout.length());
  switch (cp_opts.comm) {
    case AttentionComm::all_gather:
      return impl::gather_backward(
          space, comm, exclusive, layout, packing, rank, args, opts,
          impl::gather_slice_heads(cp_opts.gather_kv_heads, int(args.k.extent(1)), layout.ranks()));
    case AttentionComm::all_to_all:
      return impl::ulysses_backward(space, comm, exclusive, layout, packing, rank, args, opts);
    case AttentionComm::all_to_all_ring:
      return impl::two_level_backward(space, comm, cp_opts.heads_comm, exclusive, layout, packing,
                                      args, opts);
    default:
      return impl::ring_backward(space, comm, exclusive, layout, packing, rank, args, opts);
  }
}

}  // namespace kdnn::cp
