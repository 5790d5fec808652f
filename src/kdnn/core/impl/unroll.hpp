// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// KDNN_IMPL_UNROLL before a loop: unroll it fully in device code when its
// trip count is a compile-time constant (a loop over a register array must
// be, or the array moves to local memory); no effect on other loops or on
// host code.
//
// KDNN_IMPL_NO_UNROLL before a loop: do not unroll it in device code (a
// loop over a run-time count whose body is long and holds many registers:
// unrolled copies of the body would overlap and hold more).
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define KDNN_IMPL_UNROLL _Pragma("unroll")
#define KDNN_IMPL_NO_UNROLL _Pragma("unroll 1")
#else
#define KDNN_IMPL_UNROLL
#define KDNN_IMPL_NO_UNROLL
#endif
