// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of kdnn::attention::impl::{batched_gemm, batched_gemm_backward}:
// validation, then one strided batched GEMM (core/impl/strided_batched_gemm.hpp)
// over the row-major (b, h) matrices of the [B, H, rows, cols] tensors.
#include <string>
#include <utility>

#include "kdnn/attention/batched_gemm.hpp"
#include "kdnn/core/impl/strided_batched_gemm.hpp"
#include "kdnn/core/validate.hpp"

namespace kdnn::attention::impl {

/// Which of op_a, op_b, op_c transpose.
struct Transposes {
  bool a, b, c;
};

/// The three ops (each Op::none or Op::transpose) and finite α, β.
inline Transposes validate_ops(const char* op, Op op_a, Op op_b, Op op_c, double alpha,
                               double beta) {
  const auto transposes = [&](const char* name, Op value) {
    if (value != Op::none && value != Op::transpose) {
      fail(op, ": ", name, "=", int(value), ", expected Op::none or Op::transpose");
    }
    return value == Op::transpose;
  };
  const Transposes t{transposes("op_a", op_a), transposes("op_b", op_b), transposes("op_c", op_c)};
  validate::finite(op, "alpha", alpha);
  validate::finite(op, "beta", beta);
  return t;
}

/// M, K of op(X) for a [B, H, rows, cols] tensor X.
template <class View>
std::pair<std::size_t, std::size_t> op_shape(const View& X, bool trans) {
  return trans ? std::make_pair(X.extent(3), X.extent(2))
               : std::make_pair(X.extent(2), X.extent(3));
}

/// Checks A, B and C (the output, or dC, shaped as the output) for
/// C = op_c(op_a(A)·op_b(B)); throws kdnn::Error naming the first mismatch.
template <class AV, class BV, class CV>
void validate_gemm_shapes(const char* op, bool ta, bool tb, bool tc, const AV& A, const BV& B,
                          const char* c_name, const CV& C) {
  for (int d = 0; d < 2; ++d) {
    validate::extent(op, "B", B, d, A.extent(d), d == 0 ? "A's batch" : "A's heads");
    validate::extent(op, c_name, C, d, A.extent(d), d == 0 ? "A's batch" : "A's heads");
  }
  const auto [m, k] = op_shape(A, ta);
  const auto [kb, n] = op_shape(B, tb);
  if (kb != k) {
    fail(op, ": inner dimensions differ: op_a(A) is ", m, "x", k, ", op_b(B) is ", kb, "x", n,
         ", expected op_b(B) to have ", k, " rows");
  }
  const std::string what =
      std::string(tc ? "op_c(op_a(A)·op_b(B)), transposed: " : "op_a(A)·op_b(B): ");
  validate::extent(op, c_name, C, 2, tc ? n : m, what + "rows");
  validate::extent(op, c_name, C, 3, tc ? m : n, what + "columns");
}

template <class ExecSpace, class T>
void batched_gemm(const ExecSpace& space, Op op_a, Op op_b, Op op_c, T alpha,
                  const Tensor4<const T, ExecSpace>& A, const Tensor4<const T, ExecSpace>& B,
                  T beta, const Tensor4<T, ExecSpace>& C) {
  constexpr const char* op = "attention::batched_gemm";
  const auto [ta, tb, tc] = validate_ops(op, op_a, op_b, op_c, double(alpha), double(beta));
  validate_gemm_shapes(op, ta, tb, tc, A, B, "C", C);
  validate::disjoint(op, {validate::memory_of("C", C)},
                     {validate::memory_of("A", A), validate::memory_of("B", B)});

  using kdnn::impl::matrices_of;
  if (tc) {  // C = β C + α (op_a(A) op_b(B))ᵀ = β C + α op_b(B)ᵀ op_a(A)ᵀ
    kdnn::impl::strided_batched_gemm(space, !tb, !ta, alpha, matrices_of(B), matrices_of(A), beta,
                                     matrices_of(C));
  } else {
    kdnn::impl::strided_batched_gemm(space, ta, tb, alpha, matrices_of(A), matrices_of(B), beta,
                                     matrices_of(C));
  }
}

template <class ExecSpace, class T>
void batched_gemm_backward(const ExecSpace& space, Op op_a, Op op_b, Op op_c, T alpha,
                           const Tensor4<const T, ExecSpace>& A,
                           const Tensor4<const T, ExecSpace>& B, T beta,
                           const Tensor4<const T, ExecSpace>& dC, const Tensor4<T, ExecSpace>& dA,
                           const Tensor4<T, ExecSpace>& dB, const Tensor4<T, ExecSpace>& dC_in) {
  constexpr const char* op = "attention::batched_gemm_backward";
  const auto [ta, tb, tc] = validate_ops(op, op_a, op_b, op_c, double(alpha), double(beta));
  validate_gemm_shapes(op, ta, tb, tc, A, B, "dC", dC);
  const bool want_a = validate::given(dA), want_b = validate::given(dB),
             want_c = validate::given(dC_in);
  if (want_a) validate::same_shape(op, "dA", dA, "A", A);
  if (want_b) validate::same_shape(op, "dB", dB, "B", B);
  if (want_c) validate::same_shape(op, "dC_in", dC_in, "dC", dC);
  validate::disjoint(
      op,
      {validate::memory_of("dA", dA), validate::memory_of("dB", dB),
       validate::memory_of("dC_in", dC_in)},
      {validate::memory_of("A", A), validate::memory_of("B", B), validate::memory_of("dC", dC)});

  using kdnn::impl::matrices_of;
  const auto a = matrices_of(A);
  const auto b = matrices_of(B);
  const auto dc = matrices_of(dC);
  // op_c⁻¹(dC) is dC read with transpose tc; dP = α op_c⁻¹(dC).
  if (want_a) {
    if (!ta) {  // dA = dP op_b(B)ᵀ
      kdnn::impl::strided_batched_gemm(space, tc, !tb, alpha, dc, b, T(0), matrices_of(dA));
    } else {  // dA = (dP op_b(B)ᵀ)ᵀ = op_b(B) dPᵀ
      kdnn::impl::strided_batched_gemm(space, tb, !tc, alpha, b, dc, T(0), matrices_of(dA));
    }
  }
  if (want_b) {
    if (!tb) {  // dB = op_a(A)ᵀ dP
      kdnn::impl::strided_batched_gemm(space, !ta, tc, alpha, a, dc, T(0), matrices_of(dB));
    } else {  // dB = (op_a(A)ᵀ dP)ᵀ = dPᵀ op_a(A)
      kdnn::impl::strided_batched_gemm(space, !tc, ta, alpha, dc, a, T(0), matrices_of(dB));
    }
  }
  if (want_c) {
    const T* g = dC.data();
    T* out = dC_in.data();
    Kokkos::parallel_for(
        "kdnn::attention::batched_gemm_dc", Kokkos::RangePolicy<ExecSpace>(space, 0, dC.size()),
        KOKKOS_LAMBDA(std::size_t k) { out[k] = beta == T(0) ? T(0) : beta * g[k]; });
  }
}

}  // namespace kdnn::attention::impl
