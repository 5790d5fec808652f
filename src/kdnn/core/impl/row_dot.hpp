// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Σ_k a[k]·b[k] over one row of n values, by one team thread and its vector
// lanes, summed in T in a fixed order on each backend. On a host the sum is
// kept in L = 16 / sizeof(T) interleaved partial sums (the terms k ≡ l mod
// L in lane l) of an explicit 16-byte vector, added lane by lane at the end:
// GCC does not vectorise a floating-point sum without reassociating it. On a
// GPU it is Kokkos' reduction over the vector lanes.
#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/lanes.hpp"

namespace kdnn::impl {

template <class ExecSpace, class Member, class T>
KOKKOS_INLINE_FUNCTION T row_dot(const Member& team, int n, const T* a, const T* b) {
#if KDNN_IMPL_HOST_SIMD
  if constexpr (BackendTraits<ExecSpace>::is_host) {
    (void)team;
    using Vec = typename HostVector<T, 16>::type;
    constexpr int L = HostVector<T, 16>::width;
    Vec acc = {};
    int k = 0;
    for (; k + L <= n; k += L) {
      Vec va, vb;
      __builtin_memcpy(&va, a + k, sizeof va);
      __builtin_memcpy(&vb, b + k, sizeof vb);
      acc += va * vb;
    }
    T s = 0;
    for (int l = 0; l < L; ++l) s += acc[l];
    for (; k < n; ++k) s += a[k] * b[k];
    return s;
  }
#endif
  T s = 0;
  Kokkos::parallel_reduce(
      Kokkos::ThreadVectorRange(team, n), [&](int k, T& acc) { acc += a[k] * b[k]; }, s);
  return s;
}

}  // namespace kdnn::impl
