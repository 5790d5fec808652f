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
#include "kdnn/cp/impl/mpi_memory.hpp"
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
                                  const Vector<const T, ExecSpace>& dt_bias,
                                  const ConvDtOptions& opts) {
  using kdnn::impl::fingerprint;
  const auto values = [&](const char* name, const auto& v) {
    return Field{name, std::int64_t(fingerprint(space, v)), Field::same_values};
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

/// The sequence ids of this rank's halo, [B, K−1] (steps begin − K + 1 …
/// begin − 1), from the other ranks' edges; empty without seq_idx.
/// Collective when seq_idx is given (on every rank, then).
template <class ExecSpace>
Matrix<const int, ExecSpace> halo_sequence_ids(const ExecSpace& space, MPI_Comm comm,
                                               kdnn::impl::SpaceLock& lock,
                                               const Matrix<const int, ExecSpace>& seq_idx,
                                               const std::vector<std::int64_t>& offsets, int rank,
                                               int K) {
  if (!validate::given(seq_idx) || K == 1) return {};
  const SequenceEdges edges(space, comm, lock, seq_idx, offsets, K - 1);
  const int B = int(seq_idx.extent(0));
  return kdnn::impl::filled_on_host(space,
                                    Matrix<int, ExecSpace>("kdnn::cp::halo_sequence_ids", B, K - 1),
                                    [&](const auto& host) {
                                      for (int b = 0; b < B; ++b) {
                                        for (int j = 0; j < K - 1; ++j)
                                          host(b, j) = edges.id(b, offsets[rank] - (K - 1) + j);
                                      }
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

/// The forward's checks on every rank (one all-gather), then the plan: the
/// caller's, or one made from the lengths the checks gathered. Returns
/// whether rank 0 gives an initial state.
template <class ExecSpace, class T>
bool agree_on_forward(const ExecSpace& space, MPI_Comm comm, const HaloPlan* plan,
                      const ConvDtForward<T, ExecSpace>& a, const ConvDtOptions& opts,
                      std::optional<HaloPlan>& made) {
  const char* op = "cp::conv_dt_forward";
  check_communicator(op, comm);
  auto fields = conv_dt_fields<T>(space, a.conv, a.dt_bias, opts);
  const std::size_t length_field = fields.size() - 1;
  fields.push_back({"initial_state", validate::given(a.conv.initial_state), Field::rank0_only});
  const auto all = agree_on_signature(
      comm, op,
      [&] {
        ssm::impl::check_conv_forward(op, a.conv);
        if (plan) check_plan(op, *plan, a.conv.x, a.conv.w);
        ssm::impl::check_state(op, "halo", a.halo, a.conv.x, a.conv.w);
        validate::disjoint(op, {validate::memory_of("halo", a.halo)},
                           {validate::memory_of("x", a.conv.x), validate::memory_of("y", a.conv.y),
                            validate::memory_of("final_state", a.conv.final_state),
                            validate::memory_of("initial_state", a.conv.initial_state)});
        ssm::impl::check_dt_forward<ExecSpace, T>(op, a.dt, a.dt_bias, a.dt_out, opts.dt);
        check_dt_steps(op, "dt", a.dt, a.conv.x.extent(0), a.conv.x.extent(1));
        ssm::impl::check_conv_finite(op, space, a.conv, opts.conv);
        ssm::impl::check_dt_finite<ExecSpace, T>(op, space, a.dt, a.dt_bias, {}, opts.dt);
        SequenceEdges::check_size(op, a.conv.seq_idx, int(a.conv.w.extent(1)) - 1);
      },
      fields);
  if (!plan) made.emplace(comm, offsets_of(all, length_field), int(a.conv.w.extent(1)));
  return all[0].back() != 0;
}

template <class ExecSpace, class T>
HaloStats conv_dt_forward(const ExecSpace& space, MPI_Comm comm, const HaloPlan* given_plan,
                          const ConvDtForward<T, ExecSpace>& a, const ConvDtOptions& opts) {
  std::optional<HaloPlan> made;
  const bool rank0_init = agree_on_forward(space, comm, given_plan, a, opts, made);
  const HaloPlan& plan = given_plan ? *given_plan : *made;
  kdnn::impl::SpaceLock exclusive(space);  // after the collective checks
  const int L = int(a.conv.x.extent(1)), K = plan.width();
  const auto halo_ids =
      halo_sequence_ids(space, comm, exclusive, a.conv.seq_idx, plan.offsets(), plan.rank(), K);
  auto exchange = start_gather(plan, space, a.conv.x, a.conv.initial_state, a.halo, rank0_init);

  // While the halo is in flight: dt and the steps that do not read the halo.
  ssm::impl::dt_softplus_forward<ExecSpace, T>(space, a.dt, a.dt_bias, a.dt_out, opts.dt);
  ssm::ConvForward<T, ExecSpace> local = a.conv;
  local.initial_state = a.halo;
  const int interior = K - 1 < L ? K - 1 : L;
  ssm::impl::conv_forward_steps(space, local, opts.conv, interior, L, halo_ids);
  const HaloStats stats = exchange.finish(exclusive);

  ssm::impl::conv_forward_steps(space, local, opts.conv, 0, interior, halo_ids);
  if (validate::given(a.conv.final_state)) {
    ssm::impl::conv_final_state(space, a.conv.x, StridedTensor3<const T, ExecSpace>(a.halo),
                                a.conv.final_state,
                                ssm::impl::ConvSequenceIds<ExecSpace>(a.conv.seq_idx, halo_ids));
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
  const std::size_t length_field = fields.size() - 1;
  fields.push_back({"dbias given", validate::given(a.conv.dbias)});
  fields.push_back({"dinitial_state", validate::given(a.conv.dinitial_state), Field::rank0_only});
  const auto all = agree_on_signature(
      comm, op,
      [&] {
        ssm::impl::check_conv_backward(op, a.conv);
        if (plan) check_plan(op, *plan, a.conv.x, a.conv.w);
        if (a.conv.w.extent(1) > 1 && !validate::given(a.conv.initial_state)) {
          fail(op, ": conv.initial_state not given, expected the forward's halo [B, K-1, C] (K=",
               a.conv.w.extent(1), ")");
        }
        ssm::impl::check_dt_backward<ExecSpace, T>(op, a.dt, a.dt_bias, a.ddt_out, a.ddt,
                                                   a.ddt_bias, opts.dt);
        check_dt_steps(op, "dt", a.dt, a.conv.x.extent(0), a.conv.x.extent(1));
        ssm::impl::check_conv_finite(op, space, a.conv, opts.conv);
        ssm::impl::check_dt_finite<ExecSpace, T>(op, space, a.dt, a.dt_bias, a.ddt_out, opts.dt);
        SequenceEdges::check_size(op, a.conv.seq_idx, int(a.conv.w.extent(1)) - 1);
      },
      fields);
  if (!plan) made.emplace(comm, offsets_of(all, length_field), int(a.conv.w.extent(1)));
  return all[0].back() != 0;
}

template <class ExecSpace, class T>
HaloStats conv_dt_backward(const ExecSpace& space, MPI_Comm comm, const HaloPlan* given_plan,
                           const ConvDtBackward<T, ExecSpace>& a, const ConvDtOptions& opts) {
  std::optional<HaloPlan> made;
  const bool rank0_dinit = agree_on_backward(space, comm, given_plan, a, opts, made);
  const HaloPlan& plan = given_plan ? *given_plan : *made;
  kdnn::impl::SpaceLock exclusive(space);  // after the collective checks
  const int B = int(a.conv.x.extent(0)), L = int(a.conv.x.extent(1));
  const int C = int(a.conv.x.extent(2)), K = plan.width();
  const auto halo_ids =
      halo_sequence_ids(space, comm, exclusive, a.conv.seq_idx, plan.offsets(), plan.rank(), K);

  // The halo's gradient first: it is what the other ranks wait for.
  Tensor3<T, ExecSpace> dhalo("kdnn::cp::dhalo", B, K - 1, C);
  ssm::ConvBackward<T, ExecSpace> local = a.conv;
  local.dinitial_state = dhalo;
  ssm::impl::conv_backward_steps(space, local, opts.conv, -(K - 1), 0, false, halo_ids);
  kdnn::impl::fill_strided(space, a.conv.dinitial_state, T(0));  // scatter_add adds into it
  auto exchange = start_scatter_add(plan, space, Tensor3<const T, ExecSpace>(dhalo), a.conv.dx,
                                    a.conv.dinitial_state, rank0_dinit);

  ssm::impl::conv_backward_steps(space, local, opts.conv, 0, L, true, halo_ids);
  ssm::impl::dt_softplus_backward<ExecSpace, T>(space, a.dt, a.dt_bias, a.ddt_out, a.ddt,
                                                a.ddt_bias, opts.dt);
  // Each received piece adds into the steps it came from, in rank order.
  return exchange.finish(exclusive);
}

}  // namespace kdnn::cp::impl
