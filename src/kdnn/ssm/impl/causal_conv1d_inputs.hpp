// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// What both forms of the causal conv1d take (the tiled kernels,
// causal_conv1d_kernels.hpp, and the register kernels,
// causal_conv1d_register_kernels.hpp), and how a tiled kernel walks the
// channels of one step of a [B, ·, C] tensor.
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/tensor.hpp"
#include "kdnn/ssm/impl/sigmoid.hpp"

namespace kdnn::ssm::impl {

/// The sequence that step s of x̄ belongs to under seq_idx [B, L] (L > 0):
/// seq_idx[b, s] clamped to [0, L), so the initial state (s < 0) continues
/// the first step's sequence and the steps past L take the last step's.
template <class SeqIdx>
KOKKOS_INLINE_FUNCTION int sequence_of(const SeqIdx& seq_idx, int b, int s) {
  const int L = int(seq_idx.extent(1));
  return seq_idx(b, s < 0 ? 0 : s < L ? s : L - 1);
}

/// Whether step s of x̄ is in the last step's sequence: the final state
/// keeps those steps (the state that sequence's decoding continues from)
/// and holds 0 for the others, so only they get its gradient.
template <class SeqIdx>
KOKKOS_INLINE_FUNCTION bool in_last_sequence(const SeqIdx& seq_idx, int b, int s) {
  return sequence_of(seq_idx, b, s) == sequence_of(seq_idx, b, int(seq_idx.extent(1)) - 1);
}

/// The arguments of every conv kernel (the tiled ones, the host form, and
/// the register ones, the GPU form).
template <class ExecSpace, class T>
struct ConvInputs {
  StridedTensor3<const T, ExecSpace> x;     ///< [B, L, C]
  Matrix<const T, ExecSpace> w;             ///< [C, K]
  Vector<const T, ExecSpace> bias;          ///< [C] or empty
  StridedTensor3<const T, ExecSpace> init;  ///< [B, K−1, C] or empty (zeros)
  bool has_bias = false, has_init = false, silu = true;
  int first = 0, last = 0;  ///< the launch's steps [first, last)
  /// Whether x's channels are closer in memory than its steps (channel-last,
  /// stride(2) <= stride(1)): the register kernels put consecutive threads
  /// on consecutive channels then, else on consecutive runs of steps, so
  /// that neighbouring threads read neighbouring memory either way.
  bool channels_inner = true;
  /// seq_idx [B, L] (packed sequences) or empty: x̄[s] enters the sums of
  /// step t only when sequence_of(b, s) == sequence_of(b, t).
  Matrix<const int, ExecSpace> seq;
  bool has_seq = false;  ///< seq given and L > 0

  KOKKOS_INLINE_FUNCTION int sequence_of(int b, int s) const {
    return impl::sequence_of(seq, b, s);
  }
  /// Whether step s's terms reach the final state (always without seq_idx).
  KOKKOS_INLINE_FUNCTION bool in_final_state(int b, int s) const {
    return !has_seq || in_last_sequence(seq, b, s);
  }
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
