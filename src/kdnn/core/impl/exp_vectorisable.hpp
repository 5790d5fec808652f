// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// e^x for float and double in a form a host compiler vectorises (no library
// call, no branch): x = n·ln 2 + r with |r| ≤ ln2/2 (ln 2 split in a high
// part whose product with n is exact and a low part, Cody & Waite), e^r by a
// polynomial, and 2^n put into the exponent bits; n = round(x/ln 2) by
// adding and subtracting 1.5·2^23 (2^52), exact below 2^22 (2^51).
//  * float: Cephes' degree-6 polynomial for expf (about 1 ulp on
//    [−ln2/2, ln2/2]). Results below FLT_MIN flush to 0 (a probability
//    under 1e-38 next to at least one of about 1); x > 88 gives +inf
//    (e^88 ≈ 1.7e38, so that 2^n stays a normal float); −inf gives 0.
//  * double: e^r by its Taylor series to degree 13 (truncation below
//    4e-18 relative on |r| ≤ ln2/2), 2^n as 2^h·2^(n−h) with h = round(n/2)
//    so that both factors are normal: the whole range, subnormal results
//    included (x < −745.2 gives 0, x > 709.8 +inf, −inf 0). n's bits come
//    from the shifted sum's own bits, not from a conversion, which AVX2
//    has no vector instruction for.
// NaN gives NaN. Every GPU keeps the library's exp.
#include <cstdint>
#include <type_traits>

#include "kdnn/core/compat.hpp"

namespace kdnn::impl {

template <class T>
KOKKOS_FORCEINLINE_FUNCTION T exp_vectorisable(T x) {
#if !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
  if constexpr (std::is_same_v<T, float>) {
    const float lo = -87.33654f, hi = 88.0f;  // ln(FLT_MIN); n ≤ 127 below hi
    float xc = x < lo ? lo : x;
    xc = xc > hi ? hi : xc;
    // n = round(x / ln 2), by adding and subtracting 1.5·2^23 (exact for
    // |t| < 2^22): a select on the sign here would make GCC give up
    // vectorising the loop once AVX is enabled.
    const float t = xc * 1.44269504088896341f;
    const float n = (t + 12582912.0f) - 12582912.0f;
    const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float er = p * r * r + r + 1.0f;
    const std::int32_t bits = (std::int32_t(n) + 127) << 23;
    float scale;
    __builtin_memcpy(&scale, &bits, sizeof scale);
    const float y = x < lo ? 0.0f : er * scale;
    return x > hi ? __builtin_inff() : y;
  }
  if constexpr (std::is_same_v<T, double>) {
    const double lo = -745.2, hi = 709.8;  // below: under 2^-1074; above: over DBL_MAX
    double xc = x < lo ? lo : x;
    xc = xc > hi ? hi : xc;
    const double shifter = 6755399441055744.0;  // 1.5·2^52
    const double n = (xc * 1.4426950408889634 + shifter) - shifter;
    // fdlibm's split of ln 2: the high part has 21 trailing zero bits.
    const double r = (xc - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
    double p = 1.0 / 6227020800.0;  // 1/13!
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    const double er = p * r * r + r + 1.0;
    // 2^v for an integral v in [−1022, 1023]: v's bits below the shifter's.
    const auto power = [shifter](double v) {
      const double shifted = v + shifter;
      std::int64_t bits, base;
      __builtin_memcpy(&bits, &shifted, sizeof bits);
      __builtin_memcpy(&base, &shifter, sizeof base);
      bits = (bits - base + 1023) << 52;
      double y;
      __builtin_memcpy(&y, &bits, sizeof y);
      return y;
    };
    const double h = (n * 0.5 + shifter) - shifter;
    const double y = (er * power(h)) * power(n - h);
    return x < lo ? 0.0 : (x > hi ? __builtin_inf() : y);
  }
#endif
  return compat::exp(x);
}

}  // namespace kdnn::impl
