#pragma once
// Where the SSD backward kernels write their gradients (notation:
// ssd_chunks.hpp).
#include "kdnn/ssm/impl/ssd_chunks.hpp"

namespace kdnn::ssm::impl {

/// Where the backward kernels put the gradients: dx, per-head dB and dC
/// ([B, L, H, N]: dB and dC themselves when G = H) and da_diag [B, H, L], the
/// Y_diag part of the gradient of each step's log-decay a_t = dt_t·A.
template <class ExecSpace, class T>
struct SsdGradients {
  Tensor4<T, ExecSpace> dx;   ///< [B, L, H, P]
  Tensor4<T, ExecSpace> dBh;  ///< [B, L, H, N]
  Tensor4<T, ExecSpace> dCh;  ///< [B, L, H, N]
  Kokkos::View<double***, Kokkos::LayoutRight, typename ExecSpace::memory_space> da_diag;
};

}  // namespace kdnn::ssm::impl
