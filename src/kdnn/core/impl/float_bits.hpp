// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// A float's bits and back (memcpy: no aliasing), on a host and on a device.
#include <Kokkos_Core.hpp>
#include <cstdint>

namespace kdnn::impl {

KOKKOS_FORCEINLINE_FUNCTION std::uint32_t float_bits(float x) {
  std::uint32_t bits = 0;
  __builtin_memcpy(&bits, &x, sizeof bits);
  return bits;
}

KOKKOS_FORCEINLINE_FUNCTION float float_of_bits(std::uint32_t bits) {
  float x = 0;
  __builtin_memcpy(&x, &bits, sizeof x);
  return x;
}

}  // namespace kdnn::impl
