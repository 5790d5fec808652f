// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Dot products of N values held in registers (indexed by compile-time
// constants) with a vector y, for the kernels that keep rows of a small
// matrix in registers (Sinkhorn's thread and lane forms).
// - lane_dot<N>(a, y): y anywhere (registers too); Σ_k a_k y_k from k = 0 in
//   index order, as col_dot_one sums, so that these forms can match a host
//   form bitwise.
// - lane_dot_shared<N, Chains>(a, y): y a vector in team scratch that every
//   lane of a group reads (lane k holding row k of the matrix). Where N
//   values of T fill whole 16-byte pieces, y is read piece by piece (one
//   ld.shared.v4.f32 or v2.f64, a broadcast among the lanes: a quarter or a
//   half of the shared-memory instructions of a value-by-value read), and y
//   must then start on a 16-byte boundary (checked on a host). With
//   Chains = 1 the sum is lane_dot's, bit for bit; with Chains = C > 1 it is
//   C independent partial sums, chain c taking the k ≡ c (mod C) in order,
//   added pairwise at the end ((0 + 1) + (2 + 3)): C chains of FMAs in flight
//   where one chain waits for each of its N FMAs in turn.
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "kdnn/core/impl/matrix_copy.hpp"
#include "kdnn/core/impl/unroll.hpp"

namespace kdnn::impl {

/// Whether lane_dot_shared<N> reads y in 16-byte pieces.
template <int N, class T>
constexpr bool lane_dot_reads_pieces = N * sizeof(T) % 16 == 0;

template <int N, class T>
KOKKOS_FORCEINLINE_FUNCTION T lane_dot(const T* a, const T* y) {
  T s = a[0] * y[0];
  KDNN_IMPL_UNROLL
  for (int k = 1; k < N; ++k) s += a[k] * y[k];
  return s;
}

template <int N, int Chains = 1, class T>
KOKKOS_FORCEINLINE_FUNCTION T lane_dot_shared(const T* a, const T* y) {
  static_assert(Chains == 1 || Chains == 2 || Chains == 4, "lane_dot_shared: 1, 2 or 4 chains");
  static_assert(N % Chains == 0, "lane_dot_shared: N a multiple of Chains");
  T s[Chains];
  const auto add = [&](int k, T yk) {
    if (k < Chains) {
      s[k] = a[k] * yk;
    } else {
      s[k % Chains] += a[k] * yk;
    }
  };
  if constexpr (lane_dot_reads_pieces<N, T>) {
#if !defined(__CUDA_ARCH__)
    if (reinterpret_cast<std::uintptr_t>(y) % 16 != 0) {
      Kokkos::abort("kdnn: lane_dot_shared's vector must start on a 16-byte boundary");
    }
#endif
    constexpr int P = Piece16<T>::size;
    KDNN_IMPL_UNROLL
    for (int q = 0; q < N / P; ++q) {
      const Piece16<T> piece = load_piece(y + q * P);
      KDNN_IMPL_UNROLL
      for (int e = 0; e < P; ++e) add(q * P + e, piece.v[e]);
    }
  } else {
    KDNN_IMPL_UNROLL
    for (int k = 0; k < N; ++k) add(k, y[k]);
  }
  if constexpr (Chains == 1) {
    return s[0];
  } else if constexpr (Chains == 2) {
    return s[0] + s[1];
  } else {
    return (s[0] + s[1]) + (s[2] + s[3]);
  }
}

}  // namespace kdnn::impl
