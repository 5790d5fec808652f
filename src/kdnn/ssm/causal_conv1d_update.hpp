// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::ssm causal conv1d decoding step: the conv of causal_conv1d.hpp on a
// rolling state of the last W inputs, for generation one (or a few) steps at
// a time, as causal-conv1d's causal_conv1d_update. With x̄ the state
// followed by the new steps (W + Lnew of them, per batch entry and channel),
//
//   z[b,c,t] = bias[c] + Σ_{k<K} w[c,k] · x̄[b, c, W + t − K + 1 + k],   y = SiLU(z) or z
//
// for t < Lnew, and the state becomes the last W steps of x̄. W ≥ K − 1
// (a longer state keeps older inputs, as the peer's). Channel-first, the
// peer's decoding layout: x and y [B, C, Lnew], conv_state [B, C, W]. Forward
// only (inference). As the peer's, two options for serving:
// - conv_state_indices [B]: batch entry b reads and writes state row
//   conv_state_indices[b] of a state [Bs, C, W] (continuous batching); the
//   indices are distinct and in [0, Bs) (two entries on one row would race).
// - cache_seqlens [B]: the state is a circular buffer whose next step goes
//   to slot p mod W, p = cache_seqlens[b] ≥ 0: x̄ is the K − 1 steps before
//   slot p (slots p − K + 1 … p − 1, mod W) followed by the new steps, and
//   new step t is written to slot (p + t) mod W (in order: with Lnew > W the
//   later steps stay). The caller advances p.
#include <Kokkos_Core.hpp>

#include "kdnn/core/float16.hpp"
#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/space_lock.hpp"
#include "kdnn/core/tensor.hpp"

namespace kdnn::ssm {

/// The arguments of causal_conv1d_update. `bias`, `conv_state_indices` and
/// `cache_seqlens` may be left empty.
template <class T, class ExecSpace>
struct ConvUpdate {
  Tensor3<const T, ExecSpace> x;  ///< [B, C, Lnew], the new steps
  /// [B, C, W] (with conv_state_indices [Bs, C, W]), W ≥ K − 1; read, then
  /// updated in place
  Tensor3<T, ExecSpace> conv_state;
  Matrix<const compute_t<T>, ExecSpace> w;          ///< [C, K], K ≥ 1 (as the conv's)
  Vector<const compute_t<T>, ExecSpace> bias;       ///< [C]; optional (zero)
  Tensor3<T, ExecSpace> y;                          ///< output [B, C, Lnew]
  Vector<const int, ExecSpace> conv_state_indices;  ///< [B]; optional: conv_state row b
  Vector<const int, ExecSpace> cache_seqlens;       ///< [B]; optional: a circular state
  bool silu = true;                                 ///< apply SiLU to the output
  /// Refuse a NaN or an infinity in x, conv_state, w or bias, naming the
  /// first (a reduction over each that the host waits for); without it they
  /// propagate, as in PyTorch (docs/api.md).
  bool check_finite = false;
};

}  // namespace kdnn::ssm

#define KDNN_CAUSAL_CONV1D_UPDATE_OPERATORS(PREFIX, ExecSpace, T) \
  PREFIX void causal_conv1d_update(const ExecSpace&, const ConvUpdate<T, ExecSpace>&);

namespace kdnn::ssm {

namespace impl {
KDNN_CAUSAL_CONV1D_UPDATE_OPERATORS(KDNN_TEMPLATE_EXEC_SPACE_T, ExecSpace, T)
#define KDNN_CAUSAL_CONV1D_UPDATE_EXTERN(ExecSpace, T) \
  KDNN_CAUSAL_CONV1D_UPDATE_OPERATORS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH_STORAGE(KDNN_CAUSAL_CONV1D_UPDATE_EXTERN)
#undef KDNN_CAUSAL_CONV1D_UPDATE_EXTERN
}  // namespace impl

/// y from x and the state, and the state advanced by x's steps: one thread
/// per (batch entry, channel). Asynchronous on `space` after the host-side
/// checks, which throw kdnn::Error naming the argument (given conv_state_indices
/// or cache_seqlens are copied to the host to be checked: on a GPU, a wait).
template <class ExecSpace, class T>
void causal_conv1d_update(const ExecSpace& space, const ConvUpdate<T, ExecSpace>& args) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::causal_conv1d_update<ExecSpace, T>(space, args);
}

}  // namespace kdnn::ssm

#include "kdnn/ssm/impl/causal_conv1d_update_impl.hpp"
