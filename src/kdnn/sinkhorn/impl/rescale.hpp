// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// One normalisation of R = diag(u) P diag(v) by its scaling vectors, shared by
// the forward and the unrolled backward's replay. Dividing R's columns by
// (their sums + eps) is v_j <- v_j / (v_j (Pᵀu)_j + eps), i.e. 1 / (Pᵀu)_j for
// eps = 0; dividing its rows is the same with P, u and v in the roles of Pᵀ,
// v and u.
#include "kdnn/core/impl/col_dot.hpp"
#include "kdnn/core/impl/lanes.hpp"

namespace kdnn::sinkhorn::impl {

/// The scaling form's start after the first iteration: P and Pᵀ in C from
/// its output, read through p1(i, j) -> C, and u = v = 1.
template <class Member, class P1At, class C>
KOKKOS_INLINE_FUNCTION void start_scaling(const Member& team, int n, const P1At& p1, C* P, C* PT,
                                          int ld, C* u, C* v) {
  const auto lanes = Kokkos::ThreadVectorRange(team, n);
  for (int i = 0; i < n; ++i) {
    Kokkos::parallel_for(lanes, [&](int j) {
      P[i * ld + j] = p1(i, j);
      PT[j * ld + i] = P[i * ld + j];
    });
  }
  Kokkos::parallel_for(lanes, [&](int k) { u[k] = v[k] = kdnn::impl::broadcast<C>(1); });
}

/// A scale after one normalisation of its line, whose sum before it is
/// scale·sum: scale / (scale·sum + eps), for eps = 0 exactly 1 / sum. C may
/// be a lanes vector (lanes.hpp), eps is a plain number.
template <class C, class E>
KOKKOS_INLINE_FUNCTION C rescaled(C scale, C sum, E eps) {
  return eps == 0 ? E(1) / sum : scale / (scale * sum + eps);
}

/// scale_out_j = rescaled(scale_in_j, (Aᵀx)_j, eps) for A = P (columns,
/// x = u, scale = v) or A = Pᵀ (rows, x = v, scale = u); in place allowed.
/// The eps = 0 case is a call of its own, so that its loop has no branch.
template <class ExecSpace, class Member, class C, class E>
KOKKOS_FORCEINLINE_FUNCTION void rescale(const Member& team, int n, const C* A, int ld, const C* x,
                                         const C* scale_in, C* scale_out, E eps) {
  if (eps == 0) {
    kdnn::impl::col_dot<ExecSpace>(
        team, n, A, ld, x, [&](int j, C s) { scale_out[j] = rescaled(scale_in[j], s, E(0)); });
  } else {
    kdnn::impl::col_dot<ExecSpace>(
        team, n, A, ld, x, [&](int j, C s) { scale_out[j] = rescaled(scale_in[j], s, eps); });
  }
}

}  // namespace kdnn::sinkhorn::impl
