// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of kdnn::cp::impl::{ssd_forward, ssd_backward}: the collective
// checks, then the single-rank SSD's steps on each segment of this rank's
// (cp/impl/segment_views.hpp), the summaries' all-gather overlapped with the
// Y_diag kernels, and the scans that correct the chunk states
// (cp/impl/ssd_summaries.hpp).
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <climits>
#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "kdnn/core/impl/fingerprint.hpp"
#include "kdnn/core/impl/host_filled.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/cp/agree.hpp"
#include "kdnn/cp/impl/layout_checks.hpp"
#include "kdnn/cp/impl/mpi_memory.hpp"
#include "kdnn/cp/impl/segment_views.hpp"
#include "kdnn/cp/impl/sequence_edges.hpp"
#include "kdnn/cp/impl/ssd_summaries.hpp"
#include "kdnn/cp/impl/timed_wait.hpp"
#include "kdnn/cp/sequence_layout.hpp"
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
  const auto values = [&](const char* name, const auto& v) {
    return Field::values(space, name, v);
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

/// Packed sequences: per segment of this rank and batch entry, whether the
/// segment's first step starts a sequence (its id differs from the step
/// before it, wherever that is). The state entering the segment is then
/// dropped: its summary passes none of it on (Λ = 0, and dS = 0 in the
/// backward) and its own correction is 0. Empty Views without seq_idx;
/// collective with it (on every rank, then).
template <class ExecSpace>
std::vector<Vector<const int, ExecSpace>> segment_starts(
    const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock,
    const Matrix<const int, ExecSpace>& seq_idx, const SequenceLayout& layout, int rank) {
  std::vector<Vector<const int, ExecSpace>> starts(layout.segments(rank).size());
  if (!validate::given(seq_idx)) return starts;
  const SequenceEdges edges(space, comm, lock, seq_idx, layout, rank, 1);
  const int B = int(seq_idx.extent(0));
  for (std::size_t k = 0; k < starts.size(); ++k) {
    starts[k] = kdnn::impl::filled_on_host(
        space, Vector<int, ExecSpace>("kdnn::cp::ssd_segment_starts", B), [&](const auto& host) {
          for (int b = 0; b < B; ++b) host(b) = edges.starts_sequence(rank, int(k), b) ? 1 : 0;
        });
  }
  return starts;
}

/// a's arguments with the inputs that the forward and the backward share
/// (x, dt, B, C, seq_idx) cut to rows `r`, and no initial state (the scan
/// brings it).
template <class ExecSpace, class Args>
Args segment_inputs(const ExecSpace& space, const Args& a, std::pair<int, int> r) {
  Args s = a;
  s.x = right_rows(space, a.x, r, true);
  s.dt = right_rows(space, a.dt, r, true);
  s.B = right_rows(space, a.B, r, true);
  s.C = right_rows(space, a.C, r, true);
  s.seq_idx = right_rows(space, a.seq_idx, r, true);
  s.initial_state = {};
  return s;
}

/// Segment k's forward arguments: its rows of the steps' tensors (y copied
/// back by put_rows), the final state on the rank's last segment only
/// (written by the scan).
template <class T, class ExecSpace>
ssm::SsdForward<T, ExecSpace> segment_forward(const ExecSpace& space,
                                              const ssm::SsdForward<T, ExecSpace>& a,
                                              const std::vector<LocalRows>& rows, std::size_t k) {
  const auto r = rows[k].range();
  ssm::SsdForward<T, ExecSpace> f = segment_inputs(space, a, r);
  f.y = right_rows(space, a.y, r, false);
  if (k + 1 < rows.size()) f.final_state = {};
  return f;
}

/// Segment k's backward arguments, as segment_forward: d(final state) on the
/// rank's last segment only, no d(initial state) (the scan gives it); dA and
/// dD of segment 0 are the caller's, the others' new (added by add_sums).
template <class T, class ExecSpace>
ssm::SsdBackward<T, ExecSpace> segment_backward(const ExecSpace& space,
                                                const ssm::SsdBackward<T, ExecSpace>& a,
                                                const std::vector<LocalRows>& rows, std::size_t k) {
  const auto r = rows[k].range();
  ssm::SsdBackward<T, ExecSpace> g = segment_inputs(space, a, r);
  g.dy = right_rows(space, a.dy, r, true);
  g.dx = right_rows(space, a.dx, r, false);
  g.ddt = right_rows(space, a.ddt, r, false);
  g.dB = right_rows(space, a.dB, r, false);
  g.dC = right_rows(space, a.dC, r, false);
  g.dinitial_state = {};
  if (k + 1 < rows.size()) g.dfinal_state = {};
  if (k > 0) {
    g.dA = Vector<T, ExecSpace>("kdnn::cp::segment_dA", a.dA.extent(0));
    if (validate::given(a.dD)) g.dD = Vector<T, ExecSpace>("kdnn::cp::segment_dD", a.dD.extent(0));
  }
  return g;
}

/// into += from, elementwise (a later segment's dA or dD); nothing when
/// either is empty.
template <class ExecSpace, class T>
void add_sums(const ExecSpace& space, const Vector<T, ExecSpace>& into,
              const Vector<T, ExecSpace>& from) {
  if (!validate::given(into) || into.data() == from.data()) return;
  Kokkos::parallel_for(
      "kdnn::cp::ssd_add_segment_sums", Kokkos::RangePolicy<ExecSpace>(space, 0, into.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { into(i) += from(i); });
}

/// What the forward and backward scans of one call share: the layout, this
/// rank's segments and their summaries' slots, the segments' starts.
template <class ExecSpace>
struct ScanContext {
  const SequenceLayout& layout;
  int rank;
  std::vector<LocalRows> rows;
  SummarySlots<ExecSpace> slots;
  std::vector<Vector<const int, ExecSpace>> starts;
  MPI_Comm comm;

  bool with_initial;  ///< rank 0 gives the initial state

  /// The local slot (in this rank's packed summaries) of segment k.
  int local_slot(std::size_t k) const { return slots.own_first(rank) + int(k); }
};

/// This rank's scan on checked arguments (no transform, no gate): per
/// segment, its chunk states from a zero state and its summary; the
/// all-gather while Y_diag + D·x runs; the corrections and Y_off. Collective.
template <class ExecSpace, class T>
StateStats scan_forward(const char* op, const ExecSpace& space, kdnn::impl::SpaceLock& exclusive,
                        const ScanContext<ExecSpace>& ctx, const ssm::SsdForward<T, ExecSpace>& a,
                        const ssm::SsdOptions& opts) {
  const std::size_t segments = ctx.rows.size();
  const SummaryLayout layout{a.x.extent(0) * a.x.extent(2), a.x.extent(3) * a.B.extent(3), 1};
  SummaryExchange<T, ExecSpace> ex(layout, ctx.slots, ctx.layout.ranks(), ctx.rank);
  if (ctx.rank == 0 && ctx.with_initial) {
    pack_initial(space, layout, ex.mine.device, a.initial_state, int(a.x.extent(2)));
  }
  std::vector<ssm::SsdForward<T, ExecSpace>> seg;
  std::vector<ssm::impl::ChunkStates<T, ExecSpace>> states(segments);
  std::vector<ssm::impl::ChunkDecays<T, ExecSpace>> decay(segments);
  for (std::size_t k = 0; k < segments; ++k) {
    seg.push_back(segment_forward(space, a, ctx.rows, k));
    ssm::impl::chunk_states<ExecSpace, T>(op, space, seg[k], opts, states[k], decay[k]);
    ssm::impl::state_pass(space, states[k], decay[k], Tensor4<const T, ExecSpace>(),
                          Tensor4<T, ExecSpace>());
    pack_summary(space, layout, ctx.local_slot(k), ex.mine.device, states[k], decay[k],
                 Tensor4<T, ExecSpace>(), ctx.starts[k]);
  }
  ex.start(space, ctx.comm);

  for (std::size_t k = 0; k < segments; ++k) {  // Y_diag + D·x
    ssm::impl::chunk_output(op, space, seg[k], opts, states[k], true, false);
  }
  StateStats stats;
  ex.wait(space, stats, exclusive);
  for (std::size_t k = 0; k < segments; ++k) {
    correct_states(space, layout, ex.all.device, ctx.slots.lists(), ctx.slots.before(int(k)),
                   states[k], decay[k], seg[k].final_state, ctx.starts[k]);
    ssm::impl::sequence_states(space, seg[k], opts, states[k]);
    ssm::impl::chunk_output(op, space, seg[k], opts, states[k], false, true);  // + Y_off
    put_rows(space, a.y, ctx.rows[k].range(), seg[k].y);
  }
  return stats;
}

/// This rank's backward scan on checked arguments (no transform, no gate),
/// as scan_forward: per segment, its chunk states and its own reverse pass
/// (from its own d(final state)), the summaries' all-gather while the
/// Y_diag backward runs, the corrections both ways and the state half.
template <class ExecSpace, class T>
StateStats scan_backward(const char* op, const ExecSpace& space, kdnn::impl::SpaceLock& exclusive,
                         const ScanContext<ExecSpace>& ctx, const ssm::SsdBackward<T, ExecSpace>& g,
                         const ssm::SsdOptions& opts) {
  const std::size_t segments = ctx.rows.size();
  const SummaryLayout layout{g.x.extent(0) * g.x.extent(2), g.x.extent(3) * g.B.extent(3), 2};
  SummaryExchange<T, ExecSpace> ex(layout, ctx.slots, ctx.layout.ranks(), ctx.rank);
  if (ctx.rank == 0 && ctx.with_initial) {
    pack_initial(space, layout, ex.mine.device, g.initial_state, int(g.x.extent(2)));
  }
  std::vector<ssm::SsdBackward<T, ExecSpace>> seg;
  std::vector<ssm::impl::ChunkStates<T, ExecSpace>> states(segments), dstates(segments);
  std::vector<ssm::impl::ChunkDecays<T, ExecSpace>> decay(segments);
  for (std::size_t k = 0; k < segments; ++k) {
    seg.push_back(segment_backward(space, g, ctx.rows, k));
    const auto& s = seg[k];
    ssm::impl::chunk_states<ExecSpace, T>(op, space, s, opts, states[k], decay[k]);
    ssm::impl::state_pass(space, states[k], decay[k], Tensor4<const T, ExecSpace>(),
                          Tensor4<T, ExecSpace>());
    ssm::impl::chunk_dstates(op, space, s, opts, dstates[k]);
    Tensor4<T, ExecSpace> dlocal("kdnn::cp::ssd_dlocal", s.x.extent(0), s.x.extent(2),
                                 s.x.extent(3), s.B.extent(3));
    ssm::impl::reverse_state_pass(space, dstates[k], decay[k], s.dfinal_state, dlocal,
                                  int(s.x.extent(3)));
    pack_summary(space, layout, ctx.local_slot(k), ex.mine.device, states[k], decay[k], dlocal,
                 ctx.starts[k]);
  }
  ex.start(space, ctx.comm);

  std::vector<ssm::impl::SsdGradients<ExecSpace, T>> grads;
  for (std::size_t k = 0; k < segments; ++k) {  // diag_backward adds what state_backward reads
    grads.push_back(ssm::impl::gradient_buffers(seg[k]));
    ssm::impl::diag_backward(op, space, seg[k], opts, grads[k]);
  }
  StateStats stats;
  ex.wait(space, stats, exclusive);
  for (std::size_t k = 0; k < segments; ++k) {
    const auto& s = seg[k];
    correct_states(space, layout, ex.all.device, ctx.slots.lists(), ctx.slots.before(int(k)),
                   states[k], decay[k], Tensor4<T, ExecSpace>(), ctx.starts[k]);
    correct_dstates(space, layout, ex.all.device, ctx.slots.lists(), ctx.slots.after(int(k)),
                    dstates[k], decay[k]);
    ssm::impl::state_backward(op, space, s, opts, states[k], dstates[k], grads[k]);
    const auto r = ctx.rows[k].range();
    put_rows(space, g.dx, r, s.dx);
    put_rows(space, g.ddt, r, s.ddt);
    put_rows(space, g.dB, r, s.dB);
    put_rows(space, g.dC, r, s.dC);
    if (k > 0) add_sums(space, g.dA, s.dA), add_sums(space, g.dD, s.dD);
  }
  if (validate::given(g.dinitial_state)) {
    initial_state_gradient(space, layout, ex.all.device, ctx.slots.lists(), ctx.slots.all(),
                           g.dinitial_state);
  }
  return stats;
}

/// The checks every rank runs (inside agree_on_signature): the single-rank
/// operator's, the layout's, and the sizes of what the ranks exchange.
template <class Args>
void check_cp_ssd(const char* op, MPI_Comm comm, const SequenceLayout* layout, const Args& a,
                  std::size_t parts) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  if (layout) {
    check_layout_ranks(op, comm, *layout);
    validate::extent(op, "x", a.x, 1, std::size_t(layout->local_steps(rank)),
                     "the layout's steps on this rank");
  }
  const std::size_t segments = layout ? layout->segment_count() : std::size_t(ranks);
  SequenceEdges::check_size(op, a.seq_idx, 1, segments);
  const SummaryLayout summary{a.x.extent(0) * a.x.extent(2), a.x.extent(3) * a.B.extent(3),
                              int(parts)};
  check_summary_size(op, summary, 1 + segments);
}

/// cu_seqlens (the rank's own offsets of packed sequences) only on a rank
/// of one segment.
template <class Args>
void check_sequence_offsets(const char* op, MPI_Comm comm, const SequenceLayout* layout,
                            const Args& a) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (layout && validate::given(a.cu_seqlens) && layout->segments(rank).size() > 1) {
    fail(op, ": cu_seqlens given on a rank of ", layout->segments(rank).size(),
         " segments, expected one segment (the offsets of one run of the rank's steps)");
  }
}

/// The collective checks of a call (one all-gather), then the scan's
/// layout (the caller's, or the contiguous split of the gathered lengths)
/// and whether rank 0 gives an initial state.
template <class Args>
std::pair<SequenceLayout, bool> agree_on_ssd(const char* op, MPI_Comm comm,
                                             const SequenceLayout* layout, const Args& a,
                                             std::vector<Field> fields, int parts,
                                             const std::function<void()>& operator_checks) {
  check_communicator(op, comm);
  if (layout) {
    fields.insert(fields.end() - 1, layout_field("layout", *layout));
  }
  const auto all = agree_on_signature(
      comm, op,
      [&] {
        check_cp_ssd(op, comm, layout, a, std::size_t(parts));  // the layout first
        operator_checks();
      },
      fields);
  std::size_t initial = 0;  // the field that says whether rank 0 gives an initial state
  while (std::string_view(fields[initial].name) != "initial_state") ++initial;
  return {layout ? *layout : SequenceLayout::contiguous(lengths_of(all, fields.size() - 1)),
          all[0][initial] != 0};
}

template <class ExecSpace, class T>
StateStats ssd_forward(const ExecSpace& space, MPI_Comm comm, const SequenceLayout* given,
                       const ssm::SsdForward<T, ExecSpace>& a, const ssm::SsdOptions& opts) {
  const char* op = "cp::ssd_forward";
  const auto agreed = agree_on_ssd(op, comm, given, a, ssd_fields<T>(space, a, opts), 1, [&] {
    ssm::impl::check_ssd_forward(op, space, a, opts);
    check_sequence_offsets(op, comm, given, a);
  });
  const SequenceLayout& layout = agreed.first;
  const bool with_initial = agreed.second;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  kdnn::impl::SpaceLock exclusive(space);  // after the collective checks
  ScanContext<ExecSpace> ctx{layout,
                             rank,
                             local_rows(layout.segments(rank)),
                             SummarySlots<ExecSpace>(space, layout, rank, with_initial),
                             segment_starts(space, comm, exclusive, a.seq_idx, layout, rank),
                             comm,
                             with_initial};
  Tensor3<const T, ExecSpace> dt;
  agree(comm, exclusive, [&] { dt = ssm::impl::step_sizes<ExecSpace, T>(op, space, a, opts); });
  StateStats stats;
  ssm::impl::around_forward(space, a, dt, [&](const ssm::SsdForward<T, ExecSpace>& s) {
    stats = scan_forward(op, space, exclusive, ctx, s, opts);
  });
  return stats;
}

template <class ExecSpace, class T>
StateStats ssd_backward(const ExecSpace& space, MPI_Comm comm, const SequenceLayout* given,
                        const ssm::SsdBackward<T, ExecSpace>& a, const ssm::SsdOptions& opts) {
  const char* op = "cp::ssd_backward";
  auto fields = ssd_fields<T>(space, a, opts);
  fields.insert(fields.end() - 1,
                Field{"dinitial_state", validate::given(a.dinitial_state), Field::rank0_only});
  const auto agreed = agree_on_ssd(op, comm, given, a, fields, 2,
                                   [&] { ssm::impl::check_ssd_backward(op, space, a, opts); });
  const SequenceLayout& layout = agreed.first;
  const bool with_initial = agreed.second;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  kdnn::impl::SpaceLock exclusive(space);  // after the collective checks
  ScanContext<ExecSpace> ctx{layout,
                             rank,
                             local_rows(layout.segments(rank)),
                             SummarySlots<ExecSpace>(space, layout, rank, with_initial),
                             segment_starts(space, comm, exclusive, a.seq_idx, layout, rank),
                             comm,
                             with_initial};
  Tensor3<const T, ExecSpace> dt;
  agree(comm, exclusive, [&] { dt = ssm::impl::step_sizes<ExecSpace, T>(op, space, a, opts); });

  StateStats stats;
  const auto forward = [&](const ssm::SsdForward<T, ExecSpace>& f) {
    scan_forward(op, space, exclusive, ctx, f, opts);
  };
  ssm::impl::around_backward(space, a, opts, dt, forward,
                             [&](const ssm::SsdBackward<T, ExecSpace>& g) {
                               stats = scan_backward(op, space, exclusive, ctx, g, opts);
                             });
  return stats;
}

}  // namespace kdnn::cp::impl
