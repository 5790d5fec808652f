// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// A 64-bit fingerprint of a small View's values, for checking that a
// parameter holds the same values on every rank of a collective call
// without sending the values: equal Views give equal fingerprints on every
// backend and thread mapping; unequal ones collide with probability ~2^-64.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kdnn/core/impl/space_lock.hpp"

namespace kdnn::impl {

/// SplitMix64's finaliser: every input bit moves about half the output bits.
KOKKOS_INLINE_FUNCTION std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// The bits of v as a double (float converts exactly).
template <class T>
KOKKOS_INLINE_FUNCTION std::uint64_t value_bits(T v) {
  const double d = double(v);
  std::uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  return bits;
}

/// Σ_i mix64(bits(v_i) + mix64(i)) over the elements of a contiguous
/// (LayoutRight) View in row-major order, its extents mixed in: a sum of
/// integers modulo 2^64, so the parallel order does not change it. An
/// empty View (not given) gives a value of its extents only. Takes the lock
/// of `space`'s type while it runs (fenced).
template <class ExecSpace, class View>
std::uint64_t fingerprint(const ExecSpace& space, const View& v) {
  static_assert(std::is_same_v<typename View::array_layout, Kokkos::LayoutRight>,
                "fingerprint: a contiguous (LayoutRight) View");
  std::uint64_t shape = 0;
  for (int r = 0; r < int(View::rank); ++r) shape = mix64(shape + v.extent(r) + 1);
  const std::size_t n = v.span();
  if (n == 0) return shape;
  const auto* data = v.data();
  std::uint64_t sum = 0;
  SpaceLock hold(space);
  Kokkos::parallel_reduce(
      "kdnn::fingerprint", Kokkos::RangePolicy<ExecSpace>(space, 0, n),
      KOKKOS_LAMBDA(std::size_t i, std::uint64_t & s) {
        s += mix64(value_bits(data[i]) + mix64(i));
      },
      sum);
  space.fence();
  return mix64(sum ^ shape);
}

}  // namespace kdnn::impl
