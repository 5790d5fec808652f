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

/// float → float16 bits, to nearest even, subnormals kept. On a host every
/// case is computed and one selected, with no branch and no variable shift,
/// so that a compiler vectorises a loop of conversions.
KOKKOS_FORCEINLINE_FUNCTION std::uint16_t float16_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(x));
#else
  const std::uint32_t u = float_bits(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  // A normal float16 (from 2^-14 = 0x38800000): rebias the exponent by
  // −112 (0x38000000) and drop 13 mantissa bits, adding 0xfff plus the
  // kept part's lowest bit (ties to even). A carry out of the mantissa
  // raises the exponent: from 65520 (halfway between 65504 and 2^16) on,
  // that is the infinity 0x7c00, which the clamp below keeps.
  std::uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  normal = normal > 0x7c00u ? 0x7c00u : normal;
  // Below 2^-14: a multiple of 2^-24. Adding 0.5 (0x3f000000) puts 2^-24 at
  // the float's last mantissa bit, so the float addition itself rounds to
  // nearest even; what is left above 0.5 is the float16's bits (at most the
  // smallest normal, 0x0400, after rounding up).
  const std::uint32_t subnormal = float_bits(float_of_bits(a) + 0.5f) - 0x3f000000u;
  std::uint32_t bits = a >= 0x38800000u ? normal : subnormal;
  bits = a >= 0x47800000u ? 0x7c00u : bits;  // from 2^16: an infinity (no wrap)
  return a > 0x7f800000u ? kCanonicalNan16 : std::uint16_t(sign | bits);
#endif
}

/// float16 bits → float (exact), on a host without a branch as float16_bits.
KOKKOS_FORCEINLINE_FUNCTION float float16_value(std::uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t shifted = std::uint32_t(h & 0x7fffu) << 13;  // exponent, mantissa
  const std::uint32_t e = shifted & 0x0f800000u;
  // A normal number: rebias the exponent by +112. An infinity or a NaN
  // (exponent 31): to 255, the mantissa (payload) kept.
  const std::uint32_t normal = shifted + 0x38000000u;
  const std::uint32_t special = shifted + 0x70000000u;
  // Zero or a subnormal m·2^-24: as the float 2^-14·(1 + m/1024) minus
  // 2^-14, exact.
  const std::uint32_t subnormal =
      float_bits(float_of_bits(shifted + 0x38800000u) - float_of_bits(0x38800000u));
  const std::uint32_t bits = e == 0x0f800000u ? special : e == 0 ? subnormal : normal;
  return float_of_bits(sign | bits);
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
