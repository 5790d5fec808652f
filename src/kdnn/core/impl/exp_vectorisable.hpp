// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// e^x for float in a form a host compiler vectorises (no library call):
// x = n·ln 2 + r with |r| ≤ ln2/2 (ln 2 split in a high part exact in float
// and a low part, Cody & Waite), e^r by Cephes' degree-6 polynomial for
// expf (relative error about 1 ulp on [−ln2/2, ln2/2]), and 2^n put into the
// exponent bits. Results below FLT_MIN flush to 0 (a probability under 1e-38
// next to at least one of about 1); x > 88 gives +inf (e^88 ≈ 1.7e38, so that
// 2^n stays a normal float); −inf gives 0.
// double, and every GPU, keep the library's exp.
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
#endif
  return compat::exp(x);
}

}  // namespace kdnn::impl
