// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definition of kdnn::ssm::impl::causal_conv1d_update.
#include <climits>
#include <cstddef>
#include <vector>

#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/finite_values.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/ssm/causal_conv1d_update.hpp"
#include "kdnn/ssm/impl/causal_conv1d_inputs.hpp"

namespace kdnn::ssm::impl {

/// One thread per (b, c): its state row and new steps are its own, so it
/// computes every output from the old state, then writes the new steps into
/// the row (the linear state: shifted in place, ascending, each value read
/// before it is overwritten; the circular one: at slots p … p + Lnew − 1).
template <class ExecSpace, class T>
struct ConvUpdateKernel {
  ConvUpdate<T, ExecSpace> a;
  bool has_bias = false, indexed = false, circular = false;

  KOKKOS_INLINE_FUNCTION void operator()(long long row) const {
    const int C = int(a.x.extent(1)), L = int(a.x.extent(2)), W = int(a.conv_state.extent(2));
    const int K = int(a.w.extent(1));
    const int b = int(row / C), c = int(row % C);
    T* state = &a.conv_state(indexed ? a.conv_state_indices(b) : b, c, 0);
    const T* x = &a.x(b, c, 0);
    // x̄[s] for s >= W − K + 1: the state's last K − 1 steps (in time order),
    // then the new steps.
    const long long p = circular ? a.cache_seqlens(b) : 0;
    const auto slot = [&](long long s) {  // circular: step s of x̄ (s < W) in the buffer
      const long long r = (p - W + s) % W;
      return int(r < 0 ? r + W : r);
    };
    const auto xbar = [&](int s) {
      if (s >= W) return x[s - W];
      return circular ? state[slot(s)] : state[s];
    };
    using Compute = compute_t<T>;  // sums in float for the 16-bit types
    for (int t = 0; t < L; ++t) {
      Compute z = has_bias ? a.bias(c) : Compute(0);
      for (int k = 0; k < K; ++k) z += a.w(c, k) * to_compute(xbar(W + t - K + 1 + k));
      a.y(b, c, t) = from_compute<T>(a.silu ? z * sigmoid(z) : z);
    }
    if (circular) {
      for (int t = 0; W > 0 && t < L; ++t) state[slot(W + t)] = x[t];
    } else {
      for (int s = 0; s < W; ++s) state[s] = xbar(s + L);
    }
  }
};

/// Checks the optional serving vectors of `a` (copied to the host):
/// conv_state_indices distinct in [0, Bs), cache_seqlens >= 0.
template <class ExecSpace, class T>
void check_serving_vectors(const char* op, const ConvUpdate<T, ExecSpace>& a) {
  const std::size_t B = a.x.extent(0);
  if (validate::given(a.conv_state_indices)) {
    validate::extent(op, "conv_state_indices", a.conv_state_indices, 0, B, "B, x's extent(0)");
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a.conv_state_indices);
    std::vector<std::size_t> owner(a.conv_state.extent(0), B);  // B: no entry yet
    for (std::size_t b = 0; b < B; ++b) {
      if (h(b) < 0 || std::size_t(h(b)) >= a.conv_state.extent(0)) {
        fail(op, ": conv_state_indices[", b, "]=", h(b), ", expected a state row in [0, ",
             a.conv_state.extent(0), ") (conv_state's extent(0))");
      }
      if (owner[h(b)] != B) {
        fail(op, ": conv_state_indices[", b, "]=", h(b), " is also conv_state_indices[",
             owner[h(b)], "], expected distinct rows (two batch entries would update one state)");
      }
      owner[h(b)] = b;
    }
  }
  if (validate::given(a.cache_seqlens)) {
    validate::extent(op, "cache_seqlens", a.cache_seqlens, 0, B, "B, x's extent(0)");
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a.cache_seqlens);
    for (std::size_t b = 0; b < B; ++b) {
      if (h(b) < 0) {
        fail(op, ": cache_seqlens[", b, "]=", h(b), ", expected a position >= 0");
      }
    }
  }
}

template <class ExecSpace, class T>
void causal_conv1d_update(const ExecSpace& space, const ConvUpdate<T, ExecSpace>& a) {
  constexpr const char* op = "ssm::causal_conv1d_update";
  const std::size_t B = a.x.extent(0), C = a.x.extent(1), K = a.w.extent(1);
  if (K < 1) fail(op, ": w has extent(1)=", K, ", expected K >= 1");
  validate::extent(op, "w", a.w, 0, C, "C, x's extent(1)");
  const bool indexed = validate::given(a.conv_state_indices);
  if (!indexed) validate::extent(op, "conv_state", a.conv_state, 0, B, "B, x's extent(0)");
  validate::extent(op, "conv_state", a.conv_state, 1, C, "C, x's extent(1)");
  if (a.conv_state.extent(2) < K - 1) {
    fail(op, ": conv_state has extent(2)=", a.conv_state.extent(2), ", expected W >= K-1=", K - 1,
         " (from w's extent(1))");
  }
  if (validate::given(a.bias)) validate::extent(op, "bias", a.bias, 0, C, "C, x's extent(1)");
  validate::same_shape(op, "y", a.y, "x", a.x);
  if (C > std::size_t(INT_MAX) || a.x.extent(2) > std::size_t(INT_MAX) ||
      a.conv_state.extent(2) > std::size_t(INT_MAX / 2) || K > std::size_t(INT_MAX / 2)) {
    fail(op, ": x has shape [", B, ", ", C, ", ", a.x.extent(2), "], W=", a.conv_state.extent(2),
         " and K=", K, ", expected C, Lnew < 2^31 and W, K < 2^30");
  }
  using validate::memory_of;
  validate::disjoint(op, {memory_of("y", a.y), memory_of("conv_state", a.conv_state)},
                     {memory_of("x", a.x), memory_of("w", a.w), memory_of("bias", a.bias)});
  check_serving_vectors(op, a);
  if (a.check_finite) {
    kdnn::impl::check_finite(op, space, "x", a.x);
    kdnn::impl::check_finite(op, space, "conv_state", a.conv_state);
    kdnn::impl::check_finite(op, space, "w", a.w);
    kdnn::impl::check_finite(op, space, "bias", a.bias);
  }
  if (B * C == 0) return;
  ConvUpdateKernel<ExecSpace, T> kernel{a, validate::given(a.bias), indexed,
                                        validate::given(a.cache_seqlens)};
  Kokkos::parallel_for(
      "kdnn::ssm::causal_conv1d_update",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<long long>>(space, 0, (long long)(B * C)),
      kernel);
}

}  // namespace kdnn::ssm::impl
