// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// A rank-4 tensor whose last dimension is contiguous, as a kernel reads it:
// the pointer, three strides and the extents, with the last stride 1 known
// at compile time. A LayoutStride View indexes (b, h, i, d) as
// b·s0 + h·s1 + i·s2 + d·s3 with s3 a run-time value: a GPU kernel that
// unrolls its loads over d then holds the products d·s3 in registers, where
// here the column offsets are immediates, as with a LayoutRight View. Made
// from a View whose last stride the caller has checked to be 1 (or whose
// last extent is at most 1); it does not own the memory, the View does.
//
// Packed sequences (flash-attn's varlen layout) are the same tensors with a
// ragged third dimension: entry b's rows begin at row rows_at[b] of one
// packed dimension (s0 = 0) and number rows_at[b + 1] − rows_at[b], at
// most n[2]; (b, h, i, d) is then row rows_at[b] + i.
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <type_traits>

namespace kdnn::impl {

template <class T>
struct StridedRows4 {
  using value_type = T;
  using non_const_value_type = std::remove_const_t<T>;

  T* ptr = nullptr;
  std::size_t s0 = 0, s1 = 0, s2 = 0;  ///< strides of the first three dimensions
  std::size_t n[4] = {0, 0, 0, 0};     ///< extents
  const int* rows_at = nullptr;        ///< packed: [n[0] + 1] offsets on the device; else null

  StridedRows4() = default;
  /// From a rank-4 View of any layout (the last stride 1 or the last extent
  /// at most 1, checked by the caller).
  template <class View, class = std::enable_if_t<Kokkos::is_view<View>::value>>
  StridedRows4(const View& v)  // NOLINT(google-explicit-constructor): a View converts
      : ptr(v.data()),
        s0(v.stride(0)),
        s1(v.stride(1)),
        s2(v.stride(2)),
        n{v.extent(0), v.extent(1), v.extent(2), v.extent(3)} {
    static_assert(unsigned(View::rank) == 4, "StridedRows4: a View of rank 4");
  }

  /// Entry b's first row: 0, or its offset when packed.
  KOKKOS_FORCEINLINE_FUNCTION int first_row(int b) const { return rows_at ? rows_at[b] : 0; }
  /// Entry b's rows: n[2], or its length when packed.
  KOKKOS_FORCEINLINE_FUNCTION int rows(int b) const {
    return rows_at ? rows_at[b + 1] - rows_at[b] : int(n[2]);
  }
  KOKKOS_FORCEINLINE_FUNCTION T& operator()(int b, int h, int i, int d) const {
    return ptr[b * s0 + h * s1 + std::size_t(first_row(b) + i) * s2 + d];
  }
  KOKKOS_FORCEINLINE_FUNCTION std::size_t extent(int r) const { return n[r]; }
  KOKKOS_FORCEINLINE_FUNCTION std::size_t size() const { return n[0] * n[1] * n[2] * n[3]; }
  KOKKOS_FORCEINLINE_FUNCTION T* data() const { return ptr; }
};

/// One value per row of a StridedRows4 ([B, H, S]: the attention's
/// log-sum-exp and δ), dense or packed alike: (b, h, i) at
/// b·s0 + h·s1 + (first row of b + i)·s2.
template <class T>
struct StridedRows3 {
  T* ptr = nullptr;
  std::size_t s0 = 0, s1 = 0, s2 = 0;
  std::size_t n[3] = {0, 0, 0};
  const int* rows_at = nullptr;  ///< as StridedRows4's

  StridedRows3() = default;
  /// From a rank-3 View of any layout.
  template <class View, class = std::enable_if_t<Kokkos::is_view<View>::value>>
  StridedRows3(const View& v)  // NOLINT(google-explicit-constructor): a View converts
      : ptr(v.data()),
        s0(v.stride(0)),
        s1(v.stride(1)),
        s2(v.stride(2)),
        n{v.extent(0), v.extent(1), v.extent(2)} {
    static_assert(unsigned(View::rank) == 3, "StridedRows3: a View of rank 3");
  }

  KOKKOS_FORCEINLINE_FUNCTION T& operator()(int b, int h, int i) const {
    return ptr[b * s0 + h * s1 + std::size_t((rows_at ? rows_at[b] : 0) + i) * s2];
  }
  KOKKOS_FORCEINLINE_FUNCTION std::size_t extent(int r) const { return n[r]; }
  KOKKOS_FORCEINLINE_FUNCTION T* data() const { return ptr; }
};

}  // namespace kdnn::impl
