// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of kdnn::cp::impl::{ssd_forward, ssd_backward}: the collective
// checks, the summaries (packed one per rank: [Λ: B·H][S: B·H·N·P] and, in
// the backward, [dS: B·H·N·P]), the all-gather overlapped with the Y_diag
// kernels, and the scans over the ranks that correct the chunk states.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <climits>
#include <cstdint>
#include <vector>

#include "kdnn/core/impl/fingerprint.hpp"
#include "kdnn/core/impl/host_filled.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/cp/agree.hpp"
#include "kdnn/cp/impl/mpi_memory.hpp"
#include "kdnn/cp/impl/sequence_edges.hpp"
#include "kdnn/cp/impl/timed_wait.hpp"
#include "kdnn/cp/sequence_split.hpp"
#include "kdnn/ssm/impl/ssd_around.hpp"
#include "kdnn/ssm/impl/ssd_checks.hpp"
#include "kdnn/ssm/impl/ssd_steps.hpp"

namespace kdnn::cp {
struct StateStats;
}  // namespace kdnn::cp

namespace kdnn::cp::impl {

/// The fields every rank of an SSD call must agree on, L last: the dtype,
/// the shapes and options, and the parameters' values (A, D and dt_bias by
/// fingerprint: the same parameters on every rank).
template <class T, class ExecSpace, class Args>
std::vector<Field> ssd_fields(const ExecSpace& space, const Args& a, const ssm::SsdOptions& opts) {
  using kdnn::impl::fingerprint;
  const auto values = [&](const char* name, const auto& v) {
    return Field{name, std::int64_t(fingerprint(space, v)), Field::same_values};
  };
  return {{"x", std::int64_t(sizeof(T)), Field::same_dtype},
          {"B", std::int64_t(a.x.extent(0))},
          {"H", std::int64_t(a.x.extent(2))},
          {"P", std::int64_t(a.x.extent(3))},
          {"G", std::int64_t(a.B.extent(2))},
          {"N", std::int64_t(a.B.extent(3))},
          {"opts.chunk", opts.chunk},
          {"D given", validate::given(a.D)},
          {"D's length (H, or H·P per channel)", std::int64_t(a.D.extent(0))},
          {"dt_bias given", validate::given(a.dt_bias)},
          {"opts.dt_softplus", opts.dt_softplus},
          Field::real("opts.dt_min", opts.dt_min),
          Field::real("opts.dt_max", opts.dt_max),
          {"z given", validate::given(a.z)},
          {"y_ungated given", validate::given(a.y_ungated)},
          {"initial_state", validate::given(a.initial_state), Field::rank0_only},
          {"seq_idx given", validate::given(a.seq_idx)},
          values("A", a.A),
          values("D", a.D),
          values("dt_bias", a.dt_bias),
          {"L", std::int64_t(a.x.extent(1)), Field::any}};
}

/// One rank's summary in the gathered buffer: Λ [B·H], then `parts` blocks of
/// [B·H·NP] (S, then dS in the backward).
struct SummaryLayout {
  std::size_t BH, NP;
  int parts;
  KOKKOS_INLINE_FUNCTION std::size_t size() const { return BH * (1 + parts * NP); }
  KOKKOS_INLINE_FUNCTION std::size_t decay(int r, std::size_t bh) const { return r * size() + bh; }
  KOKKOS_INLINE_FUNCTION std::size_t state(int r, int part, std::size_t bh, std::size_t e) const {
    return r * size() + BH + (part * BH + bh) * NP + e;
  }
};

/// Throws when a rank's summary is too large for one MPI count.
inline void check_summary_size(const char* op, const SummaryLayout& s) {
  if (s.size() > std::size_t(INT_MAX)) {
    fail(op, ": a state summary of ", s.size(), " values (B·H·(1 + ", s.parts,
         "·P·N)), expected at most 2^31 - 1");
  }
}

/// The all-gather of the summaries and its statistics.
template <class T, class ExecSpace>
struct SummaryExchange {
  SummaryLayout layout;
  int ranks;
  MpiBuffer<T, ExecSpace> mine, all;
  std::vector<MPI_Request> requests{MPI_REQUEST_NULL};  ///< the all-gather's
  double posted = 0;

  SummaryExchange(const SummaryLayout& l, int R)
      : layout(l),
        ranks(R),
        mine("kdnn::cp::ssd_summary", l.size()),
        all("kdnn::cp::ssd_summaries", l.size() * R) {}

  /// After the pack kernel: starts the all-gather.
  void start(const ExecSpace& space, MPI_Comm comm) {
    mine.to_mpi(space);
    MPI_Iallgather(mine.mpi_data(), int(layout.size()), mpi_type<T>(), all.mpi_data(),
                   int(layout.size()), mpi_type<T>(), comm, &requests[0]);
    posted = MPI_Wtime();
  }
  void wait(const ExecSpace& space, StateStats& stats, kdnn::impl::SpaceLock& lock) {
    timed_wait(space, requests, posted, lock, stats);
    all.from_mpi(space);
    const std::int64_t bytes = std::int64_t(layout.size() * sizeof(T)) * (ranks - 1);
    stats.bytes_sent = bytes;
    stats.bytes_received = bytes;
  }
};

/// Packed sequences: per batch entry, whether this rank's first step starts
/// a sequence (its id differs from the step before it, on an earlier rank).
/// The state entering the rank is then dropped: the rank's summary passes
/// none of it on (Λ = 0, and dS = 0 in the backward) and its own correction
/// is 0. Empty without seq_idx; collective with it (on every rank, then).
template <class ExecSpace>
Vector<const int, ExecSpace> rank_starts(const ExecSpace& space, MPI_Comm comm,
                                         kdnn::impl::SpaceLock& lock,
                                         const Matrix<const int, ExecSpace>& seq_idx,
                                         const SequenceLayout& layout, int rank) {
  if (!validate::given(seq_idx)) return {};
  const SequenceEdges edges(space, comm, lock, seq_idx, layout, rank, 1);
  const int B = int(seq_idx.extent(0));
  return kdnn::impl::filled_on_host(space, Vector<int, ExecSpace>("kdnn::cp::ssd_rank_starts", B),
                                    [&](const auto& host) {
                                      for (int b = 0; b < B; ++b)
                                        host(b) = edges.starts_sequence(rank, 0, b) ? 1 : 0;
                                    });
}

/// Packs this rank's summary: Λ = Π_c decay_c, S = the chunk states' last
/// row (the segment's final state) and, with `dinit`, its gradient dS;
/// Λ and dS are 0 for the batch entries where `starts` (rank_starts) is set.
template <class ExecSpace, class T>
void pack_summary(const ExecSpace& space, const SummaryLayout& s,
                  const Kokkos::View<T*, typename ExecSpace::memory_space>& buf,
                  const ssm::impl::ChunkStates<T, ExecSpace>& states,
                  const ssm::impl::ChunkDecays<T, ExecSpace>& decay,
                  const Tensor4<T, ExecSpace>& dinit, const Vector<const int, ExecSpace>& starts) {
  const int H = int(states.extent(1)), chunks = int(states.extent(2)) - 1;
  const int P = dinit.extent(2) > 0 ? int(dinit.extent(2)) : 1;
  const bool has_starts = validate::given(starts);
  if (s.size() == 0) return;
  Kokkos::parallel_for(
      "kdnn::cp::ssd_pack_summary", Kokkos::RangePolicy<ExecSpace>(space, 0, s.size()),
      KOKKOS_LAMBDA(std::size_t i) {
        if (i < s.BH) {
          T prod = has_starts && starts(int(i) / H) ? 0 : 1;
          for (int c = 0; c < chunks; ++c) prod *= decay(i / H, i % H, c);
          buf(i) = prod;
          return;
        }
        const std::size_t j = i - s.BH, part = j / (s.BH * s.NP), bh = j / s.NP % s.BH;
        const int e = int(j % s.NP), b = int(bh) / H, h = int(bh) % H;
        buf(i) = part == 0                      ? states(b, h, chunks, e)
                 : has_starts && starts(b) != 0 ? T(0)
                                                : dinit(b, h, e % P, e / P);
      });
}

/// The forward scan over the ranks before `rank`: h_in = Σ_{q<r} (Π Λ)·S_q
/// (0 where `starts` is set); then states(c) += (Π_{c'<c} decay_c')·h_in
/// for c ≤ chunks, and the rank's final state (when given) from the
/// corrected last row.
template <class ExecSpace, class T>
void correct_states(const ExecSpace& space, const SummaryLayout& s, int rank,
                    const Kokkos::View<T*, typename ExecSpace::memory_space>& all,
                    const ssm::impl::ChunkStates<T, ExecSpace>& states,
                    const ssm::impl::ChunkDecays<T, ExecSpace>& decay,
                    const Tensor4<T, ExecSpace>& final_state,
                    const Vector<const int, ExecSpace>& starts) {
  const int H = int(states.extent(1)), chunks = int(states.extent(2)) - 1;
  const bool has_final = validate::given(final_state), has_starts = validate::given(starts);
  const int P = has_final ? int(final_state.extent(2)) : 1;
  const std::size_t count = s.BH * s.NP;
  if (count == 0) return;
  Kokkos::parallel_for(
      "kdnn::cp::ssd_correct_states", Kokkos::RangePolicy<ExecSpace>(space, 0, count),
      KOKKOS_LAMBDA(std::size_t i) {
        const std::size_t bh = i / s.NP;
        const int e = int(i % s.NP), b = int(bh) / H, h = int(bh) % H;
        T add = 0;
        for (int q = 0; q < rank; ++q) add = all(s.decay(q, bh)) * add + all(s.state(q, 0, bh, e));
        if (has_starts && starts(b) != 0) add = 0;
        for (int c = 0; c <= chunks; ++c) {
          states(b, h, c, e) += add;
          if (c < chunks) add *= decay(b, h, c);
        }
        if (has_final) final_state(b, h, e % P, e / P) = states(b, h, chunks, e);
      });
}

/// The reverse scan over the ranks after `rank`: the gradient of the state
/// leaving this rank, dnext = Σ_{q>r} (Π Λ)·dS_q; then dstates(c) +=
/// (Π_{c'>c} decay_c')·dnext, and on rank 0 d(initial state) = dS_0 +
/// Λ_0·dnext.
template <class ExecSpace, class T>
void correct_dstates(const ExecSpace& space, const SummaryLayout& s, int rank, int ranks,
                     const Kokkos::View<T*, typename ExecSpace::memory_space>& all,
                     const ssm::impl::ChunkStates<T, ExecSpace>& dstates,
                     const ssm::impl::ChunkDecays<T, ExecSpace>& decay,
                     const Tensor4<T, ExecSpace>& dinit) {
  const int H = int(dstates.extent(1)), chunks = int(dstates.extent(2));
  const bool has_dinit = validate::given(dinit);
  const int P = has_dinit ? int(dinit.extent(2)) : 1;
  const std::size_t count = s.BH * s.NP;
  if (count == 0) return;
  Kokkos::parallel_for(
      "kdnn::cp::ssd_correct_dstates", Kokkos::RangePolicy<ExecSpace>(space, 0, count),
      KOKKOS_LAMBDA(std::size_t i) {
        const std::size_t bh = i / s.NP;
        const int e = int(i % s.NP), b = int(bh) / H, h = int(bh) % H;
        T add = 0;
        for (int q = ranks - 1; q > rank; --q) {
          add = all(s.state(q, 1, bh, e)) + all(s.decay(q, bh)) * add;
        }
        for (int c = chunks - 1; c >= 0; --c) {
          dstates(b, h, c, e) += add;
          add *= decay(b, h, c);
        }
        if (has_dinit) dinit(b, h, e % P, e / P) = all(s.state(rank, 1, bh, e)) + add;
      });
}

/// This rank's scan on checked arguments (no transform, no gate). Collective.
template <class ExecSpace, class T>
StateStats scan_forward(const char* op, const ExecSpace& space, MPI_Comm comm,
                        kdnn::impl::SpaceLock& exclusive, const SummaryLayout& layout,
                        const ssm::SsdForward<T, ExecSpace>& a, const ssm::SsdOptions& opts,
                        const Vector<const int, ExecSpace>& starts) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  ssm::impl::ChunkStates<T, ExecSpace> states;
  ssm::impl::ChunkDecays<T, ExecSpace> decay;
  ssm::impl::chunk_states<ExecSpace, T>(op, space, a, opts, states, decay);
  ssm::impl::state_pass(space, states, decay, a.initial_state, Tensor4<T, ExecSpace>());
  SummaryExchange<T, ExecSpace> ex(layout, ranks);
  pack_summary(space, layout, ex.mine.device, states, decay, Tensor4<T, ExecSpace>(), starts);
  ex.start(space, comm);

  ssm::impl::chunk_output(op, space, a, opts, states, true, false);  // Y_diag + D·x
  StateStats stats;
  ex.wait(space, stats, exclusive);
  correct_states(space, layout, rank, ex.all.device, states, decay, a.final_state, starts);
  ssm::impl::sequence_states(space, a, opts, states);
  ssm::impl::chunk_output(op, space, a, opts, states, false, true);  // + Y_off
  return stats;
}

template <class ExecSpace, class T>
StateStats ssd_forward(const ExecSpace& space, MPI_Comm comm,
                       const ssm::SsdForward<T, ExecSpace>& a, const ssm::SsdOptions& opts) {
  const char* op = "cp::ssd_forward";
  check_communicator(op, comm);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  const SummaryLayout layout{a.x.extent(0) * a.x.extent(2), a.x.extent(3) * a.B.extent(3), 1};
  const auto fields = ssd_fields<T>(space, a, opts);
  const auto all = agree_on_signature(
      comm, op,
      [&] {
        ssm::impl::check_ssd_forward(op, space, a, opts);
        SequenceEdges::check_size(op, a.seq_idx, 1, std::size_t(ranks));
        check_summary_size(op, layout);
      },
      fields);
  const auto layout_of_ranks = SequenceLayout::contiguous(lengths_of(all, fields.size() - 1));
  kdnn::impl::SpaceLock exclusive(space);  // after the collective checks
  const auto starts = rank_starts(space, comm, exclusive, a.seq_idx, layout_of_ranks, rank);
  Tensor3<const T, ExecSpace> dt;
  agree(comm, exclusive, [&] { dt = ssm::impl::step_sizes<ExecSpace, T>(op, space, a, opts); });
  StateStats stats;
  ssm::impl::around_forward(space, a, dt, [&](const ssm::SsdForward<T, ExecSpace>& s) {
    stats = scan_forward(op, space, comm, exclusive, layout, s, opts, starts);
  });
  return stats;
}

template <class ExecSpace, class T>
StateStats ssd_backward(const ExecSpace& space, MPI_Comm comm,
                        const ssm::SsdBackward<T, ExecSpace>& a, const ssm::SsdOptions& opts) {
  const char* op = "cp::ssd_backward";
  check_communicator(op, comm);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  const SummaryLayout layout{a.x.extent(0) * a.x.extent(2), a.x.extent(3) * a.B.extent(3), 2};
  auto fields = ssd_fields<T>(space, a, opts);
  fields.insert(fields.end() - 1,
                Field{"dinitial_state", validate::given(a.dinitial_state), Field::rank0_only});
  const auto all = agree_on_signature(
      comm, op,
      [&] {
        ssm::impl::check_ssd_backward(op, space, a, opts);
        SequenceEdges::check_size(op, a.seq_idx, 1, std::size_t(ranks));
        check_summary_size(op, layout);
      },
      fields);
  const auto layout_of_ranks = SequenceLayout::contiguous(lengths_of(all, fields.size() - 1));
  kdnn::impl::SpaceLock exclusive(space);  // after the collective checks
  const auto starts = rank_starts(space, comm, exclusive, a.seq_idx, layout_of_ranks, rank);
  Tensor3<const T, ExecSpace> dt;
  agree(comm, exclusive, [&] { dt = ssm::impl::step_sizes<ExecSpace, T>(op, space, a, opts); });

  StateStats stats;
  const SummaryLayout forward_layout{layout.BH, layout.NP, 1};
  const auto forward = [&](const ssm::SsdForward<T, ExecSpace>& f) {
    scan_forward(op, space, comm, exclusive, forward_layout, f, opts, starts);
  };
  ssm::impl::around_backward(
      space, a, opts, dt, forward, [&](const ssm::SsdBackward<T, ExecSpace>& g) {
        // The forward's chunk states and this rank's reverse pass, from its own
        // d(final state): H_c, dH_{c+1} and dS_r as if the other ranks were not there.
        ssm::impl::ChunkStates<T, ExecSpace> states, dstates;
        ssm::impl::ChunkDecays<T, ExecSpace> decay;
        ssm::impl::chunk_states<ExecSpace, T>(op, space, g, opts, states, decay);
        ssm::impl::state_pass(space, states, decay, g.initial_state, Tensor4<T, ExecSpace>());
        ssm::impl::chunk_dstates(op, space, g, opts, dstates);
        Tensor4<T, ExecSpace> dlocal("kdnn::cp::ssd_dlocal", g.x.extent(0), g.x.extent(2),
                                     g.x.extent(3), g.B.extent(3));
        ssm::impl::reverse_state_pass(space, dstates, decay, g.dfinal_state, dlocal,
                                      int(g.x.extent(3)));
        SummaryExchange<T, ExecSpace> ex(layout, ranks);
        pack_summary(space, layout, ex.mine.device, states, decay, dlocal, starts);
        ex.start(space, comm);

        auto grads =
            ssm::impl::gradient_buffers(g);  // diag_backward adds what state_backward reads
        ssm::impl::diag_backward(op, space, g, opts, grads);
        ex.wait(space, stats, exclusive);
        correct_states(space, layout, rank, ex.all.device, states, decay, Tensor4<T, ExecSpace>(),
                       starts);
        correct_dstates(space, layout, rank, ranks, ex.all.device, dstates, decay,
                        g.dinitial_state);
        ssm::impl::state_backward(op, space, g, opts, states, dstates, grads);
      });
  return stats;
}

}  // namespace kdnn::cp::impl
