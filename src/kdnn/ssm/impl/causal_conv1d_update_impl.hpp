// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definition of kdnn::ssm::impl::causal_conv1d_update.
#include <climits>
#include <cstddef>

#include "kdnn/core/error.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/ssm/causal_conv1d_update.hpp"
#include "kdnn/ssm/impl/causal_conv1d_inputs.hpp"

namespace kdnn::ssm::impl {

/// One thread per (b, c): its state row and new steps are its own, so it
/// computes every output from the old state, then shifts the row in place
/// (ascending, each value read before it is overwritten).
template <class ExecSpace, class T>
struct ConvUpdateKernel {
  ConvUpdate<T, ExecSpace> a;
  bool has_bias = false;

  KOKKOS_INLINE_FUNCTION void operator()(long long row) const {
    const int C = int(a.x.extent(1)), L = int(a.x.extent(2)), W = int(a.state.extent(2));
    const int K = int(a.w.extent(1));
    const int b = int(row / C), c = int(row % C);
    T* state = &a.state(b, c, 0);
    const T* x = &a.x(b, c, 0);
    // x̄[s]: the state for s < W, the new steps after it.
    const auto xbar = [&](int s) { return s < W ? state[s] : x[s - W]; };
    for (int t = 0; t < L; ++t) {
      T z = has_bias ? a.bias(c) : T(0);
      for (int k = 0; k < K; ++k) z += a.w(c, k) * xbar(W + t - K + 1 + k);
      a.y(b, c, t) = a.silu ? z * sigmoid(z) : z;
    }
    for (int s = 0; s < W; ++s) state[s] = xbar(s + L);
  }
};

template <class ExecSpace, class T>
void causal_conv1d_update(const ExecSpace& space, const ConvUpdate<T, ExecSpace>& a) {
  constexpr const char* op = "ssm::causal_conv1d_update";
  const std::size_t B = a.x.extent(0), C = a.x.extent(1), K = a.w.extent(1);
  if (K < 1) fail(op, ": w has extent(1)=", K, ", expected K >= 1");
  validate::extent(op, "w", a.w, 0, C, "C, x's extent(1)");
  validate::extent(op, "state", a.state, 0, B, "B, x's extent(0)");
  validate::extent(op, "state", a.state, 1, C, "C, x's extent(1)");
  if (a.state.extent(2) < K - 1) {
    fail(op, ": state has extent(2)=", a.state.extent(2), ", expected W >= K-1=", K - 1,
         " (from w's extent(1))");
  }
  if (validate::given(a.bias)) validate::extent(op, "bias", a.bias, 0, C, "C, x's extent(1)");
  validate::same_shape(op, "y", a.y, "x", a.x);
  if (C > std::size_t(INT_MAX) || a.x.extent(2) > std::size_t(INT_MAX) ||
      a.state.extent(2) > std::size_t(INT_MAX / 2) || K > std::size_t(INT_MAX / 2)) {
    fail(op, ": x has shape [", B, ", ", C, ", ", a.x.extent(2), "], W=", a.state.extent(2),
         " and K=", K, ", expected C, Lnew < 2^31 and W, K < 2^30");
  }
  using validate::memory_of;
  validate::disjoint(op, {memory_of("y", a.y), memory_of("state", a.state)},
                     {memory_of("x", a.x), memory_of("w", a.w), memory_of("bias", a.bias)});
  if (B * C == 0) return;
  ConvUpdateKernel<ExecSpace, T> kernel{a, validate::given(a.bias)};
  Kokkos::parallel_for(
      "kdnn::ssm::causal_conv1d_update",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<long long>>(space, 0, (long long)(B * C)),
      kernel);
}

}  // namespace kdnn::ssm::impl
