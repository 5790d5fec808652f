// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of kdnn::cp::impl::{conv_dt_forward, conv_dt_backward}: the
// collective checks (one all-gather), the halo exchange of the caller's plan
// or of one made from the gathered lengths (cp/halo_plan.hpp), and the
// single-rank kernels (ssm/impl) launched on step ranges around it.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kdnn/core/impl/fingerprint.hpp"
#include "kdnn/core/impl/host_filled.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/impl/strided_fill.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/cp/agree.hpp"
#include "kdnn/cp/halo_plan.hpp"
#include "kdnn/cp/impl/layout_checks.hpp"
#include "kdnn/cp/impl/mpi_memory.hpp"
#include "kdnn/cp/impl/segment_views.hpp"
#include "kdnn/cp/impl/sequence_edges.hpp"
#include "kdnn/cp/sequence_split.hpp"
#include "kdnn/ssm/impl/causal_conv1d_impl.hpp"
#include "kdnn/ssm/impl/dt_softplus_impl.hpp"

namespace kdnn::cp {
template <class T, class ExecSpace>
struct ConvDtForward;
template <class T, class ExecSpace>
struct ConvDtBackward;
struct ConvDtOptions;
}  // namespace kdnn::cp

namespace kdnn::cp::impl {

/// The fields every rank of a conv + dt call must agree on, its length last:
/// the dtype, the shapes and options, and the parameters' values (weight,
/// bias and dt_bias by fingerprint: the same parameters on every rank).
template <class T, class ExecSpace, class Conv>
std::vector<Field> conv_dt_fields(const ExecSpace& space, const Conv& conv,
                                  const Vector<const compute_t<T>, ExecSpace>& dt_bias,
                                  const ConvDtOptions& opts) {
  const auto values = [&](const char* name, const auto& v) {
    return Field::values(space, name, v);
  };
  return {{"x", std::int64_t(sizeof(T)), Field::same_dtype},
          {"B", std::int64_t(conv.x.extent(0))},
          {"C", std::int64_t(conv.x.extent(2))},
          {"K", std::int64_t(conv.w.extent(1))},
          {"H", std::int64_t(dt_bias.extent(0))},
          {"bias given", validate::given(conv.bias)},
          {"opts.conv.silu", opts.conv.silu},
          Field::real("opts.dt.dt_min", opts.dt.dt_min),
          Field::real("opts.dt.dt_max", opts.dt.dt_max),
          {"seq_idx given", validate::given(conv.seq_idx)},
          values("weight", conv.w),
          values("bias", conv.bias),
          values("dt_bias", dt_bias),
          {"L", std::int64_t(conv.x.extent(1)), Field::any}};
}

/// The sequence ids of the halo of each of this rank's segments, [B, K−1]
/// each (steps begin − K + 1 … begin − 1 of the segment), from the other
/// ranks' edges; empty without seq_idx. Collective when seq_idx is given
/// (on every rank, then).
template <class ExecSpace>
std::vector<Matrix<const int, ExecSpace>> halo_sequence_ids(
    const ExecSpace& space, MPI_Comm comm, kdnn::impl::SpaceLock& lock,
    const Matrix<const int, ExecSpace>& seq_idx, const HaloPlan& plan) {
  const int K1 = plan.width() - 1;
  std::vector<Matrix<const int, ExecSpace>> ids(plan.segments().size());
  if (!validate::given(seq_idx) || K1 == 0) return ids;
  const SequenceEdges edges(space, comm, lock, seq_idx, plan.layout(), plan.rank(), K1);
  const int B = int(seq_idx.extent(0));
  for (std::size_t s = 0; s < ids.size(); ++s) {
    const std::int64_t before = plan.segments()[s].begin - K1;
    ids[s] = kdnn::impl::filled_on_host(
        space, Matrix<int, ExecSpace>("kdnn::cp::halo_sequence_ids", B, K1), [&](const auto& host) {
          for (int b = 0; b < B; ++b) {
            for (int j = 0; j < K1; ++j) host(b, j) = edges.id(b, before + j);
          }
        });
  }
  return ids;
}

/// The conv on segment s of this rank's steps: its rows of x and y, block s
/// of the halo as its initial state, its sequence ids; the final state on
/// the rank's last segment only.
template <class T, class ExecSpace>
ssm::ConvForward<T, ExecSpace> segment_forward(const ExecSpace& space,
                                               const ssm::ConvForward<T, ExecSpace>& a,
                                               const Tensor3<T, ExecSpace>& halo,
                                               const std::vector<LocalRows>& rows, std::size_t s,
                                               int K1) {
  ssm::ConvForward<T, ExecSpace> f = a;
  f.x = rows_of(a.x, rows[s].range());
  f.y = rows_of(a.y, rows[s].range());
  f.initial_state = rows_of(halo, {int(s) * K1, int(s + 1) * K1});
  f.seq_idx = ids_of(space, a.seq_idx, rows[s].range());
  if (s + 1 < rows.size()) f.final_state = {};
  return f;
}

/// The conv's backward on segment s, as segment_forward: dx of its rows,
/// block s of dhalo; dw and dbias of segment 0 are the caller's, the others'
/// are new (added to segment 0's by add_parameter_gradients).
template <class T, class ExecSpace>
ssm::ConvBackward<T, ExecSpace> segment_backward(const ExecSpace& space,
                                                 const ssm::ConvBackward<T, ExecSpace>& a,
                                                 const Tensor3<T, ExecSpace>& dhalo,
                                                 const std::vector<LocalRows>& rows, std::size_t s,
                                                 int K1) {
  ssm::ConvBackward<T, ExecSpace> g = a;
  const std::pair<int, int> block{int(s) * K1, int(s + 1) * K1};
  g.x = rows_of(a.x, rows[s].range());
  g.dy = rows_of(a.dy, rows[s].range());
  g.dx = rows_of(a.dx, rows[s].range());
  g.initial_state = rows_of(a.initial_state, block);
  g.dinitial_state = rows_of(dhalo, block);
  g.seq_idx = ids_of(space, a.seq_idx, rows[s].range());
  if (s + 1 < rows.size()) g.dfinal_state = {};
  if (s > 0) {
    g.dw = Matrix<compute_t<T>, ExecSpace>("kdnn::cp::segment_dw", a.dw.extent(0), a.dw.extent(1));
    if (validate::given(a.dbias))
      g.dbias = Vector<compute_t<T>, ExecSpace>("kdnn::cp::segment_dbias", a.dbias.extent(0));
  }
  return g;
}

/// into.dw += from.dw, into.dbias += from.dbias (a later segment's sums).
template <class T, class ExecSpace>
void add_parameter_gradients(const ExecSpace& space, const ssm::ConvBackward<T, ExecSpace>& into,
                             const ssm::ConvBackward<T, ExecSpace>& from) {
  const auto dw = into.dw, part = from.dw;
  const int K = int(dw.extent(1));
  const auto dbias = into.dbias, pbias = from.dbias;
  const bool has_bias = validate::given(dbias);
  Kokkos::parallel_for(
      "kdnn::cp::add_segment_sums", Kokkos::RangePolicy<ExecSpace>(space, 0, dw.extent(0)),
      KOKKOS_LAMBDA(std::size_t c) {
        for (int k = 0; k < K; ++k) dw(c, k) += part(c, k);
        if (has_bias) dbias(c) += pbias(c);
      });
}

/// A caller's plan must be this call's: x [B, plan.steps(), C], w [C, K].
template <class X, class W>
void check_plan(const char* op, const HaloPlan& plan, const X& x, const W& w) {
  validate::extent(op, "x", x, 1, std::size_t(plan.steps()), "the plan's steps on this rank");
  validate::extent(op, "w", w, 1, std::size_t(plan.width()), "K, the plan's width");
}

template <class Dt>
void check_dt_steps(const char* op, const char* name, const Dt& dt, std::size_t B, std::size_t L) {
  validate::extent(op, name, dt, 0, B, "B, x's extent(0)");
  validate::extent(op, name, dt, 1, L, "L, x's extent(1)");
}

/// The halo's rows: K−1 for each of the plan's segments on this rank (one
/// without a plan: the contiguous split).
template <class Halo, class X, class W>
void check_halo(const char* op, const char* name, const HaloPlan* plan, const Halo& halo,
                const X& x, const W& w) {
  const std::size_t K1 = w.extent(1) - 1;
  validate::extent(op, name, halo, 0, x.extent(0), "B, x's extent(0)");
  if (plan) {
    validate::extent(op, name, halo, 1, std::size_t(plan->halo_rows()),
                     "(K-1)·segments, K-1 rows for each of this rank's segments");
  } else {
    validate::extent(op, name, halo, 1, K1, "K-1, from w's extent(1)");
  }
  validate::extent(op, name, halo, 2, x.extent(2), "C, x's extent(2)");
}

/// The sequence ids at the segments' edges fit one MPI count (the layout's
/// segments: the plan's, or one per rank).
template <class SeqIdx, class W>
void check_edges(const char* op, const SeqIdx& seq_idx, const W& w, const HaloPlan* plan,
                 MPI_Comm comm) {
  int ranks = 1;
  MPI_Comm_size(comm, &ranks);
  SequenceEdges::check_size(op, seq_idx, int(w.extent(1)) - 1,
                            plan ? plan->layout().segment_count() : std::size_t(ranks));
}

/// The fields of a call: the conv's, a given plan's layout, then the rank-0
/// options, the length last (for the plan made without one).
inline void add_layout_field(std::vector<Field>& fields, const HaloPlan* plan) {
  if (plan) fields.insert(fields.end() - 1, layout_field("plan's layout", plan->layout()));
}

/// The forward's checks on every rank (one all-gather), then the plan: the
/// caller's, or the contiguous split's from the lengths the checks gathered.
/// Returns whether rank 0 gives an initial state.
template <class ExecSpace, class T>
bool agree_on_forward(const ExecSpace& space, MPI_Comm comm, const HaloPlan* plan,
                      const ConvDtForward<T, ExecSpace>& a, const ConvDtOptions& opts,
                      std::optional<HaloPlan>& made) {
  const char* op = "cp::conv_dt_forward";
  check_communicator(op, comm);
  auto fields = conv_dt_fields<T>(space, a.conv, a.dt_bias, opts);
  add_layout_field(fields, plan);
  const std::size_t length_field = fields.size() - 1;
  fields.push_back({"initial_state", validate::given(a.conv.initial_state), Field::rank0_only});
  const auto all = agree_on_signature(
      comm, op,
      [&] {
        ssm::impl::check_conv_forward(op, a.conv);
        if (plan) check_plan(op, *plan, a.conv.x, a.conv.w);
        check_halo(op, "halo", plan, a.halo, a.conv.x, a.conv.w);
        validate::disjoint(op, {validate::memory_of("halo", a.halo)},
                           {validate::memory_of("x", a.conv.x), validate::memory_of("y", a.conv.y),
                            validate::memory_of("final_state", a.conv.final_state),
                            validate::memory_of("initial_state", a.conv.initial_state)});
        ssm::impl::check_dt_forward<ExecSpace, T>(op, a.dt, a.dt_bias, a.dt_out, opts.dt);
        check_dt_steps(op, "dt", a.dt, a.conv.x.extent(0), a.conv.x.extent(1));
        ssm::impl::check_conv_finite(op, space, a.conv, opts.conv);
        ssm::impl::check_dt_finite<ExecSpace, T>(op, space, a.dt, a.dt_bias, {}, opts.dt);
        check_edges(op, a.conv.seq_idx, a.conv.w, plan, comm);
      },
      fields);
  if (!plan) {
    made.emplace(comm, SequenceLayout::contiguous(lengths_of(all, length_field)),
                 int(a.conv.w.extent(1)), HaloPlan::Agreed{});
  }
  return all[0].back() != 0;
}

template <class ExecSpace, class T>
HaloStats conv_dt_forward(const ExecSpace& space, MPI_Comm comm, const HaloPlan* given_plan,
                          const ConvDtForward<T, ExecSpace>& a, const ConvDtOptions& opts) {
  static_assert(!is_float16_storage_v<T>,
                "cp::conv_dt: float or double (16-bit storage needs the halo's gradient in float)");
  std::optional<HaloPlan> made;
  const bool rank0_init = agree_on_forward(space, comm, given_plan, a, opts, made);
  const HaloPlan& plan = given_plan ? *given_plan : *made;
  kdnn::impl::SpaceLock exclusive(space);  // after the collective checks
  const int K1 = plan.width() - 1;
  const auto halo_ids = halo_sequence_ids(space, comm, exclusive, a.conv.seq_idx, plan);
  auto exchange = start_gather(plan, space, a.conv.x, a.conv.initial_state, a.halo, rank0_init);

  // While the halo is in flight: dt and the steps that do not read the halo.
  ssm::impl::dt_softplus_forward<ExecSpace, T>(space, a.dt, a.dt_bias, a.dt_out, opts.dt);
  const auto rows = local_rows(plan.segments());
  std::vector<ssm::ConvForward<T, ExecSpace>> segment;
  for (std::size_t s = 0; s < rows.size(); ++s) {
    segment.push_back(segment_forward(space, a.conv, a.halo, rows, s, K1));
    const int n = rows[s].steps, interior = K1 < n ? K1 : n;
    ssm::impl::conv_forward_steps(space, segment[s], opts.conv, interior, n, halo_ids[s]);
  }
  const HaloStats stats = exchange.finish(exclusive);

  for (std::size_t s = 0; s < rows.size(); ++s) {
    const auto& f = segment[s];
    ssm::impl::conv_forward_steps(space, f, opts.conv, 0, K1 < rows[s].steps ? K1 : rows[s].steps,
                                  halo_ids[s]);
    if (validate::given(f.final_state)) {
      ssm::impl::conv_final_state(space, f.x, f.initial_state, f.final_state,
                                  ssm::impl::ConvSequenceIds<ExecSpace>(f.seq_idx, halo_ids[s]));
    }
  }
  return stats;
}

/// The backward's checks on every rank, as agree_on_forward. Returns whether
/// rank 0 asks for d(initial state).
template <class ExecSpace, class T>
bool agree_on_backward(const ExecSpace& space, MPI_Comm comm, const HaloPlan* plan,
                       const ConvDtBackward<T, ExecSpace>& a, const ConvDtOptions& opts,
                       std::optional<HaloPlan>& made) {
  const char* op = "cp::conv_dt_backward";
  check_communicator(op, comm);
  auto fields = conv_dt_fields<T>(space, a.conv, a.dt_bias, opts);
  add_layout_field(fields, plan);
  const std::size_t length_field = fields.size() - 1;
  fields.push_back({"dbias given", validate::given(a.conv.dbias)});
  fields.push_back({"dinitial_state", validate::given(a.conv.dinitial_state), Field::rank0_only});
  const auto all = agree_on_signature(
      comm, op,
      [&] {
        const int K1 = int(a.conv.w.extent(1)) - 1;
        if (K1 > 0 && !validate::given(a.conv.initial_state)) {
          fail(op, ": conv.initial_state not given, expected the forward's halo (K=", K1 + 1, ")");
        }
        if (validate::given(a.conv.initial_state)) {
          check_halo(op, "conv.initial_state", plan, a.conv.initial_state, a.conv.x, a.conv.w);
          validate::disjoint(
              op, {validate::memory_of("dx", a.conv.dx)},
              {validate::memory_of("initial_state (the forward's halo)", a.conv.initial_state)});
        }
        auto first_block = a.conv;  // the single-rank checks see one segment's halo
        first_block.initial_state = rows_of(a.conv.initial_state, {0, K1});
        ssm::impl::check_conv_backward(op, first_block);
        if (plan) check_plan(op, *plan, a.conv.x, a.conv.w);
        ssm::impl::check_dt_backward<ExecSpace, T>(op, a.dt, a.dt_bias, a.ddt_out, a.ddt,
                                                   a.ddt_bias, opts.dt);
        check_dt_steps(op, "dt", a.dt, a.conv.x.extent(0), a.conv.x.extent(1));
        ssm::impl::check_conv_finite(op, space, a.conv, opts.conv);
        ssm::impl::check_dt_finite<ExecSpace, T>(op, space, a.dt, a.dt_bias, a.ddt_out, opts.dt);
        check_edges(op, a.conv.seq_idx, a.conv.w, plan, comm);
      },
      fields);
  if (!plan) {
    made.emplace(comm, SequenceLayout::contiguous(lengths_of(all, length_field)),
                 int(a.conv.w.extent(1)), HaloPlan::Agreed{});
  }
  return all[0].back() != 0;
}

template <class ExecSpace, class T>
HaloStats conv_dt_backward(const ExecSpace& space, MPI_Comm comm, const HaloPlan* given_plan,
                           const ConvDtBackward<T, ExecSpace>& a, const ConvDtOptions& opts) {
  static_assert(!is_float16_storage_v<T>,
                "cp::conv_dt: float or double (16-bit storage needs the halo's gradient in float)");
  std::optional<HaloPlan> made;
  const bool rank0_dinit = agree_on_backward(space, comm, given_plan, a, opts, made);
  const HaloPlan& plan = given_plan ? *given_plan : *made;
  kdnn::impl::SpaceLock exclusive(space);  // after the collective checks
  const int B = int(a.conv.x.extent(0)), C = int(a.conv.x.extent(2)), K1 = plan.width() - 1;
  const auto halo_ids = halo_sequence_ids(space, comm, exclusive, a.conv.seq_idx, plan);
  const auto rows = local_rows(plan.segments());

  // The halo's gradient first: it is what the other ranks wait for.
  Tensor3<T, ExecSpace> dhalo("kdnn::cp::dhalo", B, plan.halo_rows(), C);
  std::vector<ssm::ConvBackward<T, ExecSpace>> segment;
  for (std::size_t s = 0; s < rows.size(); ++s) {
    segment.push_back(segment_backward(space, a.conv, dhalo, rows, s, K1));
    ssm::impl::conv_backward_steps(space, segment[s], opts.conv, -K1, 0, false, halo_ids[s]);
  }
  kdnn::impl::fill_strided(space, a.conv.dinitial_state, T{});  // scatter_add adds into it
  auto exchange = start_scatter_add(plan, space, Tensor3<const T, ExecSpace>(dhalo), a.conv.dx,
                                    a.conv.dinitial_state, rank0_dinit);

  for (std::size_t s = 0; s < rows.size(); ++s) {
    ssm::impl::conv_backward_steps(space, segment[s], opts.conv, 0, rows[s].steps, true,
                                   halo_ids[s]);
    if (s > 0) add_parameter_gradients(space, segment[0], segment[s]);
  }
  ssm::impl::dt_softplus_backward<ExecSpace, T>(space, a.dt, a.dt_bias, a.ddt_out, a.ddt,
                                                a.ddt_bias, opts.dt);
  // Each piece that arrived, then each this rank holds itself, adds into the
  // steps it came from.
  return exchange.finish(exclusive);
}

}  // namespace kdnn::cp::impl
