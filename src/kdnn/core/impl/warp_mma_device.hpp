// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// One lane's part of a warp's tensor-core product on CUDA (sm_80 and later):
// PTX mma.sync with the fragments of warp_mma_fragments.hpp, the lane's
// registers in and its accumulators updated in place. Every lane of the warp
// must call it together (mma.sync is warp-collective). Elsewhere (a host
// pass, an older GPU) it is never run: the host plays a warp through
// warp_mma_emulated.hpp, and the tensor-core forms are chosen only on a
// device that has mma.sync (tensor_cores.hpp).
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "kdnn/core/impl/tf32.hpp"
#include "kdnn/core/impl/warp_mma_fragments.hpp"

namespace kdnn::impl {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define KDNN_IMPL_MMA_SYNC 1
#endif

/// c += a·b, m16n8k8, operands already TF32 (their low 13 bits are ignored).
KOKKOS_FORCEINLINE_FUNCTION void device_mma(MmaTf32M16N8K8, const float (&a)[4],
                                            const float (&b)[2], float (&c)[4]) {
#if defined(KDNN_IMPL_MMA_SYNC)
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(float_bits(a[0])), "r"(float_bits(a[1])), "r"(float_bits(a[2])), "r"(float_bits(a[3])),
        "r"(float_bits(b[0])), "r"(float_bits(b[1])));
#else
  (void)a, (void)b, (void)c;
  Kokkos::abort("kdnn: mma.sync m16n8k8 needs a CUDA device of compute capability 8.0 or later");
#endif
}

/// c += a·b, m8n8k4 in float64.
KOKKOS_FORCEINLINE_FUNCTION void device_mma(MmaF64M8N8K4, const double (&a)[1],
                                            const double (&b)[1], double (&c)[2]) {
#if defined(KDNN_IMPL_MMA_SYNC)
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
               : "+d"(c[0]), "+d"(c[1])
               : "d"(a[0]), "d"(b[0]));
#else
  (void)a, (void)b, (void)c;
  Kokkos::abort("kdnn: mma.sync m8n8k4 f64 needs a CUDA device of compute capability 8.0 or later");
#endif
}

#undef KDNN_IMPL_MMA_SYNC

}  // namespace kdnn::impl
