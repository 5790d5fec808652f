// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The argument checks of the SSD operators (ssd.hpp), shared by the
// single-rank operators (ssd_impl.hpp) and the context-parallel SSD
// (kdnn::cp), which runs them on every rank.
#include <Kokkos_Core.hpp>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/finite_values.hpp"
#include "kdnn/core/impl/first_element.hpp"
#include "kdnn/core/impl/sequence_offsets.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/ssm/impl/dt_transform.hpp"
#include "kdnn/ssm/ssd.hpp"

namespace kdnn::ssm::impl {

/// A state [B, H, P, N] of x [B, L, H, P] and B [B, L, G, N].
template <class State, class X, class Bv>
void check_ssd_state(const char* op, const char* name, const State& s, const X& x, const Bv& b) {
  validate::extent(op, name, s, 0, x.extent(0), "B, x's extent(0)");
  validate::extent(op, name, s, 1, x.extent(2), "H, x's extent(2)");
  validate::extent(op, name, s, 2, x.extent(3), "P, x's extent(3)");
  validate::extent(op, name, s, 3, b.extent(3), "N, B's extent(3)");
}

/// Throws at the first dt (row-major) that is negative (opts.check_dt); a
/// NaN or an infinity is opts.check_finite's. One reduction on `space`,
/// under its lock.
template <class ExecSpace, class T>
void check_dt_values(const char* op, const ExecSpace& space,
                     const Tensor3<const T, ExecSpace>& dt) {
  const auto found = kdnn::impl::first_element_where(
      space, dt, KOKKOS_LAMBDA(const T& v) { return v < T(0); });
  if (found) {
    fail(op, ": ", kdnn::impl::element_name("dt", found->first, found->second),
         ", expected dt >= 0 (check_dt)");
  }
}

/// The small parameters (opts.check_parameters): A finite and ≤ 0 for every
/// head, D and dt_bias (where given) finite; each copied to the host on the
/// caller's `space`, under its lock.
template <class ExecSpace, class T>
void check_parameter_values(const char* op, const ExecSpace& space,
                            const Vector<const T, ExecSpace>& A,
                            const Vector<const T, ExecSpace>& D,
                            const Vector<const T, ExecSpace>& dt_bias) {
  const kdnn::impl::SpaceLock exclusive(space);
  const auto host = [&](const Vector<const T, ExecSpace>& v) {
    auto h = Kokkos::create_mirror(Kokkos::HostSpace(), v);
    Kokkos::deep_copy(space, h, v);
    space.fence();
    return h;
  };
  const T largest = std::numeric_limits<T>::max();
  const auto a = host(A);
  for (std::size_t h = 0; h < a.extent(0); ++h) {
    // -inf would make every decay 0 and dt's gradient 0·inf = NaN.
    if (!(a(h) <= T(0) && a(h) >= -largest)) {
      fail(op, ": A[", h, "]=", a(h), ", expected a finite A <= 0 (check_parameters)");
    }
  }
  for (const auto& [name, v] : {std::pair("D", D), std::pair("dt_bias", dt_bias)}) {
    const auto values = host(v);
    for (std::size_t i = 0; i < values.extent(0); ++i) {
      if (!(std::abs(values(i)) <= largest)) {
        fail(op, ": ", name, "[", i, "]=", values(i),
             ", expected finite values (check_parameters)");
      }
    }
  }
}

/// Checks of x, dt, A, B, C and the chunk size shared by every SSD operator;
/// the values (opts.check_dt) are read on `space`.
template <class ExecSpace, class T>
void check_ssd_inputs(const char* op, const ExecSpace& space, const Tensor4<const T, ExecSpace>& x,
                      const Tensor3<const T, ExecSpace>& dt, const Vector<const T, ExecSpace>& A,
                      const Tensor4<const T, ExecSpace>& B, const Tensor4<const T, ExecSpace>& C,
                      const SsdOptions& opts) {
  if (opts.chunk < 1) fail(op, ": chunk=", opts.chunk, ", expected Q >= 1");
  validate::extent(op, "dt", dt, 0, x.extent(0), "B, x's extent(0)");
  validate::extent(op, "dt", dt, 1, x.extent(1), "L, x's extent(1)");
  validate::extent(op, "dt", dt, 2, x.extent(2), "H, x's extent(2)");
  validate::extent(op, "A", A, 0, x.extent(2), "H, x's extent(2)");
  validate::extent(op, "B", B, 0, x.extent(0), "B, x's extent(0)");
  validate::extent(op, "B", B, 1, x.extent(1), "L, x's extent(1)");
  validate::same_shape(op, "C", C, "B", B);
  const std::size_t H = x.extent(2), G = B.extent(2);
  if (G == 0 || H % G != 0) {
    fail(op, ": B has extent(2)=", G, ", expected a number of groups G >= 1 that divides H=", H);
  }
  const std::size_t chunks = (x.extent(1) + opts.chunk - 1) / opts.chunk;
  if (x.extent(1) > std::size_t(INT_MAX) || x.extent(0) * H * chunks > std::size_t(INT_MAX) ||
      x.extent(3) > 4096 || B.extent(3) > 4096) {
    fail(op, ": x has shape [", x.extent(0), ", ", x.extent(1), ", ", H, ", ", x.extent(3),
         "] and N=", B.extent(3), ", expected L and B·H·ceil(L/Q) < 2^31, P, N <= 4096");
  }
  if (opts.check_dt) check_dt_values<ExecSpace, T>(op, space, dt);
}

/// D's (or dD's) length: H (per head) or H·P (per channel).
template <class X>
void check_skip_length(const char* op, const char* name, std::size_t n, const X& x) {
  const std::size_t H = x.extent(2), P = x.extent(3);
  if (n != H && n != H * P) {
    fail(op, ": ", name, " has extent(0)=", n, ", expected H=", H, " (per head) or H·P=", H * P,
         " (per channel) from x's extents 2 and 3");
  }
}

/// Refuses the step-size transform's options, for the operators that take
/// dt as the step sizes themselves (ssd_diag, ssd_summary, ssd_decay_cumsum).
inline void refuse_dt_transform(const char* op, const SsdOptions& opts) {
  if (transforms_dt(opts)) {
    fail(op, ": opts.dt_softplus=", opts.dt_softplus, ", dt_min=", opts.dt_min,
         ", dt_max=", opts.dt_max, ", expected the defaults (false, 0, inf): ", op,
         " takes the step sizes themselves (ssm::dt_softplus_forward computes them)");
  }
}

/// The operands every SSD operator reads (SsdForward's and SsdBackward's
/// x, dt, A, B, C, D, initial_state, dt_bias, z): checked, and their memory
/// returned for the outputs' aliasing check. With a transform of dt,
/// opts.check_dt is left to the forward and backward, which check the
/// transformed step sizes.
template <class ExecSpace, class T, class Args>
std::vector<validate::MemoryRange> check_ssd_operands(const char* op, const ExecSpace& space,
                                                      const Args& a, const SsdOptions& opts) {
  check_dt_limits(op, opts.dt_min, opts.dt_max);
  SsdOptions raw = opts;
  raw.check_dt = opts.check_dt && !transforms_dt(a, opts);
  check_ssd_inputs<ExecSpace, T>(op, space, a.x, a.dt, a.A, a.B, a.C, raw);
  if (opts.check_parameters) check_parameter_values<ExecSpace, T>(op, space, a.A, a.D, a.dt_bias);
  if (opts.check_finite) {
    using kdnn::impl::check_finite;
    check_finite(op, space, "x", a.x);
    check_finite(op, space, "dt", a.dt);
    check_finite(op, space, "A", a.A);
    check_finite(op, space, "B", a.B);
    check_finite(op, space, "C", a.C);
    check_finite(op, space, "D", a.D);
    check_finite(op, space, "initial_state", a.initial_state);
    check_finite(op, space, "dt_bias", a.dt_bias);
    check_finite(op, space, "z", a.z);
  }
  if (validate::given(a.D)) check_skip_length(op, "D", a.D.extent(0), a.x);
  if (validate::given(a.initial_state)) {
    check_ssd_state(op, "initial_state", a.initial_state, a.x, a.B);
  }
  if (validate::given(a.dt_bias)) {
    validate::extent(op, "dt_bias", a.dt_bias, 0, a.x.extent(2), "H, x's extent(2)");
  }
  if (validate::given(a.z)) validate::same_shape(op, "z", a.z, "x", a.x);
  validate::sequence_ids(op, a.seq_idx, a.x);
  if (validate::given(a.y_ungated)) {
    if (!validate::given(a.z)) {
      fail(op,
           ": y_ungated is given without z, expected it only with z (the output before the "
           "gate)");
    }
    validate::same_shape(op, "y_ungated", a.y_ungated, "x", a.x);
  }
  using validate::memory_of;
  return {memory_of("x", a.x),
          memory_of("dt", a.dt),
          memory_of("A", a.A),
          memory_of("B", a.B),
          memory_of("C", a.C),
          memory_of("D", a.D),
          memory_of("initial_state", a.initial_state),
          memory_of("dt_bias", a.dt_bias),
          memory_of("z", a.z),
          memory_of("seq_idx", a.seq_idx)};
}

/// Throws at the first step t > 0 where seq_idx [1, L] changes its id and
/// the offsets `cu` start no sequence, or the other way round: one device
/// reduction (a binary search over `cu` per step), then the host waits.
template <class ExecSpace>
void check_ids_follow_offsets(const char* op, const ExecSpace& space,
                              const Matrix<const int, ExecSpace>& seq_idx,
                              const Vector<const int, ExecSpace>& cu) {
  const int L = int(seq_idx.extent(1)), count = int(cu.extent(0));
  if (L < 2) return;
  int first = L;
  Kokkos::parallel_reduce(
      "kdnn::ssm::ssd_check_ids_follow_offsets", Kokkos::RangePolicy<ExecSpace>(space, 1, L),
      KOKKOS_LAMBDA(int t, int& lowest) {
        int lo = 0, hi = count;  // the first offset >= t
        while (lo < hi) {
          const int mid = (lo + hi) / 2;
          if (cu(mid) < t) {
            lo = mid + 1;
          } else {
            hi = mid;
          }
        }
        const bool offset = lo < count && cu(lo) == t;
        const bool change = seq_idx(0, t) != seq_idx(0, t - 1);
        if (offset != change && t < lowest) lowest = t;
      },
      Kokkos::Min<int>(first));
  if (first >= L) return;
  int ids[2] = {0, 0};
  Kokkos::deep_copy(space, Kokkos::View<int*, Kokkos::HostSpace>(ids, 2),
                    Kokkos::subview(seq_idx, 0, Kokkos::make_pair(first - 1, first + 1)));
  space.fence();
  fail(op, ": seq_idx[0, ", first - 1, "]=", ids[0], ", seq_idx[0, ", first, "]=", ids[1],
       ids[0] == ids[1] ? ", expected a new id: cu_seqlens starts a sequence at step "
                        : ", expected the same id: cu_seqlens starts no sequence at step ",
       first);
}

/// The per-sequence states (cu_seqlens and sequence_states, given together):
/// one batch entry of packed sequences, seq_idx given and following the
/// offsets, and sequence_states [S, H, P, N].
template <class ExecSpace, class T>
void check_sequence_states(const char* op, const ExecSpace& space,
                           const SsdForward<T, ExecSpace>& a) {
  const kdnn::impl::SpaceLock exclusive(space);  // the checks read the offsets and ids on `space`
  if (!validate::given(a.cu_seqlens)) {
    fail(op, ": sequence_states is given without cu_seqlens, expected both (cu_seqlens [S + 1] ",
         "says where each sequence ends)");
  }
  if (!validate::given(a.sequence_states)) {
    fail(op, ": cu_seqlens is given without sequence_states, expected both (the output [S, H, ",
         "P, N])");
  }
  if (a.x.extent(0) != 1) {
    fail(op, ": x has extent(0)=", a.x.extent(0),
         ", expected 1 with cu_seqlens (the sequences are packed along L of one batch entry)");
  }
  if (!validate::given(a.seq_idx)) {
    fail(op, ": cu_seqlens is given without seq_idx, expected both (seq_idx resets the state ",
         "where each sequence starts)");
  }
  kdnn::impl::host_sequence_offsets(op, "cu_seqlens", space, a.cu_seqlens, a.x.extent(1),
                                    "L, x's extent(1)");
  validate::extent(op, "sequence_states", a.sequence_states, 0, a.cu_seqlens.extent(0) - 1,
                   "S, cu_seqlens' extent(0) - 1");
  validate::extent(op, "sequence_states", a.sequence_states, 1, a.x.extent(2), "H, x's extent(2)");
  validate::extent(op, "sequence_states", a.sequence_states, 2, a.x.extent(3), "P, x's extent(3)");
  validate::extent(op, "sequence_states", a.sequence_states, 3, a.B.extent(3), "N, B's extent(3)");
  check_ids_follow_offsets(op, space, a.seq_idx, a.cu_seqlens);
}

template <class ExecSpace, class T>
void check_ssd_forward(const char* op, const ExecSpace& space, const SsdForward<T, ExecSpace>& a,
                       const SsdOptions& opts) {
  auto inputs = check_ssd_operands<ExecSpace, T>(op, space, a, opts);
  validate::same_shape(op, "y", a.y, "x", a.x);
  if (validate::given(a.final_state)) check_ssd_state(op, "final_state", a.final_state, a.x, a.B);
  if (validate::given(a.cu_seqlens) || validate::given(a.sequence_states)) {
    check_sequence_states(op, space, a);
  }
  using validate::memory_of;
  inputs.push_back(memory_of("cu_seqlens", a.cu_seqlens));
  validate::disjoint(
      op,
      {memory_of("y", a.y), memory_of("final_state", a.final_state),
       memory_of("y_ungated", a.y_ungated), memory_of("sequence_states", a.sequence_states)},
      inputs);
}

template <class ExecSpace, class T>
void check_ssd_backward(const char* op, const ExecSpace& space, const SsdBackward<T, ExecSpace>& a,
                        const SsdOptions& opts) {
  auto inputs = check_ssd_operands<ExecSpace, T>(op, space, a, opts);
  const std::size_t H = a.x.extent(2);
  validate::same_shape(op, "dy", a.dy, "x", a.x);
  if (validate::given(a.dfinal_state)) {
    check_ssd_state(op, "dfinal_state", a.dfinal_state, a.x, a.B);
  }
  if (opts.check_finite) {
    kdnn::impl::check_finite(op, space, "dy", a.dy);
    kdnn::impl::check_finite(op, space, "dfinal_state", a.dfinal_state);
  }
  validate::same_shape(op, "dx", a.dx, "x", a.x);
  validate::same_shape(op, "ddt", a.ddt, "dt", a.dt);
  validate::extent(op, "dA", a.dA, 0, H, "H, x's extent(2)");
  validate::same_shape(op, "dB", a.dB, "B", a.B);
  validate::same_shape(op, "dC", a.dC, "C", a.C);
  if (validate::given(a.dD)) {
    check_skip_length(op, "dD", a.dD.extent(0), a.x);
    if (validate::given(a.D) && a.dD.extent(0) != a.D.extent(0)) {
      fail(op, ": dD has extent(0)=", a.dD.extent(0), ", expected D's ", a.D.extent(0));
    }
  }
  if (validate::given(a.dinitial_state)) {
    check_ssd_state(op, "dinitial_state", a.dinitial_state, a.x, a.B);
  }
  if (validate::given(a.ddt_bias)) {
    if (!validate::given(a.dt_bias)) {
      fail(op, ": ddt_bias is given without dt_bias, expected it only with dt_bias");
    }
    validate::extent(op, "ddt_bias", a.ddt_bias, 0, H, "H, x's extent(2)");
  }
  if (validate::given(a.z)) {
    validate::same_shape(op, "dz", a.dz, "z", a.z);
  } else if (validate::given(a.dz)) {
    fail(op, ": dz is given without z, expected it only with z");
  }
  using validate::memory_of;
  inputs.push_back(memory_of("y_ungated", a.y_ungated));
  inputs.push_back(memory_of("dy", a.dy));
  inputs.push_back(memory_of("dfinal_state", a.dfinal_state));
  validate::disjoint(
      op,
      {memory_of("dx", a.dx), memory_of("ddt", a.ddt), memory_of("dA", a.dA), memory_of("dB", a.dB),
       memory_of("dC", a.dC), memory_of("dD", a.dD), memory_of("dinitial_state", a.dinitial_state),
       memory_of("ddt_bias", a.ddt_bias), memory_of("dz", a.dz)},
      inputs);
}

}  // namespace kdnn::ssm::impl
