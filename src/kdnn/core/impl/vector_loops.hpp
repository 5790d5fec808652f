// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The loops of a small vector algorithm (projected_cg.hpp) over its m
// entries, three ways, so that one algorithm serves all:
// - LaneLoops: one team thread's vector lanes share the entries (vectors in
//   team scratch), sums by Kokkos' vector reduction;
// - ButterflyLoops<L, Private>: the same sharing among exactly L lanes
//   (the team's vector length), entry k on lane k mod L; each lane sums its
//   own entries in order, then lane_butterfly_sum (lane_butterfly.hpp) adds
//   the lanes' sums: the same bits on a GPU (Private: a lane's sum in its
//   own register, shuffles) and on a host (the L sums side by side);
// - ThreadLoops<M>: one thread owns all M entries, M known at compile time
//   and every loop unrolled, so that vectors held in local arrays stay in
//   registers on a GPU.
// Each has sum (one sum) and two_sums (two sums of the same entries in one
// pass where the loops allow it: one butterfly round for both on lanes).
// LaneLoops and ThreadLoops sum from 0 in index order where the vector loop
// is a plain loop (a host backend), so those two give bitwise the same
// results there; ButterflyLoops sums in its own order on every backend.
#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/lane_butterfly.hpp"
#include "kdnn/core/impl/unroll.hpp"

namespace kdnn::impl {

/// What two_sums returns.
template <class T>
struct TwoSums {
  T first, second;
};

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
  /// {Σ_k of what f(k, s0, s1) adds to s0, the same for s1}. f must only
  /// read: here it runs once per sum (two vector reductions).
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION TwoSums<T> two_sums(const F& f) const {
    const T first = sum<T>([&](int k, T& s) {
      T unused = 0;
      f(k, s, unused);
    });
    const T second = sum<T>([&](int k, T& s) {
      T unused = 0;
      f(k, unused, s);
    });
    return {first, second};
  }
};

template <int L, bool Private, class Member>
struct ButterflyLoops : LaneLoops<Member> {
  static_assert(is_butterfly_width<L>, "ButterflyLoops: L a power of two <= 32");
  using LaneLoops<Member>::team;
  using LaneLoops<Member>::m;

  template <class T, class F>
  KOKKOS_INLINE_FUNCTION T sum(const F& f) const {
    if constexpr (Private) {
      T s = 0;  // this lane's: on a GPU lane l runs k = l, l + L, …
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, m), [&](int k) { f(k, s); });
      return lane_butterfly_sum<L>(s);
    } else {
      T s[L] = {};
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, m), [&](int k) { f(k, s[k % L]); });
      lane_butterfly_sum<L>(s);
      return s[0];
    }
  }
  /// Both sums in one pass over the lane's entries, then both butterflies
  /// (independent shuffles, which the device overlaps).
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION TwoSums<T> two_sums(const F& f) const {
    if constexpr (Private) {
      T s0 = 0, s1 = 0;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, m), [&](int k) { f(k, s0, s1); });
      return {lane_butterfly_sum<L>(s0), lane_butterfly_sum<L>(s1)};
    } else {
      T s0[L] = {}, s1[L] = {};
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, m),
                           [&](int k) { f(k, s0[k % L], s1[k % L]); });
      lane_butterfly_sum<L>(s0);
      lane_butterfly_sum<L>(s1);
      return {s0[0], s1[0]};
    }
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
  template <class T, class F>
  KOKKOS_INLINE_FUNCTION TwoSums<T> two_sums(const F& f) const {
    T s0 = 0, s1 = 0;
    KDNN_IMPL_UNROLL
    for (int k = 0; k < M; ++k) f(k, s0, s1);
    return {s0, s1};
  }
};

}  // namespace kdnn::impl
