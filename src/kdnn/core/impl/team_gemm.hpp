// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// C = A·B (or C += A·B) for small matrices in team scratch, computed by one
// team: C is cut into MR×NR register tiles spread over the team's threads
// and vector lanes. Each entry's sum over k is blocked: the products of
// kGemmKBlock consecutive k are summed in order, and those partial
// sums are added in order, so every entry of C has a fixed summation order
// (bitwise reproducible on a backend) and a float sum of K terms gathers
// rounding like K/16 + 16 terms, not K — as accurate as a BLAS
// GEMM's vector accumulators (an in-order sum of K = 224 made the fused
// attention's float32 gradients up to 7.7 times less accurate than a
// float32 reference summed that way).
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
// vectors (kHostGemmVectorBytes, host_simd.hpp: 32 bytes when kdnn was
// configured with AVX, else 16): the auto-vectoriser, left to plain
// loops, spills the accumulators or (with AVX2) emits gathers, measured 10×
// slower. On a GPU each lane keeps a small scalar tile.
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/host_simd.hpp"
#include "kdnn/core/impl/multiply_add.hpp"

namespace kdnn::impl {

/// The k of one partial sum of team_gemm (see above): blocks are
/// [m·16, (m + 1)·16) in absolute k, so that a product that skips leading
/// or trailing zero terms (GemmShape) sums the others exactly as the full
/// product does. 16 keeps the blocking's cost below one add per 16
/// multiply-adds.
constexpr int kGemmKBlock = 16;

/// Σ_{k<n} a[k]·b[k] summed in Acc in team_gemm's order (blocks of
/// kGemmKBlock, see above): equal to a team_gemm entry when Acc is T.
template <class Acc, class A, class B>
KOKKOS_INLINE_FUNCTION Acc gemm_order_dot(int n, const A& a, const B& b) {
  Acc sum = 0;
  for (int k0 = 0; k0 < n; k0 += kGemmKBlock) {
    const int k1 = n - k0 < kGemmKBlock ? n : k0 + kGemmKBlock;
    Acc part = 0;
    for (int k = k0; k < k1; ++k) part = multiply_add(Acc(a[k]), Acc(b[k]), part);
    sum += part;
  }
  return sum;
}

/// The end of the k block that holds k (clipped to k_end).
KOKKOS_INLINE_FUNCTION int gemm_block_end(int k, int k_end) {
  const int end = (k / kGemmKBlock + 1) * kGemmKBlock;
  return end < k_end ? end : k_end;
}

/// The register tile of team_gemm on ExecSpace for T.
template <class ExecSpace, class T>
struct GemmTile {
  static constexpr bool host = BackendTraits<ExecSpace>::is_host;
  static constexpr int simd_bytes = kHostGemmVectorBytes;  // host_simd.hpp
  /// Rows and columns of one tile: 4 or 8 (kHostGemmRows) × two SIMD
  /// vectors on a host (with each k block's partial sums, 16 of 16 vector
  /// registers, or 32 of AVX-512's 32), 2×2 per lane on a GPU.
  static constexpr int rows = host ? kHostGemmRows : 2;
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

/// One whole MR×NR tile on a host: NR/L vectors of L = SIMD width columns;
/// k runs over [k_begin, k_end), a and b point at k_begin.
template <int MR, int NR, int Bytes, class T>
KOKKOS_FORCEINLINE_FUNCTION void host_gemm_tile(int k_begin, int k_end, GemmA<T> a, const T* b,
                                                int ldb, T* c, int ldc, bool accumulate) {
#if KDNN_IMPL_HOST_SIMD
  using Vec = typename HostVector<T, Bytes>::type;
  constexpr int L = Bytes / int(sizeof(T)), NV = NR / L;
  static_assert(NR % L == 0, "host_gemm_tile: NR must be a multiple of the SIMD width");
  Vec sum[MR][NV], part[MR][NV];  // the tile's sums, and one k block's
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) sum[r][v] = Vec{};
  const T* ar[MR];  // the tile's rows of A; row r, column k at ar[r][k·col_stride]
  for (int r = 0; r < MR; ++r) ar[r] = a.data + std::size_t(r) * a.row_stride;
  for (int k0 = k_begin; k0 < k_end;) {
    const int k1 = gemm_block_end(k0, k_end);
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) part[r][v] = Vec{};
    for (int k = k0 - k_begin; k < k1 - k_begin; ++k) {
      const T* bk = b + std::size_t(k) * ldb;
      const std::size_t ak = std::size_t(k) * a.col_stride;
      Vec bv[NV];
      for (int v = 0; v < NV; ++v) __builtin_memcpy(&bv[v], bk + v * L, sizeof(Vec));
      for (int r = 0; r < MR; ++r) {
        const T ark = ar[r][ak];
        for (int v = 0; v < NV; ++v) part[r][v] += ark * bv[v];
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) sum[r][v] += part[r][v];
    k0 = k1;
  }
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) {
      T* out = c + std::size_t(r) * ldc + v * L;
      Vec x = sum[r][v];
      if (accumulate) {
        Vec y;
        __builtin_memcpy(&y, out, sizeof(Vec));
        x += y;
      }
      __builtin_memcpy(out, &x, sizeof(Vec));
    }
  }
#else
  (void)k_begin, (void)k_end, (void)a, (void)b, (void)ldb, (void)c, (void)ldc, (void)accumulate;
#endif
}

/// One whole MR×NR tile as scalars (a GPU lane, or a host without vectors);
/// k as in host_gemm_tile.
template <int MR, int NR, class T>
KOKKOS_FORCEINLINE_FUNCTION void scalar_gemm_tile(int k_begin, int k_end, GemmA<T> a, const T* b,
                                                  int ldb, T* c, int ldc, bool accumulate) {
  T sum[MR][NR], part[MR][NR];  // the tile's sums, and one k block's
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) sum[r][j] = T(0);
  for (int k0 = k_begin; k0 < k_end;) {
    const int k1 = gemm_block_end(k0, k_end);
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) part[r][j] = T(0);
    for (int k = k0 - k_begin; k < k1 - k_begin; ++k) {
      const T* bk = b + std::size_t(k) * ldb;
      for (int r = 0; r < MR; ++r) {
        const T ark = a.data[std::size_t(r) * a.row_stride + std::size_t(k) * a.col_stride];
        for (int j = 0; j < NR; ++j) part[r][j] = multiply_add(ark, bk[j], part[r][j]);
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) sum[r][j] += part[r][j];
    k0 = k1;
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) {
      T& out = c[std::size_t(r) * ldc + j];
      out = accumulate ? out + sum[r][j] : sum[r][j];
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
    if constexpr (Tile::host && KDNN_IMPL_HOST_SIMD) {
      host_gemm_tile<MR, NR, Tile::simd_bytes>(k0, k1, at, bt, ldb, ct, ldc, accumulate);
    } else {
      scalar_gemm_tile<MR, NR>(k0, k1, at, bt, ldb, ct, ldc, accumulate);
    }
  });
}

}  // namespace kdnn::impl
