// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The host's twin of a warp's tensor-core product (warp_mma_fragments.hpp):
// one thread plays the 32 lanes, each lane's registers as the device holds
// them, so fragment code is tested on every backend. And the TF32 forms of
// a float: what a single-pass product reads, and the big + small split of
// the 3×TF32 product that keeps float32 accuracy (CUTLASS's
// OpMultiplyAddFastF32):
//   a·b ≈ big(a)·big(b) + big(a)·small(b) + small(a)·big(b),
// with big(x) = x rounded to TF32 and small(x) = x − big(x) rounded to TF32;
// the dropped small(a)·small(b) and the rounding of the small parts leave at
// most about 3·2⁻²² of |a·b|, against 2⁻¹⁰ for a single TF32 pass.
#include <cstdint>
#include <cstring>

#include "kdnn/core/impl/warp_mma_fragments.hpp"

namespace kdnn::impl {

/// x rounded to TF32 (sign, 8 exponent bits, 10 mantissa bits) to nearest,
/// ties away from zero: PTX's cvt.rna.tf32.f32. Infinities and NaN stay.
inline float tf32_rounded(float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & 0xffffe000u;
  float y = 0;
  std::memcpy(&y, &bits, sizeof y);
  return y;
}

/// x as the tensor core reads a float operand it is given unconverted: its
/// low 13 mantissa bits ignored.
inline float tf32_truncated(float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  bits &= 0xffffe000u;
  float y = 0;
  std::memcpy(&y, &bits, sizeof y);
  return y;
}

/// The 3×TF32 parts of x, each a TF32 value: big = x rounded, small = the
/// remainder x − big (exact in float) rounded, so |x − big − small| is at
/// most 2⁻²²·|x|.
struct Tf32Split {
  float big;
  float small;
};
inline Tf32Split tf32_split(float x) {
  const float big = tf32_rounded(x);
  return {big, tf32_rounded(x - big)};
}

/// A warp's registers of one operand: lane by lane, register by register.
template <class T, int Regs>
using WarpFragment = T[32][Regs];

/// How an operand of Shape's type enters the product: TF32 reads a float
/// through its top bits; float64 as it is.
template <class Shape>
typename Shape::value_type mma_operand(typename Shape::value_type x) {
  if constexpr (sizeof(typename Shape::value_type) == 4) {
    return tf32_truncated(x);
  } else {
    return x;
  }
}

/// d = a·b + c for one warp's fragments, as mma.sync of Shape computes it,
/// on the host: the operands read as the tensor core reads them, each
/// element of d summed in double in k order and rounded once. Exact, and so
/// equal to the device's, when every product and partial sum is exact in
/// the value type (integer-valued data); otherwise the device's sum may
/// differ in its last bits.
template <class Shape>
void emulated_mma(const WarpFragment<typename Shape::value_type, Shape::a_regs>& a,
                  const WarpFragment<typename Shape::value_type, Shape::b_regs>& b,
                  const WarpFragment<typename Shape::value_type, Shape::c_regs>& c,
                  WarpFragment<typename Shape::value_type, Shape::c_regs>& d) {
  using T = typename Shape::value_type;
  T A[Shape::M][Shape::K] = {}, B[Shape::K][Shape::N] = {};
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < Shape::a_regs; ++r) {
      const FragmentIndex i = Shape::a(lane, r);
      A[i.row][i.col] = mma_operand<Shape>(a[lane][r]);
    }
    for (int r = 0; r < Shape::b_regs; ++r) {
      const FragmentIndex i = Shape::b(lane, r);
      B[i.row][i.col] = mma_operand<Shape>(b[lane][r]);
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < Shape::c_regs; ++r) {
      const FragmentIndex i = Shape::c(lane, r);
      double sum = c[lane][r];
      for (int k = 0; k < Shape::K; ++k) sum += double(A[i.row][k]) * double(B[k][i.col]);
      d[lane][r] = T(sum);
    }
  }
}

}  // namespace kdnn::impl
