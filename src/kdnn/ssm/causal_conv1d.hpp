// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::ssm causal depthwise conv1d (Mamba-2's short convolution over x, B
// and C) with an optional SiLU, channel-last as Mamba's reference:
//
//   z[b,t,c] = bias[c] + Σ_{k<K} w[c,k] · x̄[b, t−K+1+k, c],   y = SiLU(z) or z
//
// a cross-correlation (w[c, K−1] multiplies the current step, as
// F.conv1d with K−1 zeros of left padding and groups = C, and causal-conv1d).
// x̄ is x preceded by the K−1 steps of the initial state (zeros when none is
// given): x̄[b, s, c] = initial_state[b, s+K−1, c] for −K+1 ≤ s < 0. The final
// state is the last K−1 steps of x̄ (for chunked or streaming use; it reaches
// into the initial state when L < K−1). Any K ≥ 1, any L ≥ 0.
//
// Packed sequences (causal-conv1d's seq_idx): with seq_idx [B, L] given, a
// term of step t reads x̄[s] only when s is in t's sequence, seq_idx[b, s] ==
// seq_idx[b, t] (else 0), so that each sequence is convolved as if alone:
// the window never reaches across a boundary, forward or backward. The ids
// are compared, never ordered (any int32). The initial state continues
// step 0's sequence (pass none, or zeros, when step 0 starts a new one),
// and the final state keeps only the steps of the last step's sequence
// (zeros in place of the others): the state a decoding step of that
// sequence continues from.
//
// Every [B, ·, C] tensor may have any strides (kdnn::StridedTensor3; a
// Tensor3 converts to it): channel-last [B, L, C] (Mamba's reference) and
// channel-first (causal-conv1d's contiguous [B, C, L], seen as [B, L, C]
// through its strides) are both read and written in place, each with its
// own thread mapping in the GPU form. Outputs' elements must not overlap.
//
// Storage: the activations (x, the states, y and their gradients) are of
// the storage type T (float, double, kdnn::bfloat16 or kdnn::float16); the
// parameters w and bias and their gradients are of compute_t<T> (float for
// the 16-bit types: a bfloat16 weight converts exactly, and a float one, as
// mixed-precision training keeps it, loses nothing), and every sum is
// computed in compute_t<T>, each output rounded to T once.
//
// The backward recomputes z from x (nothing but the inputs is kept) and
// returns dx, dw, dbias and d(initial state), accepting d(final state).
// Deterministic: dw and dbias are summed per block of steps, then over the
// blocks in a fixed order (no atomics).
#include <Kokkos_Core.hpp>

#include "kdnn/core/float16.hpp"
#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/launch.hpp"
#include "kdnn/core/tensor.hpp"

namespace kdnn::ssm {

struct CausalConv1dOptions {
  bool silu = true;  ///< apply SiLU to the convolution's output
  /// launch.form picks the kernels' form: on a GPU (or with
  /// KernelForm::gpu) a thread per channel and run of steps with the last K
  /// inputs in registers, for K ∈ {2, 3, 4}; otherwise tiles of steps and
  /// channels in team scratch (the host form, and any other K), for which
  /// team_size and vector_length are requests as in every team kernel.
  Launch launch;
  /// Refuse a NaN or an infinity in x, w, bias, initial_state (and the
  /// backward's dy and dfinal_state), naming the first: a reduction over
  /// each that the host waits for. Without it they propagate, as in PyTorch
  /// (docs/api.md).
  bool check_finite = false;
};

/// The arguments of causal_conv1d_forward. Optional Views may be left empty
/// (default-constructed).
template <class T, class ExecSpace>
struct ConvForward {
  StridedTensor3<const T, ExecSpace> x;              ///< [B, L, C]
  Matrix<const compute_t<T>, ExecSpace> w;           ///< [C, K], K ≥ 1
  Vector<const compute_t<T>, ExecSpace> bias;        ///< [C]; optional (zero)
  StridedTensor3<const T, ExecSpace> initial_state;  ///< [B, K−1, C]; optional (zeros)
  StridedTensor3<T, ExecSpace> y;                    ///< output [B, L, C]
  StridedTensor3<T, ExecSpace> final_state;          ///< output [B, K−1, C]; optional
  Matrix<const int, ExecSpace> seq_idx;              ///< [B, L] packed sequences; optional
};

/// The arguments of causal_conv1d_backward: the forward's inputs, dy = dL/dy
/// and the gradients to write. Optional Views may be left empty.
template <class T, class ExecSpace>
struct ConvBackward {
  StridedTensor3<const T, ExecSpace> x;              ///< [B, L, C]
  Matrix<const compute_t<T>, ExecSpace> w;           ///< [C, K]
  Vector<const compute_t<T>, ExecSpace> bias;        ///< [C]; optional, as in the forward
  StridedTensor3<const T, ExecSpace> initial_state;  ///< [B, K−1, C]; optional, as in the forward
  StridedTensor3<const T, ExecSpace> dy;             ///< [B, L, C]
  StridedTensor3<const T, ExecSpace> dfinal_state;   ///< [B, K−1, C]; optional (zero)
  StridedTensor3<T, ExecSpace> dx;                   ///< output [B, L, C]
  Matrix<compute_t<T>, ExecSpace> dw;                ///< output [C, K]
  Vector<compute_t<T>, ExecSpace> dbias;             ///< output [C]; optional
  StridedTensor3<T, ExecSpace> dinitial_state;       ///< output [B, K−1, C]; optional
  Matrix<const int, ExecSpace> seq_idx;              ///< [B, L]; optional, as in the forward
};

}  // namespace kdnn::ssm

#define KDNN_CAUSAL_CONV1D_OPERATORS(PREFIX, ExecSpace, T)                                \
  PREFIX void causal_conv1d_forward(const ExecSpace&, const ConvForward<T, ExecSpace>&,   \
                                    const CausalConv1dOptions&);                          \
  PREFIX void causal_conv1d_backward(const ExecSpace&, const ConvBackward<T, ExecSpace>&, \
                                     const CausalConv1dOptions&);

namespace kdnn::ssm {

namespace impl {
KDNN_CAUSAL_CONV1D_OPERATORS(KDNN_TEMPLATE_EXEC_SPACE_T, ExecSpace, T)
#define KDNN_CAUSAL_CONV1D_EXTERN(ExecSpace, T) \
  KDNN_CAUSAL_CONV1D_OPERATORS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH_STORAGE(KDNN_CAUSAL_CONV1D_EXTERN)
#undef KDNN_CAUSAL_CONV1D_EXTERN
}  // namespace impl

/// y (and the final state) from x, w, bias and the initial state.
/// Asynchronous on `space` after the host-side checks, which throw
/// kdnn::Error naming the argument.
template <class ExecSpace, class T>
void causal_conv1d_forward(const ExecSpace& space, const ConvForward<T, ExecSpace>& args,
                           const CausalConv1dOptions& opts = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::causal_conv1d_forward<ExecSpace, T>(space, args, opts);
}

/// dx, dw (and dbias, d(initial state)) from the forward's inputs and dy (and
/// d(final state)). dw and dbias are overwritten. Asynchronous on `space`.
template <class ExecSpace, class T>
void causal_conv1d_backward(const ExecSpace& space, const ConvBackward<T, ExecSpace>& args,
                            const CausalConv1dOptions& opts = {}) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::causal_conv1d_backward<ExecSpace, T>(space, args, opts);
}

}  // namespace kdnn::ssm

#include "kdnn/ssm/impl/causal_conv1d_impl.hpp"
