// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The TF32 forms of a float (sign, 8 exponent bits, 10 mantissa bits): what
// a tensor core reads of a float operand, the rounding a single-pass TF32
// product applies first, and the big + small split of the 3×TF32 product
// that keeps float32 accuracy (CUTLASS's OpMultiplyAddFastF32):
//   a·b ≈ big(a)·big(b) + big(a)·small(b) + small(a)·big(b),
// with big(x) = x rounded to TF32 and small(x) = x − big(x) rounded to TF32;
// the dropped small(a)·small(b) and the rounding of the small parts leave at
// most about 3·2⁻²² of |a·b|, against 2⁻¹⁰ for a single TF32 pass.
// The same results on a host and on a GPU (there cvt.rna.tf32.f32).
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "kdnn/core/impl/float_bits.hpp"

namespace kdnn::impl {

/// x rounded to TF32 to nearest, ties away from zero (PTX's
/// cvt.rna.tf32.f32); infinities and NaN stay.
KOKKOS_FORCEINLINE_FUNCTION float tf32_rounded(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  std::uint32_t bits;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(x));
  return float_of_bits(bits);
#else
  std::uint32_t bits = float_bits(x);
  if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & 0xffffe000u;
  return float_of_bits(bits);
#endif
}

/// x as the tensor core reads a float operand it is given unconverted: its
/// low 13 mantissa bits ignored.
KOKKOS_FORCEINLINE_FUNCTION float tf32_truncated(float x) {
  return float_of_bits(float_bits(x) & 0xffffe000u);
}

/// The 3×TF32 parts of x, each a TF32 value: big = x rounded, small = the
/// remainder x − big (exact in float) rounded, so |x − big − small| is at
/// most 2⁻²²·|x|.
struct Tf32Split {
  float big;
  float small;
};
KOKKOS_FORCEINLINE_FUNCTION Tf32Split tf32_split(float x) {
  const float big = tf32_rounded(x);
  return {big, tf32_rounded(x - big)};
}

}  // namespace kdnn::impl
