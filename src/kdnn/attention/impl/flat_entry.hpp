// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The packed tensors of the varlen fused attention ([T, H, ·], lse [H, T])
// as the one flat batch entry of the dense call ([1, H, T, ·], [1, H, T]),
// over the caller's memory: FusedAttentionVarlenForward/Backward::dense().
#include <Kokkos_Core.hpp>

namespace kdnn::attention::impl {

/// A packed [T, H, ·] tensor as the flat entry [1, H, T, ·]; unmanaged (the
/// caller's View holds the memory).
template <class View>
auto flat_entry(const View& x) {
  static_assert(unsigned(View::rank) == 3, "flat_entry: a packed [T, H, ·] View");
  using Flat = Kokkos::View<typename View::value_type****, Kokkos::LayoutStride,
                            typename View::memory_space>;
  return Flat(x.data(), Kokkos::LayoutStride(1, 0, x.extent(1), x.stride(1), x.extent(0),
                                             x.stride(0), x.extent(2), x.stride(2)));
}

/// lse [H, T] as the flat entry [1, H, T].
template <class View>
auto flat_values(const View& lse) {
  static_assert(unsigned(View::rank) == 2, "flat_values: a packed [H, T] View");
  using Flat =
      Kokkos::View<typename View::value_type***, Kokkos::LayoutRight, typename View::memory_space>;
  return Flat(lse.data(), 1, lse.extent(0), lse.extent(1));
}

}  // namespace kdnn::attention::impl
