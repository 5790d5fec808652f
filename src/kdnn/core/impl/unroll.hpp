// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// KDNN_IMPL_UNROLL before a loop: unroll it fully in device code when its
// trip count is a compile-time constant (a loop over a register array must
// be, or the array moves to local memory); no effect on other loops or on
// host code.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define KDNN_IMPL_UNROLL _Pragma("unroll")
#else
#define KDNN_IMPL_UNROLL
#endif
