// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The state passing of the context-parallel SSD (cp/ssd.hpp) over a
// SequenceLayout. Each segment acts on the state that enters it as h_out =
// Λ·h_in + S (Λ = Π of its chunks' decays, S its final state from a zero
// state); in the backward it also has dS, the gradient of the state that
// enters it from the gradients inside it. Every rank packs one summary per
// segment, [Λ: B·H][S: B·H·NP][dS: B·H·NP in the backward], and rank 0,
// when it gives the sequence's initial state, one more before its segments
// (Λ = 0, S = the initial state, dS = 0); the summaries are all-gathered
// (one MPI_Iallgatherv), the initial state's first, then rank 0's
// segments, rank 1's, and so on. A segment's entering state is the scan of the slots
// before it in sequence order; the gradient of the state that leaves it, the
// reverse scan of the slots after it.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/host_filled.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/cp/impl/mpi_memory.hpp"
#include "kdnn/cp/impl/timed_wait.hpp"
#include "kdnn/cp/sequence_layout.hpp"
#include "kdnn/ssm/impl/ssd_chunks.hpp"
#include "kdnn/ssm/impl/ssd_forward_steps.hpp"

namespace kdnn::cp::impl {

/// One slot of the gathered summaries: Λ [B·H], then `parts` blocks of
/// [B·H·NP] (S, then dS in the backward).
struct SummaryLayout {
  std::size_t BH, NP;
  int parts;
  KOKKOS_INLINE_FUNCTION std::size_t size() const { return BH * (1 + parts * NP); }
  KOKKOS_INLINE_FUNCTION std::size_t decay(int slot, std::size_t bh) const {
    return slot * size() + bh;
  }
  KOKKOS_INLINE_FUNCTION std::size_t state(int slot, int part, std::size_t bh,
                                           std::size_t e) const {
    return slot * size() + BH + (part * BH + bh) * NP + e;
  }
};

/// The forward scan of the slots lists[from, to) for element e of (b, h)
/// `bh`: h = Λ·h + S from h = 0, the state after the last of them.
template <class T, class All, class Lists>
KOKKOS_INLINE_FUNCTION T scan_states(const SummaryLayout& s, const All& all, const Lists& lists,
                                     int from, int to, std::size_t bh, std::size_t e) {
  T h = 0;
  for (int k = from; k < to; ++k) {
    const int q = lists(k);
    h = all(s.decay(q, bh)) * h + all(s.state(q, 0, bh, e));
  }
  return h;
}

/// The reverse scan of lists[from, to): d = dS + Λ·d from d = 0, the
/// gradient of the state that enters the first of them.
template <class T, class All, class Lists>
KOKKOS_INLINE_FUNCTION T scan_gradients(const SummaryLayout& s, const All& all, const Lists& lists,
                                        int from, int to, std::size_t bh, std::size_t e) {
  T d = 0;
  for (int k = to - 1; k >= from; --k) {
    const int q = lists(k);
    d = all(s.state(q, 1, bh, e)) + all(s.decay(q, bh)) * d;
  }
  return d;
}

/// Where each segment's summary lies among the gathered slots, and the
/// slots each of this rank's segments scans (a list on the device).
template <class ExecSpace>
class SummarySlots {
 public:
  using Lists = Kokkos::View<int*, typename ExecSpace::memory_space>;

  /// `with_initial`: rank 0 gives the sequence's initial state (slot 0).
  SummarySlots(const ExecSpace& space, const SequenceLayout& layout, int rank, bool with_initial)
      : initial_(with_initial ? 1 : 0) {
    int slot = initial_;
    for (int r = 0; r < layout.ranks(); ++r) {
      first_.push_back(slot);
      slot += int(layout.segments(r).size());
    }
    first_.push_back(slot);
    // Every segment in sequence order, an empty one [p, p) before the one
    // that begins at p (the state at p is the one entering that segment:
    // its gradient passes through the steps before p only).
    struct Entry {
      Segment at;
      int slot;
    };
    std::vector<Entry> order;
    for (int r = 0; r < layout.ranks(); ++r) {
      const auto& list = layout.segments(r);
      for (std::size_t k = 0; k < list.size(); ++k) order.push_back({list[k], of(r, int(k))});
    }
    std::stable_sort(order.begin(), order.end(), [](const Entry& x, const Entry& y) {
      if (x.at.begin != y.at.begin) return x.at.begin < y.at.begin;
      return x.at.steps() == 0 && y.at.steps() > 0;
    });
    // Per segment of this rank: the initial state's slot and the segments
    // that end before it begins; then those that begin after it ends. Last,
    // every segment (the initial state's gradient).
    std::vector<int> lists;
    offsets_.push_back(0);
    const auto& mine = layout.segments(rank);
    for (std::size_t k = 0; k < mine.size(); ++k) {
      const Segment& s = mine[k];
      const int self = of(rank, int(k));
      if (with_initial) lists.push_back(0);
      for (const Entry& e : order) {
        if (e.slot != self && e.at.end <= s.begin) lists.push_back(e.slot);
      }
      offsets_.push_back(int(lists.size()));
      for (const Entry& e : order) {
        if (e.slot != self && e.at.begin >= s.end) lists.push_back(e.slot);
      }
      offsets_.push_back(int(lists.size()));
    }
    for (const Entry& e : order) lists.push_back(e.slot);
    offsets_.push_back(int(lists.size()));
    lists_ = kdnn::impl::filled_on_host(space, Lists("kdnn::cp::ssd_slots", lists.size()),
                                        [&](const auto& host) {
                                          for (std::size_t i = 0; i < lists.size(); ++i)
                                            host(i) = lists[i];
                                        });
  }

  int slots() const { return first_.back(); }  ///< every segment's, and the initial state's
  /// The first slot of this rank's packed summaries that holds a segment's
  /// (1 on rank 0 with an initial state: slot 0 is the initial state's).
  int own_first(int rank) const { return rank == 0 ? initial_ : 0; }
  /// Rank r's first slot and slot count in the all-gather (rank 0's from the
  /// initial state's).
  int first(int r) const { return r == 0 ? 0 : first_[std::size_t(r)]; }
  int count(int r) const { return first_[std::size_t(r) + 1] - first(r); }
  /// The slot of rank r's segment s.
  int of(int r, int s) const { return first_[std::size_t(r)] + s; }

  /// Ranges of lists(): the slots before this rank's segment s in sequence
  /// order (the initial state's first), those after it, every segment's.
  std::pair<int, int> before(int s) const { return {offsets_[2 * s], offsets_[2 * s + 1]}; }
  std::pair<int, int> after(int s) const { return {offsets_[2 * s + 1], offsets_[2 * s + 2]}; }
  std::pair<int, int> all() const {
    return {offsets_[offsets_.size() - 2], offsets_[offsets_.size() - 1]};
  }
  const Lists& lists() const { return lists_; }

 private:
  int initial_;
  std::vector<int> first_, offsets_;
  Lists lists_;
};

/// Throws when the summaries of all the slots do not fit one MPI count.
inline void check_summary_size(const char* op, const SummaryLayout& s, std::size_t slots) {
  if (s.size() * slots > std::size_t(INT_MAX)) {
    fail(op, ": the state summaries of ", slots, " segments of ", s.size(), " values (B·H·(1 + ",
         s.parts, "·P·N) each), expected at most 2^31 - 1 in all");
  }
}

/// The all-gather of the summaries and its statistics.
template <class T, class ExecSpace>
struct SummaryExchange {
  SummaryLayout layout;
  std::vector<int> counts, displs;  ///< per rank, in values
  int rank;
  MpiBuffer<T, ExecSpace> mine, all;
  std::vector<MPI_Request> requests{MPI_REQUEST_NULL};  ///< the all-gather's
  double posted = 0;

  SummaryExchange(const SummaryLayout& l, const SummarySlots<ExecSpace>& slots, int ranks, int r)
      : layout(l),
        rank(r),
        mine("kdnn::cp::ssd_summary", l.size() * std::size_t(slots.count(r))),
        all("kdnn::cp::ssd_summaries", l.size() * std::size_t(slots.slots())) {
    for (int q = 0; q < ranks; ++q) {
      counts.push_back(int(l.size()) * slots.count(q));
      displs.push_back(int(l.size()) * slots.first(q));
    }
  }

  /// After the pack kernels: starts the all-gather.
  void start(const ExecSpace& space, MPI_Comm comm) {
    mine.to_mpi(space);
    MPI_Iallgatherv(mine.mpi_data(), counts[std::size_t(rank)], mpi_type<T>(), all.mpi_data(),
                    counts.data(), displs.data(), mpi_type<T>(), comm, &requests[0]);
    posted = MPI_Wtime();
  }
  template <class Stats>
  void wait(const ExecSpace& space, Stats& stats, kdnn::impl::SpaceLock& lock) {
    timed_wait(space, requests, posted, lock, stats);
    all.from_mpi(space);
    std::int64_t others = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      if (int(q) != rank) others += counts[q];
    }
    stats.bytes_sent =
        std::int64_t(counts[std::size_t(rank)] * sizeof(T)) * std::int64_t(counts.size() - 1);
    stats.bytes_received = others * std::int64_t(sizeof(T));
  }
};

/// Packs one segment's summary at slot `at` of `buf`: Λ = Π_c decay_c, S =
/// the chunk states' last row (its final state from a zero state) and, with
/// `dinit`, dS; Λ and dS are 0 for the batch entries where `starts` (this
/// segment's, [B]) is set: a sequence starts at its first step.
template <class ExecSpace, class T>
void pack_summary(const ExecSpace& space, const SummaryLayout& s, int at,
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
        const std::size_t out = std::size_t(at) * s.size() + i;
        if (i < s.BH) {
          T prod = has_starts && starts(int(i) / H) ? 0 : 1;
          for (int c = 0; c < chunks; ++c) prod *= decay(i / H, i % H, c);
          buf(out) = prod;
          return;
        }
        const std::size_t j = i - s.BH, part = j / (s.BH * s.NP), bh = j / s.NP % s.BH;
        const int e = int(j % s.NP), b = int(bh) / H, h = int(bh) % H;
        buf(out) = part == 0                      ? states(b, h, chunks, e)
                   : has_starts && starts(b) != 0 ? T(0)
                                                  : dinit(b, h, e % P, e / P);
      });
}

/// Packs the initial state's slot (slot 0, rank 0): Λ = 0, S = initial
/// [B, H, P, N], dS = 0.
template <class ExecSpace, class T>
void pack_initial(const ExecSpace& space, const SummaryLayout& s,
                  const Kokkos::View<T*, typename ExecSpace::memory_space>& buf,
                  const Tensor4<const T, ExecSpace>& initial, int H) {
  const bool given = validate::given(initial);
  const int P = given ? int(initial.extent(2)) : 1;
  if (s.size() == 0) return;
  Kokkos::parallel_for(
      "kdnn::cp::ssd_pack_initial", Kokkos::RangePolicy<ExecSpace>(space, 0, s.size()),
      KOKKOS_LAMBDA(std::size_t i) {
        if (!given || i < s.BH || i >= s.BH * (1 + s.NP)) {  // Λ, dS, or no initial state
          buf(i) = T(0);
          return;
        }
        const std::size_t j = i - s.BH, bh = j / s.NP;
        const int e = int(j % s.NP), b = int(bh) / H, h = int(bh) % H;
        buf(i) = initial(b, h, e % P, e / P);
      });
}

/// The forward scan for one segment: h_in = the scan of the slots
/// lists[from, to) (h = Λ·h + S; 0 where `starts` is set); then states(c)
/// += (Π_{c'<c} decay_c')·h_in for c ≤ chunks, and `final_state` (when
/// given) from the corrected last row.
template <class ExecSpace, class T>
void correct_states(const ExecSpace& space, const SummaryLayout& s,
                    const Kokkos::View<T*, typename ExecSpace::memory_space>& all,
                    const typename SummarySlots<ExecSpace>::Lists& lists, std::pair<int, int> scan,
                    const ssm::impl::ChunkStates<T, ExecSpace>& states,
                    const ssm::impl::ChunkDecays<T, ExecSpace>& decay,
                    const Tensor4<T, ExecSpace>& final_state,
                    const Vector<const int, ExecSpace>& starts) {
  const int H = int(states.extent(1)), chunks = int(states.extent(2)) - 1;
  const bool has_final = validate::given(final_state), has_starts = validate::given(starts);
  const int P = has_final ? int(final_state.extent(2)) : 1;
  const std::size_t count = s.BH * s.NP;
  const int from = scan.first, to = scan.second;
  if (count == 0) return;
  Kokkos::parallel_for(
      "kdnn::cp::ssd_correct_states", Kokkos::RangePolicy<ExecSpace>(space, 0, count),
      KOKKOS_LAMBDA(std::size_t i) {
        const std::size_t bh = i / s.NP;
        const int e = int(i % s.NP), b = int(bh) / H, h = int(bh) % H;
        T add = scan_states<T>(s, all, lists, from, to, bh, e);
        if (has_starts && starts(b) != 0) add = 0;
        for (int c = 0; c <= chunks; ++c) {
          states(b, h, c, e) += add;
          if (c < chunks) add *= decay(b, h, c);
        }
        if (has_final) final_state(b, h, e % P, e / P) = states(b, h, chunks, e);
      });
}

/// The reverse scan for one segment: the gradient of the state leaving it,
/// dnext = the reverse scan of lists[from, to) (d = dS + Λ·d); then
/// dstates(c) += (Π_{c'>c} decay_c')·dnext.
template <class ExecSpace, class T>
void correct_dstates(const ExecSpace& space, const SummaryLayout& s,
                     const Kokkos::View<T*, typename ExecSpace::memory_space>& all,
                     const typename SummarySlots<ExecSpace>::Lists& lists, std::pair<int, int> scan,
                     const ssm::impl::ChunkStates<T, ExecSpace>& dstates,
                     const ssm::impl::ChunkDecays<T, ExecSpace>& decay) {
  const int H = int(dstates.extent(1)), chunks = int(dstates.extent(2));
  const std::size_t count = s.BH * s.NP;
  const int from = scan.first, to = scan.second;
  if (count == 0) return;
  Kokkos::parallel_for(
      "kdnn::cp::ssd_correct_dstates", Kokkos::RangePolicy<ExecSpace>(space, 0, count),
      KOKKOS_LAMBDA(std::size_t i) {
        const std::size_t bh = i / s.NP;
        const int e = int(i % s.NP), b = int(bh) / H, h = int(bh) % H;
        T add = scan_gradients<T>(s, all, lists, from, to, bh, e);
        for (int c = chunks - 1; c >= 0; --c) {
          dstates(b, h, c, e) += add;
          add *= decay(b, h, c);
        }
      });
}

/// d(initial state) [B, H, P, N] = the reverse scan of every segment's slot
/// lists[from, to), as correct_dstates.
template <class ExecSpace, class T>
void initial_state_gradient(const ExecSpace& space, const SummaryLayout& s,
                            const Kokkos::View<T*, typename ExecSpace::memory_space>& all,
                            const typename SummarySlots<ExecSpace>::Lists& lists,
                            std::pair<int, int> scan, const Tensor4<T, ExecSpace>& dinit) {
  const int H = int(dinit.extent(1)), P = int(dinit.extent(2));
  const std::size_t count = s.BH * s.NP;
  const int from = scan.first, to = scan.second;
  if (count == 0) return;
  Kokkos::parallel_for(
      "kdnn::cp::ssd_initial_state_gradient", Kokkos::RangePolicy<ExecSpace>(space, 0, count),
      KOKKOS_LAMBDA(std::size_t i) {
        const std::size_t bh = i / s.NP;
        const int e = int(i % s.NP), b = int(bh) / H, h = int(bh) % H;
        dinit(b, h, e % P, e / P) = scan_gradients<T>(s, all, lists, from, to, bh, e);
      });
}

}  // namespace kdnn::cp::impl
