// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn's 16-bit storage types, bfloat16 (sign, 8 exponent bits, 7 mantissa
// bits: float's range) and float16 (IEEE binary16: 5 exponent bits, 10
// mantissa bits, largest finite 65504), and their conversions to and from
// float, the type they are computed in. Two bytes each, the same bits on a
// host and on a device, usable as a Kokkos View's value type on every
// backend. They are storage only: no arithmetic; a kernel widens what it
// reads (to_compute) and narrows what it writes (from_compute).
//
// float → 16 bits rounds to nearest, ties to even; a value past the largest
// finite one (after rounding) becomes an infinity of its sign; subnormals
// are IEEE's (kept, not flushed); a NaN becomes the canonical quiet NaN
// 0x7fff (CUDA's). 16 bits → float is exact. On a CUDA device the
// conversions are the hardware's (cvt.rn.f16.f32 and cvt.rn.bf16.f32),
// which give the same bits.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "kdnn/core/impl/float_bits.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace kdnn {

/// bfloat16 storage: the upper half of a float's bits.
struct bfloat16 {
  std::uint16_t bits;
};

/// IEEE binary16 storage.
struct float16 {
  std::uint16_t bits;
};

static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);
static_assert(sizeof(float16) == 2 && std::is_trivially_copyable_v<float16>);

namespace impl {

constexpr std::uint16_t kCanonicalNan16 = 0x7fff;

/// float → bfloat16 bits, to nearest even.
KOKKOS_FORCEINLINE_FUNCTION std::uint16_t bfloat16_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
#else
  const std::uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return kCanonicalNan16;
  // Adding 0x7fff plus the kept part's lowest bit carries into it exactly
  // when the dropped half is above a tie, or a tie with an odd kept part.
  return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}

/// float → float16 bits, to nearest even, subnormals kept.
KOKKOS_FORCEINLINE_FUNCTION std::uint16_t float16_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(x));
#else
  const std::uint32_t u = float_bits(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kCanonicalNan16;
  // From 65520 (halfway between 65504 and 2^16) up: an infinity.
  if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);
  if (a >= 0x38800000u) {  // a normal float16 (from 2^-14): rebias, drop 13 bits
    const std::uint32_t r = a - 0x38000000u;
    return std::uint16_t(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  // Below 2^-14: a multiple of 2^-24 (a subnormal, or at most the smallest
  // normal 0x0400 after rounding up). Up to 2^-25 (a tie with 0): zero.
  if (a <= 0x33000000u) return std::uint16_t(sign);
  const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;  // the value is m·2^(e − 150)
  const int shift = 126 - int(a >> 23);                 // m·2^(e − 150) / 2^-24 = m / 2^shift
  std::uint32_t r = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (r & 1u))) ++r;
  return std::uint16_t(sign | r);
#endif
}

/// float16 bits → float (exact).
KOKKOS_FORCEINLINE_FUNCTION float float16_value(std::uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return float_of_bits(sign | 0x7f800000u | (m << 13));  // inf, NaN
  if (e != 0) return float_of_bits(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return float_of_bits(sign);
  // A subnormal m·2^-24: normalise m to 1.f·2^(e2 − 127).
  std::uint32_t e2 = 113;
  while ((m & 0x400u) == 0) m <<= 1, --e2;
  return float_of_bits(sign | (e2 << 23) | ((m & 0x3ffu) << 13));
#endif
}

}  // namespace impl

/// The type a storage type is computed in: float for the 16-bit types, the
/// type itself otherwise.
template <class T>
struct ComputeType {
  using type = T;
};
template <>
struct ComputeType<bfloat16> {
  using type = float;
};
template <>
struct ComputeType<float16> {
  using type = float;
};
template <class T>
using compute_t = typename ComputeType<T>::type;

/// Whether T is one of the 16-bit storage types.
template <class T>
inline constexpr bool is_float16_storage_v =
    std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

/// A stored value as its compute type.
template <class T>
KOKKOS_FORCEINLINE_FUNCTION compute_t<T> to_compute(T x) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return impl::float_of_bits(std::uint32_t(x.bits) << 16);
  } else if constexpr (std::is_same_v<T, float16>) {
    return impl::float16_value(x.bits);
  } else {
    return x;
  }
}

/// A compute-type value stored as T (rounded to nearest even for the 16-bit
/// types).
template <class T>
KOKKOS_FORCEINLINE_FUNCTION T from_compute(compute_t<T> x) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return bfloat16{impl::bfloat16_bits(x)};
  } else if constexpr (std::is_same_v<T, float16>) {
    return float16{impl::float16_bits(x)};
  } else {
    return x;
  }
}

/// target = target + value, added in the compute type and rounded once.
template <class T>
KOKKOS_FORCEINLINE_FUNCTION void add_to(T& target, compute_t<T> value) {
  target = from_compute<T>(to_compute(target) + value);
}

}  // namespace kdnn
