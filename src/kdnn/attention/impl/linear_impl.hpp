// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of kdnn::attention::impl::{linear_forward, linear_backward}: the
// [B, S, ·] activations are read as (B·S)×· row-major matrices, so each
// product is one GEMM.
#include "kdnn/attention/linear.hpp"
#include "kdnn/core/impl/gemm.hpp"
#include "kdnn/core/validate.hpp"

namespace kdnn::attention::impl {

using kdnn::impl::MatrixView;

/// The rows×cols matrix of a [B, S, cols] tensor (rows = B·S).
template <class View>
MatrixView<typename View::value_type, typename View::memory_space> rows_of(const View& t) {
  using M = MatrixView<typename View::value_type, typename View::memory_space>;
  return M(t.data(), t.extent(0) * t.extent(1), t.extent(2));
}

inline void validate_wgrad_mode(const char* op, WgradMode mode) {
  if (mode != WgradMode::set && mode != WgradMode::add) {
    fail(op, ": mode=", int(mode), ", expected WgradMode::set or WgradMode::add");
  }
}

template <class ExecSpace, class T>
void linear_forward(const ExecSpace& space, const Tensor3<const T, ExecSpace>& x,
                    const Matrix<const T, ExecSpace>& W, const Vector<const T, ExecSpace>& b,
                    const Tensor3<T, ExecSpace>& y) {
  constexpr const char* op = "attention::linear_forward";
  const std::size_t out = W.extent(0), in = W.extent(1);
  validate::extent(op, "x", x, 2, in, "W's extent(1), the input features");
  validate::extent(op, "y", y, 0, x.extent(0), "x's batch");
  validate::extent(op, "y", y, 1, x.extent(1), "x's sequence length");
  validate::extent(op, "y", y, 2, out, "W's extent(0), the output features");
  const bool bias = validate::given(b);
  if (bias) validate::extent(op, "b", b, 0, out, "W's extent(0), the output features");
  validate::disjoint(
      op, {validate::memory_of("y", y)},
      {validate::memory_of("x", x), validate::memory_of("W", W), validate::memory_of("b", b)});

  const auto y2 = rows_of(y);
  if (bias && y2.extent(0) > 0) {  // y = b, then y += x·Wᵀ (as PyTorch's addmm)
    Kokkos::parallel_for(
        "kdnn::attention::linear_bias",
        Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>>(space, {0, 0},
                                                          {y2.extent(0), y2.extent(1)}),
        KOKKOS_LAMBDA(std::size_t r, std::size_t o) { y2(r, o) = b(o); });
  }
  kdnn::impl::gemm(space, false, true, T(1), rows_of(x), W, bias ? T(1) : T(0), y2);
}

template <class ExecSpace, class T>
void linear_backward(const ExecSpace& space, const Tensor3<const T, ExecSpace>& x,
                     const Matrix<const T, ExecSpace>& W, const Tensor3<const T, ExecSpace>& dy,
                     const Tensor3<T, ExecSpace>& dx, const Matrix<T, ExecSpace>& dW,
                     const Vector<T, ExecSpace>& db, WgradMode mode) {
  constexpr const char* op = "attention::linear_backward";
  validate_wgrad_mode(op, mode);
  const std::size_t out = W.extent(0), in = W.extent(1);
  validate::extent(op, "x", x, 2, in, "W's extent(1), the input features");
  validate::extent(op, "dy", dy, 0, x.extent(0), "x's batch");
  validate::extent(op, "dy", dy, 1, x.extent(1), "x's sequence length");
  validate::extent(op, "dy", dy, 2, out, "W's extent(0), the output features");
  validate::same_shape(op, "dW", dW, "W", W);
  const bool want_dx = validate::given(dx), want_db = validate::given(db);
  if (want_dx) validate::same_shape(op, "dx", dx, "x", x);
  if (want_db) validate::extent(op, "db", db, 0, out, "W's extent(0), the output features");
  validate::disjoint(
      op,
      {validate::memory_of("dx", dx), validate::memory_of("dW", dW), validate::memory_of("db", db)},
      {validate::memory_of("x", x), validate::memory_of("W", W), validate::memory_of("dy", dy)});

  const auto dy2 = rows_of(dy);
  const T keep = mode == WgradMode::add ? T(1) : T(0);
  if (want_dx) kdnn::impl::gemm(space, false, false, T(1), dy2, W, T(0), rows_of(dx));
  kdnn::impl::gemm(space, true, false, T(1), dy2, rows_of(x), keep, dW);
  if (want_db) {
    // db_o (+)= Σ_r dy_ro, summed in row order on every backend.
    const std::size_t rows = dy2.extent(0);
    Kokkos::parallel_for(
        "kdnn::attention::linear_bias_grad", Kokkos::RangePolicy<ExecSpace>(space, 0, out),
        KOKKOS_LAMBDA(std::size_t o) {
          T s = 0;
          for (std::size_t r = 0; r < rows; ++r) s += dy2(r, o);
          db(o) = keep == T(0) ? s : db(o) + s;
        });
  }
}

}  // namespace kdnn::attention::impl
