// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::attention — multi-head attention training operators (the eigenMHA /
// cuDNN scope), forward and backward: the MSE loss, the Linear layer, the
// strided batched GEMM, the masked softmax, dropout, fused ("flash")
// attention (also over packed variable-length sequences) and the
// multi-head attention layer built from them.
#include "kdnn/attention/batched_gemm.hpp"
#include "kdnn/attention/dropout.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/fused_attention_varlen.hpp"
#include "kdnn/attention/linear.hpp"
#include "kdnn/attention/mha.hpp"
#include "kdnn/attention/mha_descriptor.hpp"
#include "kdnn/attention/mse_loss.hpp"
#include "kdnn/attention/softmax.hpp"
