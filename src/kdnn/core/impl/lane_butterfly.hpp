// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// A sum over the L vector lanes of one team thread (L a power of two, at
// most 32, the team's vector length), as a butterfly: in step s = L/2, L/4,
// …, 1 every lane adds the value of the lane whose index differs in bit s,
//   v_l ← v_l + v_{l xor s},
// so after log2 L steps every lane holds the same total (x + y and y + x are
// the same float). On a GPU a step is one __shfl_xor_sync among the
// thread's L lanes: no shared memory, no broadcast, no barrier, where a
// Kokkos vector reduction is a shuffle tree, a broadcast and a __syncwarp.
// On a host, where one thread plays the L lanes one after another, the same
// steps run on the lanes' values side by side, so the emulation gives the
// device's bits.
#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/unroll.hpp"

namespace kdnn::impl {

/// Whether L lanes can run a butterfly.
template <int L>
constexpr bool is_butterfly_width = L >= 1 && L <= 32 && (L & (L - 1)) == 0;

/// On a GPU (CUDA): this lane's value v in, the total of the calling
/// thread's L lanes out, on every lane. All L lanes must call it together,
/// and the team's vector length must be L.
template <int L, class T>
KOKKOS_FORCEINLINE_FUNCTION T lane_butterfly_sum(T v) {
  static_assert(is_butterfly_width<L>, "lane_butterfly_sum: L a power of two <= 32");
#if defined(__CUDA_ARCH__)
  if constexpr (L > 1) {
    // The thread's lanes are L consecutive lanes of the warp, starting at a
    // multiple of L (Kokkos lays a team thread's vector along threadIdx.x).
    const unsigned lane = (threadIdx.x + blockDim.x * threadIdx.y) % 32u;
    const unsigned mask = L == 32 ? 0xffffffffu : ((1u << L) - 1u) << (lane & ~unsigned(L - 1));
    KDNN_IMPL_UNROLL
    for (int s = L / 2; s > 0; s /= 2) v += __shfl_xor_sync(mask, v, s, L);
  }
  return v;
#else
  if constexpr (L > 1) Kokkos::abort("kdnn: lane_butterfly_sum of one lane's value needs a GPU");
  return v;
#endif
}

/// On a host: the L lanes' values v[0 … L) in, the same steps, every v[l]
/// the total out (bitwise what the device's lanes end with).
template <int L, class T>
KOKKOS_INLINE_FUNCTION void lane_butterfly_sum(T (&v)[L]) {
  static_assert(is_butterfly_width<L>, "lane_butterfly_sum: L a power of two <= 32");
  for (int s = L / 2; s > 0; s /= 2) {
    T next[L];
    for (int l = 0; l < L; ++l) next[l] = v[l] + v[l ^ s];
    for (int l = 0; l < L; ++l) v[l] = next[l];
  }
}

}  // namespace kdnn::impl
