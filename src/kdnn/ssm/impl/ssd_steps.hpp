// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The steps of the chunked SSD: the interface through which the single-rank
// operators (ssd_impl.hpp) and the context-parallel SSD (kdnn::cp,
// cp/impl/ssd_impl.hpp) compose it. Nothing else of ssm::impl is meant to be
// reached from outside ssm/.
//
//   forward:   chunk_states → state_pass (→ sequence_states) → chunk_output
//   backward:  chunk_states → state_pass → chunk_dstates → reverse_state_pass
//              → fused_backward (one rank), or gradient_buffers →
//              diag_backward (no state needed: may overlap communication) →
//              state_backward (after the states and their gradients are
//              complete)
//
// Where the sizes have GPU forms (ssd_gpu_chunks.hpp) and the launch asks
// for them, the backward's are split otherwise than the host forms:
// diag_backward computes da_diag alone (ssd_da_diag_gpu_kernel.hpp; on
// tensor cores from each chunk's C·Bᵀ and dY·X̃ᵀ, which it computes first
// and hands on in SsdGradients), and state_backward the gradients dX̃, dB
// and dC whole, each a kernel (ssd_gradient_gpu_kernel.hpp; on tensor cores
// ssd_gradient_mma_kernel.hpp), then da, ddt and the parameter sums
// (ssd_backward_finish_gpu_kernel.hpp); fused_backward runs the two.
//
// Chunk states travel between the steps in ChunkStates [B, H, chunks (+1),
// N·P] (element n·P + p of a chunk state is s[p, n]) and the chunks' total
// decays in ChunkDecays [B, H, chunks]. A context-parallel caller corrects
// both between the passes with the other ranks' summaries. Every step runs
// on `space` and checks nothing: the callers check their arguments first
// (ssd_checks.hpp).
#include "kdnn/core/impl/eti.hpp"
#include "kdnn/ssm/impl/ssd_backward_steps.hpp"
#include "kdnn/ssm/impl/ssd_forward_steps.hpp"

namespace kdnn::ssm::impl {

// The steps are compiled into libkdnn with the operators (ssd_eti.cpp)
// for the pairs of core/impl/eti.hpp: the context-parallel SSD, the CLI and
// the tests that run single steps call them without compiling their kernels
// again (each such file took as long as the operators' own under nvcc).
// Each visits the table (ssd_forms.hpp), so each instantiates every form
// at every listed size: no list of sizes is kept here.
#define KDNN_SSD_STEPS(PREFIX, ExecSpace, T)                                                      \
  PREFIX void chunk_states<ExecSpace, T, SsdForward<T, ExecSpace>>(                               \
      const char*, const ExecSpace&, const SsdForward<T, ExecSpace>&, const SsdOptions&,          \
      ChunkStates<T, ExecSpace>&, ChunkDecays<T, ExecSpace>&);                                    \
  PREFIX void chunk_states<ExecSpace, T, SsdBackward<T, ExecSpace>>(                              \
      const char*, const ExecSpace&, const SsdBackward<T, ExecSpace>&, const SsdOptions&,         \
      ChunkStates<T, ExecSpace>&, ChunkDecays<T, ExecSpace>&);                                    \
  PREFIX void state_pass<ExecSpace, T>(                                                           \
      const ExecSpace&, const ChunkStates<T, ExecSpace>&, const ChunkDecays<T, ExecSpace>&,       \
      const Tensor4<const T, ExecSpace>&, const Tensor4<T, ExecSpace>&);                          \
  PREFIX void sequence_states<ExecSpace, T>(const ExecSpace&, const SsdForward<T, ExecSpace>&,    \
                                            const SsdOptions&, const ChunkStates<T, ExecSpace>&); \
  PREFIX void reverse_state_pass<ExecSpace, T>(                                                   \
      const ExecSpace&, const ChunkStates<T, ExecSpace>&, const ChunkDecays<T, ExecSpace>&,       \
      const Tensor4<const T, ExecSpace>&, const Tensor4<T, ExecSpace>&, int);                     \
  PREFIX void chunk_output<ExecSpace, T>(const char*, const ExecSpace&,                           \
                                         const SsdForward<T, ExecSpace>&, const SsdOptions&,      \
                                         const ChunkStates<T, ExecSpace>&, bool, bool);           \
  PREFIX void diag_backward<ExecSpace, T>(const char*, const ExecSpace&,                          \
                                          const SsdBackward<T, ExecSpace>&, const SsdOptions&,    \
                                          SsdGradients<ExecSpace, T>&);                           \
  PREFIX void state_backward<ExecSpace, T>(                                                       \
      const char*, const ExecSpace&, const SsdBackward<T, ExecSpace>&, const SsdOptions&,         \
      const ChunkStates<T, ExecSpace>&, const ChunkStates<T, ExecSpace>&,                         \
      const SsdGradients<ExecSpace, T>&);                                                         \
  PREFIX void fused_backward<ExecSpace, T>(                                                       \
      const char*, const ExecSpace&, const SsdBackward<T, ExecSpace>&, const SsdOptions&,         \
      const ChunkStates<T, ExecSpace>&, const ChunkStates<T, ExecSpace>&,                         \
      const SsdGradients<ExecSpace, T>&);                                                         \
  PREFIX void chunk_dstates<ExecSpace, T>(const char*, const ExecSpace&,                          \
                                          const SsdBackward<T, ExecSpace>&, const SsdOptions&,    \
                                          ChunkStates<T, ExecSpace>&);                            \
  PREFIX ChunkScores<T, ExecSpace> chunk_group_scores<ExecSpace, T, SsdForward<T, ExecSpace>>(    \
      const char*, const ExecSpace&, const SsdForward<T, ExecSpace>&, const SsdOptions&);         \
  PREFIX bool mma_gradients<ExecSpace, T>(                                                        \
      const char*, const ExecSpace&, const SsdBackward<T, ExecSpace>&, const SsdOptions&,         \
      const ChunkStates<T, ExecSpace>&, const ChunkStates<T, ExecSpace>&,                         \
      const SsdGradients<ExecSpace, T>&, const SsdStepSums<ExecSpace>&);

#define KDNN_SSD_STEPS_EXTERN(ExecSpace, T) KDNN_SSD_STEPS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_SSD_STEPS_EXTERN)
#undef KDNN_SSD_STEPS_EXTERN

}  // namespace kdnn::ssm::impl
