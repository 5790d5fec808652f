// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Where the SSD backward kernels write their gradients (notation:
// ssd_chunks.hpp).
#include "kdnn/ssm/impl/ssd_chunks.hpp"

namespace kdnn::ssm::impl {

/// Where the backward kernels put the gradients: dx, per-head dB and dC
/// ([B, L, H, N]: dB and dC themselves when G = H) and da_diag [B, H, L], the
/// Y_diag part of the gradient of each step's log-decay a_t = dt_t·A; and
/// what the tensor-core form's first half hands its second: each chunk's
/// C·Bᵀ and dY·X̃ᵀ (empty where not computed yet).
template <class ExecSpace, class T>
struct SsdGradients {
  Tensor4<T, ExecSpace> dx;   ///< [B, L, H, P]
  Tensor4<T, ExecSpace> dBh;  ///< [B, L, H, N]
  Tensor4<T, ExecSpace> dCh;  ///< [B, L, H, N]
  Kokkos::View<double***, Kokkos::LayoutRight, typename ExecSpace::memory_space> da_diag;
  ChunkScores<T, ExecSpace> cb;     ///< C·Bᵀ per chunk and group
  ChunkScores<T, ExecSpace> dy_xt;  ///< dY·X̃ᵀ per chunk and head
};

/// Which gradient a GPU form's gradient kernel computes
/// (ssd_gradient_gpu_kernel.hpp, ssd_gradient_mma_kernel.hpp).
enum class SsdGradient { dx, dB, dC };

/// What the GPU forms' gradient kernels (ssd_gradient_gpu_kernel.hpp) hand
/// the finishing kernel per step, [B, H, L] each: the state terms of da
/// (row_a: dend·X̃·(B·dHᵀ); dcum: e·C·(dY·H)), Σ_p x·dX̃ (sx) and Σ_p dy·x (sd).
template <class ExecSpace>
struct SsdStepSums {
  using Steps = Kokkos::View<double***, Kokkos::LayoutRight, typename ExecSpace::memory_space>;
  Steps row_a, dcum, sx, sd;
};

/// The Y_diag half of the backward as SsdDiagBackwardKernel stored it in g,
/// for the chunk of batch entry b, head h starting at step t0; i is a step
/// of the chunk.
template <class ExecSpace, class T>
struct DiagInGradients {
  SsdGradients<ExecSpace, T> g;
  int b, h, t0;
  KOKKOS_INLINE_FUNCTION T dx(int i, int p) const { return g.dx(b, t0 + i, h, p); }
  KOKKOS_INLINE_FUNCTION T db(int i, int n) const { return g.dBh(b, t0 + i, h, n); }
  KOKKOS_INLINE_FUNCTION T dc(int i, int n) const { return g.dCh(b, t0 + i, h, n); }
  KOKKOS_INLINE_FUNCTION double da(int i) const { return g.da_diag(b, h, t0 + i); }
};

/// The Y_diag half as the fused backward keeps it in scratch: dX̃ [Qp×Pp],
/// dBᵀ [Np×Qp], dC [Qp×Np], da_diag [Qp].
template <class T>
struct DiagInScratch {
  const T *dx_rows, *db_columns, *dc_rows;
  const double* da_steps;
  int Qp, Pp, Np;
  KOKKOS_INLINE_FUNCTION T dx(int i, int p) const { return dx_rows[i * Pp + p]; }
  KOKKOS_INLINE_FUNCTION T db(int i, int n) const { return db_columns[n * Qp + i]; }
  KOKKOS_INLINE_FUNCTION T dc(int i, int n) const { return dc_rows[i * Np + n]; }
  KOKKOS_INLINE_FUNCTION double da(int i) const { return da_steps[i]; }
};

}  // namespace kdnn::ssm::impl
