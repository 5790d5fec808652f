// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// One small N×N matrix between memory (row stride ld) and a thread's
// registers, for the kernels that give each thread a whole matrix (the
// Sinkhorn thread forms). Where the matrix is one contiguous span (ld = N)
// of a multiple of 16 bytes that starts on a 16-byte boundary, it moves in
// 16-byte pieces: on a GPU one vector load or store each (ld.global.v4.f32,
// v2.f64) where value by value it would be four or two; elsewhere, and
// always on a host, value by value. Either way element (i, j) is p[i·ld + j]
// and nothing outside the matrix is read or written.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>

#include "kdnn/core/impl/unroll.hpp"

namespace kdnn::impl {

/// 16 bytes of T, as one access.
template <class T>
struct alignas(16) Piece16 {
  static constexpr int size = int(16 / sizeof(T));
  T v[size];
};

/// Whether an N×N matrix of T at p with row stride ld moves in 16-byte
/// pieces.
template <int N, class T>
KOKKOS_FORCEINLINE_FUNCTION bool moves_in_pieces(const T* p, int ld) {
  if constexpr (N * N * sizeof(T) % 16 != 0) {
    (void)p, (void)ld;
    return false;
  } else {
    return ld == N && reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
  }
}

template <class T>
KOKKOS_FORCEINLINE_FUNCTION Piece16<T> load_piece(const T* p) {
  Piece16<T> x;
#if defined(__CUDA_ARCH__)
  x = *reinterpret_cast<const Piece16<T>*>(p);
#else
  std::memcpy(x.v, p, sizeof x.v);
#endif
  return x;
}

template <class T>
KOKKOS_FORCEINLINE_FUNCTION void store_piece(const Piece16<T>& x, T* p) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<Piece16<T>*>(p) = x;
#else
  std::memcpy(p, x.v, sizeof x.v);
#endif
}

/// m[i][j] = p[i·ld + j].
template <int N, class T>
KOKKOS_INLINE_FUNCTION void load_matrix(const T* p, int ld, T (&m)[N][N]) {
  constexpr int C = Piece16<T>::size;
  if (moves_in_pieces<N>(p, ld)) {
    KDNN_IMPL_UNROLL
    for (int q = 0; q < N * N / C; ++q) {
      const Piece16<T> x = load_piece(p + q * C);
      KDNN_IMPL_UNROLL
      for (int e = 0; e < C; ++e) m[(q * C + e) / N][(q * C + e) % N] = x.v[e];
    }
    return;
  }
  KDNN_IMPL_UNROLL
  for (int i = 0; i < N; ++i) {
    KDNN_IMPL_UNROLL
    for (int j = 0; j < N; ++j) m[i][j] = p[i * ld + j];
  }
}

/// p[i·ld + j] = m[i][j].
template <int N, class T>
KOKKOS_INLINE_FUNCTION void store_matrix(const T (&m)[N][N], T* p, int ld) {
  constexpr int C = Piece16<T>::size;
  if (moves_in_pieces<N>(p, ld)) {
    KDNN_IMPL_UNROLL
    for (int q = 0; q < N * N / C; ++q) {
      Piece16<T> x;
      KDNN_IMPL_UNROLL
      for (int e = 0; e < C; ++e) x.v[e] = m[(q * C + e) / N][(q * C + e) % N];
      store_piece(x, p + q * C);
    }
    return;
  }
  KDNN_IMPL_UNROLL
  for (int i = 0; i < N; ++i) {
    KDNN_IMPL_UNROLL
    for (int j = 0; j < N; ++j) p[i * ld + j] = m[i][j];
  }
}

}  // namespace kdnn::impl
