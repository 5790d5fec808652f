// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What both forms of the SSD forward's output kernel write
// (ssd_chunk_output_kernel.hpp and ssd_chunk_output_gpu_kernel.hpp).
#include "kdnn/ssm/impl/ssd_chunks.hpp"
#include "kdnn/ssm/impl/ssd_skip.hpp"

namespace kdnn::ssm::impl {

/// What the output kernel's forms (SsdChunkOutputKernel and its GPU form) write
/// at the chunk's steps: with `diag`, y = Y_diag + D·x (overwritten); with
/// `off`, Y_off = e_i·C_i·H_cᵀ from states(b, h, c) (the state entering the
/// chunk) is added — to Y_diag, or to y as it is when `diag` is off.
template <class ExecSpace, class T>
struct SsdOutputData {
  SsdSkip<ExecSpace, T> skip;              ///< D
  ChunkStates<const T, ExecSpace> states;  ///< [B, H, ≥chunks, N·P] (off)
  Tensor4<T, ExecSpace> y;                 ///< [B, L, H, P]
  bool diag = true, off = true;
};

}  // namespace kdnn::ssm::impl
