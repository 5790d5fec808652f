// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of the kdnn::ssm SSD operators (ssd.hpp), composed of the
// steps in ssd_steps.hpp after the checks of ssd_checks.hpp.
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "kdnn/core/error.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/ssm/impl/ssd_around.hpp"
#include "kdnn/ssm/impl/ssd_checks.hpp"
#include "kdnn/ssm/impl/ssd_steps.hpp"
#include "kdnn/ssm/ssd.hpp"

namespace kdnn::ssm::impl {

/// The scan of one rank on checked arguments (no transform, no gate).
template <class ExecSpace, class T>
void scan_forward(const char* op, const ExecSpace& space, const SsdForward<T, ExecSpace>& a,
                  const SsdOptions& opts) {
  ChunkStates<T, ExecSpace> states;
  ChunkDecays<T, ExecSpace> decay;
  chunk_states<ExecSpace, T>(op, space, a, opts, states, decay);
  state_pass(space, states, decay, a.initial_state, a.final_state);
  sequence_states(space, a, opts, states);
  chunk_output(op, space, a, opts, states, true, true);
}

template <class ExecSpace, class T>
void ssd_forward(const ExecSpace& space, const SsdForward<T, ExecSpace>& a,
                 const SsdOptions& opts) {
  const char* op = "ssm::ssd_forward";
  check_ssd_forward(op, space, a, opts);
  around_forward(space, a, step_sizes<ExecSpace, T>(op, space, a, opts),
                 [&](const SsdForward<T, ExecSpace>& s) { scan_forward(op, space, s, opts); });
}

template <class ExecSpace, class T>
void ssd_diag(const ExecSpace& space, const SsdForward<T, ExecSpace>& a, const SsdOptions& opts) {
  const char* op = "ssm::ssd_diag";
  refuse_dt_transform(op, opts);
  check_ssd_forward(op, space, a, opts);
  if (validate::given(a.dt_bias) || validate::given(a.z)) {
    fail(op,
         ": dt_bias or z is given, expected neither (ssd_diag takes the step sizes and "
         "gives the output before any gate)");
  }
  chunk_output(op, space, a, opts, ChunkStates<T, ExecSpace>(), true, false);
}

template <class ExecSpace, class T>
void ssd_summary(const ExecSpace& space, const SsdSummary<T, ExecSpace>& a,
                 const SsdOptions& opts) {
  const char* op = "ssm::ssd_summary";
  refuse_dt_transform(op, opts);
  check_ssd_inputs<ExecSpace, T>(op, space, a.x, a.dt, a.A, a.B, a.C, opts);
  validate::extent(op, "decay", a.decay, 0, a.x.extent(0), "B, x's extent(0)");
  validate::extent(op, "decay", a.decay, 1, a.x.extent(2), "H, x's extent(2)");
  check_ssd_state(op, "local_state", a.local_state, a.x, a.B);
  validate::sequence_ids(op, a.seq_idx, a.x);
  using validate::memory_of;
  validate::disjoint(op, {memory_of("decay", a.decay), memory_of("local_state", a.local_state)},
                     {memory_of("x", a.x), memory_of("dt", a.dt), memory_of("A", a.A),
                      memory_of("B", a.B), memory_of("C", a.C), memory_of("seq_idx", a.seq_idx)});
  ChunkStates<T, ExecSpace> states;
  ChunkDecays<T, ExecSpace> decay;
  chunk_states<ExecSpace, T>(op, space, a, opts, states, decay);
  state_pass(space, states, decay, Tensor4<const T, ExecSpace>(), a.local_state);
  const auto total = a.decay;
  const int H = int(total.extent(1)), chunks = int(decay.extent(2));
  Kokkos::parallel_for(
      "kdnn::ssm::ssd_total_decay", Kokkos::RangePolicy<ExecSpace>(space, 0, total.size()),
      KOKKOS_LAMBDA(int bh) {
        T prod = 1;
        for (int c = 0; c < chunks; ++c) prod *= decay(bh / H, bh % H, c);
        total(bh / H, bh % H) = prod;
      });
}

template <class ExecSpace, class T>
void ssd_decay_cumsum(const ExecSpace& space, const Tensor3<const T, ExecSpace>& dt,
                      const Vector<const T, ExecSpace>& A, const Tensor4<T, ExecSpace>& out,
                      const SsdOptions& opts) {
  const char* op = "ssm::ssd_decay_cumsum";
  refuse_dt_transform(op, opts);
  if (opts.chunk < 1) fail(op, ": chunk=", opts.chunk, ", expected Q >= 1");
  validate::extent(op, "A", A, 0, dt.extent(2), "H, dt's extent(2)");
  const std::int64_t Q = opts.chunk, L = std::int64_t(dt.extent(1)), H = std::int64_t(dt.extent(2));
  const std::int64_t chunks = L == 0 ? 0 : (L - 1) / Q + 1;
  validate::extent(op, "out", out, 0, dt.extent(0), "B, dt's extent(0)");
  validate::extent(op, "out", out, 1, dt.extent(2), "H, dt's extent(2)");
  validate::extent(op, "out", out, 2, std::size_t(chunks), "ceil(L/Q)");
  validate::extent(op, "out", out, 3, std::size_t(Q), "Q, the chunk size");
  validate::no_alias(op, "out", out, "dt", dt);
  const std::int64_t count = std::int64_t(dt.extent(0)) * H * chunks;
  Kokkos::parallel_for(
      "kdnn::ssm::ssd_decay_cumsum", Kokkos::RangePolicy<ExecSpace>(space, 0, count),
      KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t c = idx % chunks, bh = idx / chunks, b = bh / H, h = bh % H;
        double s = 0;
        for (std::int64_t i = 0; i < Q; ++i) {
          const std::int64_t t = c * Q + i;
          if (t < L) s += double(dt(b, t, h)) * double(A(h));
          out(b, h, c, i) = t < L ? compat::exp(T(s)) : T(0);
        }
      });
}

template <class ExecSpace, class T>
void ssd_backward(const ExecSpace& space, const SsdBackward<T, ExecSpace>& a,
                  const SsdOptions& opts) {
  const char* op = "ssm::ssd_backward";
  check_ssd_backward(op, space, a, opts);
  around_backward(
      space, a, opts, step_sizes<ExecSpace, T>(op, space, a, opts),
      [&](const SsdForward<T, ExecSpace>& f) { scan_forward(op, space, f, opts); },
      [&](const SsdBackward<T, ExecSpace>& g) {
        ChunkStates<T, ExecSpace> states, dstates;
        ChunkDecays<T, ExecSpace> decay;
        chunk_states<ExecSpace, T>(op, space, g, opts, states, decay);
        state_pass(space, states, decay, g.initial_state, Tensor4<T, ExecSpace>());
        chunk_dstates(op, space, g, opts, dstates);
        reverse_state_pass(space, dstates, decay, g.dfinal_state, g.dinitial_state,
                           int(g.x.extent(3)));
        fused_backward(op, space, g, opts, states, dstates, gradient_buffers(g, false));
      });
}

}  // namespace kdnn::ssm::impl
