// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Tensor types and options shared by the kdnn::attention operators. All
// tensors are LayoutRight Views in the execution space's memory space:
// activations batch-first [B, S, E], weights as in PyTorch's nn.Linear
// ([out, in]), per-head tensors [B, H, rows, cols].
#include <Kokkos_Core.hpp>

#include "kdnn/core/tensor.hpp"

namespace kdnn::attention {

using kdnn::Matrix;
using kdnn::StridedTensor4;
using kdnn::Tensor3;
using kdnn::Tensor4;
using kdnn::Vector;

/// op(M) in a product: M itself or its transpose.
enum class Op { none, transpose };

/// How a backward writes weight gradients (cuDNN's CUDNN_WGRAD_MODE_SET and
/// CUDNN_WGRAD_MODE_ADD): overwrite them, or add to what they hold.
enum class WgradMode { set, add };

}  // namespace kdnn::attention
