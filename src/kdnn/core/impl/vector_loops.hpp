// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The loops of a small vector algorithm (projected_cg.hpp) over its m
// entries, two ways, so that one algorithm serves both:
// - LaneLoops: one team thread's vector lanes share the entries (vectors in
//   team scratch), sums by Kokkos' vector reduction;
// - ThreadLoops<M>: one thread owns all M entries, M known at compile time
//   and every loop unrolled, so that vectors held in local arrays stay in
//   registers on a GPU.
// Both sum from 0 in index order where the vector loop is a plain loop (a
// host backend), so the two give bitwise the same results there.
#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/unroll.hpp"

namespace kdnn::impl {

template <class Member>
struct LaneLoops {
  const Member& team;
  int m;

  KOKKOS_INLINE_FUNCTION int size() const { return m; }
  /// f(k) for every k.
  template <class F>
  KOKKOS_INLINE_FUNCTION void for_each(const F& f) const {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, m), f);
  }
  /// Σ_k of what f(k, s) adds to s.
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION T sum(const F& f) const {
    T s = 0;
    Kokkos::parallel_reduce(Kokkos::ThreadVectorRange(team, m), f, s);
    return s;
  }
};

template <int M>
struct ThreadLoops {
  static KOKKOS_INLINE_FUNCTION constexpr int size() { return M; }
  template <class F>
  KOKKOS_INLINE_FUNCTION void for_each(const F& f) const {
    KDNN_IMPL_UNROLL
    for (int k = 0; k < M; ++k) f(k);
  }
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION T sum(const F& f) const {
    T s = 0;
    KDNN_IMPL_UNROLL
    for (int k = 0; k < M; ++k) f(k, s);
    return s;
  }
};

}  // namespace kdnn::impl
