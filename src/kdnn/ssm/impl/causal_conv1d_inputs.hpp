// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What both forms of the causal conv1d take (the tiled kernels,
// causal_conv1d_kernels.hpp, and the register kernels,
// causal_conv1d_register_kernels.hpp).
#include <Kokkos_Core.hpp>

#include "kdnn/core/tensor.hpp"
#include "kdnn/ssm/impl/sigmoid.hpp"

namespace kdnn::ssm::impl {

/// The arguments of every conv kernel (the tiled ones, the host form, and
/// the register ones, the GPU form).
template <class ExecSpace, class T>
struct ConvInputs {
  Tensor3<const T, ExecSpace> x;     ///< [B, L, C]
  Matrix<const T, ExecSpace> w;      ///< [C, K]
  Vector<const T, ExecSpace> bias;   ///< [C] or empty
  Tensor3<const T, ExecSpace> init;  ///< [B, K−1, C] or empty (zeros)
  bool has_bias = false, has_init = false, silu = true;
  int first = 0, last = 0;  ///< the launch's steps [first, last)
};

}  // namespace kdnn::ssm::impl
