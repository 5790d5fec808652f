// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What both forms of the causal conv1d take (the tiled kernels,
// causal_conv1d_kernels.hpp, and the register kernels,
// causal_conv1d_register_kernels.hpp), and how a tiled kernel walks the
// channels of one step of a [B, ·, C] tensor.
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/float16.hpp"
#include "kdnn/core/tensor.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/ssm/impl/sigmoid.hpp"

namespace kdnn::ssm::impl {

/// The sequence ids of x̄'s steps (packed sequences): seq_idx [B, L] for
/// steps 0 … L−1 and, in a context-parallel call, `before` [B, K−1] for the
/// K−1 steps before step 0 (the halo, whose steps may belong to other
/// sequences); without `before`, those steps continue step 0's sequence.
/// The steps past L take the last step's id.
template <class ExecSpace>
struct ConvSequenceIds {
  Matrix<const int, ExecSpace> steps, before;
  /// Whether the ids apply: seq_idx given and a step to take an id from.
  bool active = false;

  ConvSequenceIds() = default;
  ConvSequenceIds(const Matrix<const int, ExecSpace>& seq_idx,
                  const Matrix<const int, ExecSpace>& ids_before)
      : steps(seq_idx),
        before(ids_before),
        active(validate::given(seq_idx) &&
               (seq_idx.extent(1) > 0 || (ids_before.extent(0) > 0 && ids_before.extent(1) > 0))) {}

  /// The sequence of step s (−K+1 ≤ s; only when `active`).
  KOKKOS_INLINE_FUNCTION int of(int b, int s) const {
    const int L = int(steps.extent(1)), K1 = int(before.extent(1));
    if (s >= L) s = L - 1;
    if (s >= 0) return steps(b, s);
    return K1 > 0 ? before(b, s + K1) : steps(b, 0);
  }

  /// Whether step s is in the last step's sequence: the final state keeps
  /// those steps (the state that sequence's decoding continues from) and
  /// holds 0 for the others, so only they get its gradient. Always true
  /// when not `active`.
  KOKKOS_INLINE_FUNCTION bool in_last_sequence(int b, int s) const {
    return !active || of(b, s) == of(b, int(steps.extent(1)) - 1);
  }
};

/// The arguments of every conv kernel (the tiled ones, the host form, and
/// the register ones, the GPU form). T is the tensors' storage type; the
/// kernels compute in Compute (float for the 16-bit types): they widen each
/// value they read and round each value they write once.
template <class ExecSpace, class T>
struct ConvInputs {
  using Compute = compute_t<T>;
  StridedTensor3<const T, ExecSpace> x;     ///< [B, L, C]
  Matrix<const Compute, ExecSpace> w;       ///< [C, K]
  Vector<const Compute, ExecSpace> bias;    ///< [C] or empty
  StridedTensor3<const T, ExecSpace> init;  ///< [B, K−1, C] or empty (zeros)
  bool has_bias = false, has_init = false, silu = true;
  int first = 0, last = 0;  ///< the launch's steps [first, last)
  /// Whether x's channels are closer in memory than its steps (channel-last,
  /// stride(2) <= stride(1)): the register kernels put consecutive threads
  /// on consecutive channels then, else on consecutive runs of steps, so
  /// that neighbouring threads read neighbouring memory either way.
  bool channels_inner = true;
  /// The sequence ids (packed sequences): x̄[s] enters the sums of step t
  /// only when seq.of(b, s) == seq.of(b, t).
  ConvSequenceIds<ExecSpace> seq;
};

/// The channels from c0 on of step s of batch entry b of a [B, ·, C] View:
/// row[c] is element (b, s, c0 + c). `Unit`: the channels are contiguous
/// (stride 1), and row[c] is a plain pointer offset that a host vectorises;
/// else the channel stride multiplies c.
template <class T, bool Unit>
struct ChannelRow {
  T* p;
  std::size_t stride;
  KOKKOS_FORCEINLINE_FUNCTION T& operator[](int c) const {
    return Unit ? p[c] : p[std::size_t(c) * stride];
  }
};

template <bool Unit, class View>
KOKKOS_FORCEINLINE_FUNCTION ChannelRow<typename View::value_type, Unit> channel_row(const View& v,
                                                                                    int b, int s,
                                                                                    int c0) {
  return {&v(b, s, c0), v.stride(2)};
}

}  // namespace kdnn::ssm::impl
