// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Per-thread register tiles of the GPU forms' team kernels: a thread's M × N
// block of a product C = Aᵀ·B over K, with every size a compile-time
// constant so that the tile and its operands stay in registers, and its
// state kept across a team's barriers.
#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/team_gemm.hpp"
#include "kdnn/core/impl/unroll.hpp"

namespace kdnn::impl {

/// out[i·N + j] = Σ_{k<K} A(k, i)·B(k, j) for i < M, j < N, with
/// A(k, i) = a[k·a_k + i·a_i] and B(k, j) = b[k·b_k + j·b_j] (strides in
/// elements, normally compile-time constants after inlining), summed in
/// team_gemm's order: the products of kGemmKBlock consecutive k in order,
/// the partial sums added in order to a sum that starts at 0. An entry is
/// therefore bitwise the team_gemm entry of the same operands (without
/// contraction into FMAs, or with the same contraction).
template <int M, int N, int K, class T>
KOKKOS_FORCEINLINE_FUNCTION void register_tile_product(const T* a, int a_k, int a_i, const T* b,
                                                       int b_k, int b_j, T* out) {
  KDNN_IMPL_UNROLL
  for (int e = 0; e < M * N; ++e) out[e] = T(0);
  for (int k0 = 0; k0 < K; k0 += kGemmKBlock) {
    T part[M * N];
    KDNN_IMPL_UNROLL
    for (int e = 0; e < M * N; ++e) part[e] = T(0);
    const int k1 = K - k0 < kGemmKBlock ? K : k0 + kGemmKBlock;
    for (int k = k0; k < k1; ++k) {
      T x[M], y[N];
      KDNN_IMPL_UNROLL
      for (int i = 0; i < M; ++i) x[i] = a[k * a_k + i * a_i];
      KDNN_IMPL_UNROLL
      for (int j = 0; j < N; ++j) y[j] = b[k * b_k + j * b_j];
      KDNN_IMPL_UNROLL
      for (int i = 0; i < M; ++i) {
        KDNN_IMPL_UNROLL
        for (int j = 0; j < N; ++j) part[i * N + j] = multiply_add(x[i], y[j], part[i * N + j]);
      }
    }
    KDNN_IMPL_UNROLL
    for (int e = 0; e < M * N; ++e) out[e] += part[e];
  }
}

/// M values of V per team thread of a team of NT: one thread's own if
/// threads have private registers (a GPU backend, where the team has NT
/// threads), else all NT threads' side by side (a host backend, whose team
/// is one thread that plays the NT threads in turn).
template <class V, int NT, int M, bool Private>
struct ThreadRegisters {
  V a[Private ? 1 : NT][M];
  KOKKOS_FORCEINLINE_FUNCTION V* operator()(int t) { return a[Private ? 0 : t]; }
};

}  // namespace kdnn::impl
