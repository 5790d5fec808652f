#pragma once
// C = A·B (or C += A·B) for small matrices in team scratch, computed by one
// team: C is cut into MR×NR register tiles spread over the team's threads
// and vector lanes; each tile's sums run over k in order, so every entry of
// C has a fixed summation order (bitwise reproducible on a backend).
//
// Layouts (leading dimensions in elements):
//   A [M×K] either row-major, A(i, k) = a[i·lda + k]   (GemmA::rows)
//           or "k-major",     A(i, k) = a[k·lda + i]   (GemmA::k_major,
//              i.e. Aᵀ row-major: a product with a transposed factor
//              needs no transpose)
//   B [K×N] row-major,        B(k, j) = b[k·ldb + j]
//   C [M×N] row-major,        C(i, j) = c[i·ldc + j]
// Per k a tile broadcasts MR values of A (either layout costs the same) and
// reads NR consecutive values of B. The tiles are always whole: M and N must
// be multiples of GemmTile::align and the operands' pads (rows or columns
// past the live ones) must hold finite values, normally zeros — callers pad
// their scratch (GemmTile::pad) rather than handle ragged edges. K is any
// count ≥ 0.
//
// On a host with GCC or Clang the NR columns of a tile are two explicit SIMD
// vectors (32 bytes with AVX, else 16): the auto-vectoriser, left to plain
// loops, spills the accumulators or (with AVX2) emits gathers, measured 10×
// slower. On a GPU each lane keeps a small scalar tile.
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/impl/backend_traits.hpp"

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__) && \
    !defined(__HIP_DEVICE_COMPILE__)
#define KDNN_IMPL_HOST_SIMD_GEMM 1
#else
#define KDNN_IMPL_HOST_SIMD_GEMM 0
#endif

namespace kdnn::impl {

/// The register tile of team_gemm on ExecSpace for T.
template <class ExecSpace, class T>
struct GemmTile {
  static constexpr bool host = BackendTraits<ExecSpace>::is_host;
#if defined(__AVX__)
  static constexpr int simd_bytes = 32;
#else
  static constexpr int simd_bytes = 16;
#endif
  /// Rows and columns of one tile: 4 × two SIMD vectors on a host (8 or 12
  /// accumulator registers of 16), 2×2 per lane on a GPU.
  static constexpr int rows = host ? 4 : 2;
  static constexpr int cols = host ? 2 * simd_bytes / int(sizeof(T)) : 2;
  /// What M and N must be multiples of.
  static constexpr int align = rows > cols ? rows : cols;
  /// n rounded up to a multiple of align.
  KOKKOS_INLINE_FUNCTION static constexpr int pad(int n) { return (n + align - 1) / align * align; }
};

/// A [M×K] operand of team_gemm: A(i, k) = data[i·row_stride + k·col_stride].
template <class T>
struct GemmA {
  const T* data;
  int row_stride, col_stride;
  /// Row-major A with leading dimension lda.
  KOKKOS_INLINE_FUNCTION static GemmA rows(const T* a, int lda) { return {a, lda, 1}; }
  /// A stored transposed (Aᵀ row-major, leading dimension lda).
  KOKKOS_INLINE_FUNCTION static GemmA k_major(const T* a, int lda) { return {a, 1, lda}; }
};

/// One whole MR×NR tile on a host: NR/L vectors of L = SIMD width columns.
template <int MR, int NR, int Bytes, class T>
KOKKOS_FORCEINLINE_FUNCTION void host_gemm_tile(int K, GemmA<T> a, const T* b, int ldb, T* c,
                                                int ldc, bool accumulate) {
#if KDNN_IMPL_HOST_SIMD_GEMM
  typedef T Vec __attribute__((vector_size(Bytes)));
  constexpr int L = Bytes / int(sizeof(T)), NV = NR / L;
  static_assert(NR % L == 0, "host_gemm_tile: NR must be a multiple of the SIMD width");
  Vec acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = Vec{};
  const T* ar[MR];  // the tile's rows of A; row r, column k at ar[r][k·col_stride]
  for (int r = 0; r < MR; ++r) ar[r] = a.data + std::size_t(r) * a.row_stride;
  for (int k = 0; k < K; ++k) {
    const T* bk = b + std::size_t(k) * ldb;
    const std::size_t ak = std::size_t(k) * a.col_stride;
    Vec bv[NV];
    for (int v = 0; v < NV; ++v) __builtin_memcpy(&bv[v], bk + v * L, sizeof(Vec));
    for (int r = 0; r < MR; ++r) {
      const T ark = ar[r][ak];
      for (int v = 0; v < NV; ++v) acc[r][v] += ark * bv[v];
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) {
      T* out = c + std::size_t(r) * ldc + v * L;
      Vec x = acc[r][v];
      if (accumulate) {
        Vec y;
        __builtin_memcpy(&y, out, sizeof(Vec));
        x += y;
      }
      __builtin_memcpy(out, &x, sizeof(Vec));
    }
  }
#else
  (void)K, (void)a, (void)b, (void)ldb, (void)c, (void)ldc, (void)accumulate;
#endif
}

/// One whole MR×NR tile as scalars (a GPU lane, or a host without vectors).
template <int MR, int NR, class T>
KOKKOS_FORCEINLINE_FUNCTION void scalar_gemm_tile(int K, GemmA<T> a, const T* b, int ldb, T* c,
                                                  int ldc, bool accumulate) {
  T acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) acc[r][j] = T(0);
  for (int k = 0; k < K; ++k) {
    const T* bk = b + std::size_t(k) * ldb;
    for (int r = 0; r < MR; ++r) {
      const T ark = a.data[std::size_t(r) * a.row_stride + std::size_t(k) * a.col_stride];
      for (int j = 0; j < NR; ++j) acc[r][j] += ark * bk[j];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) {
      T& out = c[std::size_t(r) * ldc + j];
      out = accumulate ? out + acc[r][j] : acc[r][j];
    }
}

/// Which entries of a product are needed or which factor is triangular, so
/// that team_gemm skips the work that cannot contribute (causal products of
/// a chunked scan). With tiles of MR rows and NR columns at (i0, j0):
enum class GemmShape {
  full,       ///< every tile, k over [0, K)
  lower_out,  ///< only C(i, j) with j ≤ i is needed: tiles wholly above the
              ///< diagonal (j0 > i0 + MR − 1) are skipped and left unwritten
  a_lower,    ///< A(i, k) = 0 for k > i: k over [0, i0 + MR)
  a_upper,    ///< A(i, k) = 0 for k < i: k over [i0, K)
  b_lower     ///< B(k, j) = 0 for k < j: k over [j0, K)
};

/// C = A·B, or C += A·B with `accumulate` (layouts above); `shape` may skip
/// work that cannot contribute (GemmShape). The caller synchronises the team
/// before C is read.
template <class ExecSpace, class Member, class T>
KOKKOS_INLINE_FUNCTION void team_gemm(const Member& team, int M, int N, int K, GemmA<T> a,
                                      const T* b, int ldb, T* c, int ldc, bool accumulate,
                                      GemmShape shape = GemmShape::full) {
  using Tile = GemmTile<ExecSpace, T>;
  constexpr int MR = Tile::rows, NR = Tile::cols;
  const int tiles_n = N / NR;
  Kokkos::parallel_for(Kokkos::TeamVectorRange(team, (M / MR) * tiles_n), [&](int t) {
    const int i0 = t / tiles_n * MR, j0 = t % tiles_n * NR;
    if (shape == GemmShape::lower_out && j0 > i0 + MR - 1) return;
    int k0 = 0, k1 = K;
    if (shape == GemmShape::a_lower) k1 = i0 + MR < K ? i0 + MR : K;
    if (shape == GemmShape::a_upper) k0 = i0 < K ? i0 : K;
    if (shape == GemmShape::b_lower) k0 = j0 < K ? j0 : K;
    const GemmA<T> at{a.data + std::size_t(i0) * a.row_stride + std::size_t(k0) * a.col_stride,
                      a.row_stride, a.col_stride};
    const T* bt = b + std::size_t(k0) * ldb + j0;
    T* ct = c + std::size_t(i0) * ldc + j0;
    if constexpr (Tile::host && KDNN_IMPL_HOST_SIMD_GEMM) {
      host_gemm_tile<MR, NR, Tile::simd_bytes>(k1 - k0, at, bt, ldb, ct, ldc, accumulate);
    } else {
      scalar_gemm_tile<MR, NR>(k1 - k0, at, bt, ldb, ct, ldc, accumulate);
    }
  });
}

}  // namespace kdnn::impl
