// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// kdnn::attention multi-head attention layer (the eigenMHA / cuDNN scope),
// for queries q [B, S, E_q], keys k [B, Sk, E_k] and values v [B, Sk, E_v]:
//
//   Q = q·W_qᵀ + b_q [B, S, H·D],  K = k·W_kᵀ + b_k [B, Sk, Hkv·D],
//   V = v·W_vᵀ + b_v [B, Sk, Hkv·Dv]                  (nn.Linear, biases optional)
//   P_h = softmax(s · Q_h K_g(h)ᵀ) over the keys the mask leaves [B, H, S, Sk]
//   A_h = dropout(P_h) · V_g(h),  A = [A_0 … A_{H−1}] (heads side by side) [B, S, H·Dv]
//   out = A·W_oᵀ + b_o (+ residual)                   [B, S, E_o]
//
// Query head h uses rows h·D … (h+1)·D − 1 of W_q; it reads key/value head
// g(h) = h / (H / Hkv), i.e. rows g·D … of W_k and g·Dv … of W_v. Hkv
// (MhaOptions::kv_heads) divides H: Hkv = H is multi-head attention, Hkv < H
// grouped-query and Hkv = 1 multi-query attention, where W_k's and W_v's
// gradients sum over the query heads of each group. s is sm_scaler (default
// 1/√D). The mask is softmax.hpp's AttentionMask (causal, cuDNN's
// per-query windows [lo, hi), per-entry sequence lengths):
// a fully masked query row has zero probabilities, so its output is
// b_o (+ residual) and it passes no gradient; a padded query (i ≥ seq_q[b])
// gets a zero output row and zero gradients, residual included.
//
// Packed sequences (flash-attn's varlen layout): with `seqs`
// (fused_attention_varlen.hpp's PackedSequences) given to mha_forward and
// mha_backward_data, q, k and v are one batch entry (B = 1) holding N
// sequences along S and Sk, at the offsets cu_seqlens_q and cu_seqlens_k;
// each sequence's queries see only its own keys (causal and dropout per
// sequence, as fused_attention_varlen_forward), with the fused algorithm
// only and a mask without per-entry vectors. The projections and
// mha_backward_weights are row by row and need nothing more.
//
// Two algorithms compute the A_h (MhaOptions::algo), with the same results
// up to rounding and the same dropout mask for the same (seed, offset):
// AttentionAlgo::fused (the default) is fused_attention.hpp's flash-style
// kernel, which never stores P: no buffer grows with S·Sk;
// AttentionAlgo::unfused is batched GEMM → softmax → dropout → batched GEMM,
// which keeps P [B, H, S, Sk] in the reserve and needs two more such tensors
// of scratch.
//
// Training is three calls, in cuDNN's order:
//   mha_forward           out; saves what the backward needs in `reserve`:
//                         the per-head Q, K, V, then the per-head outputs
//                         A_h [B, H, S, Dv] with each query's log-sum-exp
//                         of scores [B, H, S] (fused) or the probabilities
//                         P [B, H, S, Sk] (unfused), and A;
//   mha_backward_data     dq, dk, dv (and the residual's gradient) from dout;
//                         leaves dout (padded rows zeroed) and the
//                         projections' gradients in `reserve`;
//   mha_backward_weights  dW_q … dW_o and the bias gradients, written or
//                         added (WgradMode), from reserve and q, k, v.
// `reserve` must be kept untouched between the three calls; `workspace` is
// scratch for one call (the same size serves the forward and backward-data).
// Both are caller-owned 1-D buffers of T whose sizes mha_buffer_sizes gives
// for the shape and algorithm. Dropout's mask is regenerated from its (seed,
// offset), never stored. The backward calls take the forward's options
// (algorithm included) and mask. Every call is asynchronous on `space` after
// host-side checks, and checks everything before it launches anything.
#include <cstddef>
#include <optional>
#include <type_traits>

#include <Kokkos_Core.hpp>

#include "kdnn/attention/dropout.hpp"
#include "kdnn/attention/fused_attention_varlen.hpp"
#include "kdnn/attention/softmax.hpp"
#include "kdnn/attention/types.hpp"
#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/space_lock.hpp"

namespace kdnn::attention {

/// The layer's parameters, laid out as nn.Linear weights: w_q [H·D, E_q],
/// w_k [Hkv·D, E_k], w_v [Hkv·Dv, E_v], w_o [E_o, H·Dv]; biases b_q [H·D],
/// b_k [Hkv·D], b_v [Hkv·Dv], b_o [E_o], each optional (a default-constructed
/// View). With T = const U: the weights a call reads; with T = U: weight
/// gradients.
template <class T, class ExecSpace>
struct MhaParams {
  Matrix<T, ExecSpace> w_q, w_k, w_v, w_o;
  Vector<T, ExecSpace> b_q, b_k, b_v, b_o;

  /// The same Views, read-only.
  MhaParams<const T, ExecSpace> as_const() const {
    return {w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o};
  }
};

/// How the layer computes the per-head attention (see the header comment).
enum class AttentionAlgo {
  fused,    ///< fused_attention.hpp: P never stored, no buffer grows with S·Sk
  unfused,  ///< batched GEMM, softmax, dropout, batched GEMM: P [B, H, S, Sk] kept
};

struct MhaOptions {
  int heads = 1;                              ///< H, dividing the projection sizes
  std::optional<double> sm_scaler;            ///< s, the softmax scale; 1/√D when unset
  DropoutOptions dropout;                     ///< on the probabilities; p = 0: none
  AttentionAlgo algo = AttentionAlgo::fused;  ///< the same in the three calls
  /// Hkv, the key/value heads, dividing H (grouped-query attention; 1:
  /// multi-query); 0: H, one key/value head per query head.
  int kv_heads = 0;
  /// Refuse a NaN or an infinity in the inputs, the residual, the weights
  /// (and the backward's dout), naming the first: a reduction over each
  /// that the host waits for. Without it they propagate, as in PyTorch
  /// (docs/api.md).
  bool check_finite = false;
};

/// The sizes that fix a layer's buffers (B, S, Sk, the feature sizes and
/// the algorithm, whose buffers differ).
struct MhaShape {
  std::size_t batch = 0, seq_q = 0, seq_k = 0;                      ///< B, S, Sk
  std::size_t q_size = 0, k_size = 0, v_size = 0;                   ///< E_q, E_k, E_v
  std::size_t heads = 1, head_dim = 0, v_head_dim = 0, o_size = 0;  ///< H, D, Dv, E_o
  AttentionAlgo algo = AttentionAlgo::fused;                        ///< MhaOptions::algo
  std::size_t kv_heads = 0;  ///< Hkv, dividing H; 0: H (MhaOptions::kv_heads)
};

/// Elements of T the layer's caller-owned buffers need.
struct MhaBufferSizes {
  std::size_t reserve = 0;    ///< kept from mha_forward to mha_backward_weights
  std::size_t workspace = 0;  ///< scratch for any one call
};

/// The buffer sizes for `shape` (the same for every scalar type, in elements);
/// a kdnn::Error for an algo that is no AttentionAlgo or kv_heads that does
/// not divide heads.
inline MhaBufferSizes mha_buffer_sizes(const MhaShape& shape);

/// The arguments of mha_forward. Optional Views may be left empty.
template <class T, class ExecSpace>
struct MhaForward {
  MhaParams<const T, ExecSpace> weights;  ///< the layer's parameters
  Tensor3<const T, ExecSpace> q;          ///< [B, S, E_q]
  Tensor3<const T, ExecSpace> k;          ///< [B, Sk, E_k]
  Tensor3<const T, ExecSpace> v;          ///< [B, Sk, E_v]
  Tensor3<const T, ExecSpace> residual;   ///< [B, S, E_o]; optional
  Tensor3<T, ExecSpace> out;              ///< output [B, S, E_o]
  Vector<T, ExecSpace> reserve;           ///< mha_buffer_sizes' reserve, kept for the backward
  Vector<T, ExecSpace> workspace;         ///< mha_buffer_sizes' workspace
  AttentionMask<ExecSpace> mask;          ///< optional (every key visible)
  PackedSequences<ExecSpace> seqs;        ///< packed sequences (see above); optional
};

/// The arguments of mha_backward_data: dout = dL/dout, the gradients of the
/// inputs to write, and the forward's weights, reserve, mask and packing.
template <class T, class ExecSpace>
struct MhaBackwardData {
  MhaParams<const T, ExecSpace> weights;  ///< the forward's
  Tensor3<const T, ExecSpace> dout;       ///< [B, S, E_o]
  Tensor3<T, ExecSpace> dq;               ///< output [B, S, E_q]
  Tensor3<T, ExecSpace> dk;               ///< output [B, Sk, E_k]
  Tensor3<T, ExecSpace> dv;               ///< output [B, Sk, E_v]
  Tensor3<T, ExecSpace> dresidual;        ///< output [B, S, E_o]; optional
  Vector<T, ExecSpace> reserve;           ///< the forward's
  Vector<T, ExecSpace> workspace;         ///< mha_buffer_sizes' workspace
  AttentionMask<ExecSpace> mask;          ///< the forward's
  PackedSequences<ExecSpace> seqs;        ///< the forward's
};

/// The arguments of mha_backward_weights: the forward's weights and inputs,
/// the gradients to write or add to (a bias gradient is written iff given,
/// and then its bias must be), and the reserve after mha_backward_data.
template <class T, class ExecSpace>
struct MhaBackwardWeights {
  MhaParams<const T, ExecSpace> weights;  ///< the forward's
  Tensor3<const T, ExecSpace> q;          ///< the forward's [B, S, E_q]
  Tensor3<const T, ExecSpace> k;          ///< the forward's [B, Sk, E_k]
  Tensor3<const T, ExecSpace> v;          ///< the forward's [B, Sk, E_v]
  MhaParams<T, ExecSpace> grads;          ///< outputs, weights' shapes
  Vector<T, ExecSpace> reserve;           ///< after mha_backward_data
  WgradMode mode = WgradMode::set;        ///< overwrite or add to grads
};

}  // namespace kdnn::attention

#define KDNN_MHA_OPERATORS(PREFIX, ExecSpace, T)                                                 \
  PREFIX void mha_forward(const ExecSpace&, const MhaForward<T, ExecSpace>&, const MhaOptions&); \
  PREFIX void mha_backward_data(const ExecSpace&, const MhaBackwardData<T, ExecSpace>&,          \
                                const MhaOptions&);                                              \
  PREFIX void mha_backward_weights(const ExecSpace&, const MhaBackwardWeights<T, ExecSpace>&,    \
                                   const MhaOptions&);

namespace kdnn::attention {

namespace impl {
KDNN_MHA_OPERATORS(KDNN_TEMPLATE_EXEC_SPACE_T, ExecSpace, T)
#define KDNN_MHA_EXTERN(ExecSpace, T) KDNN_MHA_OPERATORS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_MHA_EXTERN)
#undef KDNN_MHA_EXTERN

/// X, in a position where a template argument is not deduced from it.
template <class X>
struct NoDeduceT {
  using type = X;
};
template <class X>
using NoDeduce = typename NoDeduceT<X>::type;
}  // namespace impl

/// out = the layer applied to (q, k, v) (+ residual); fills the reserve for
/// the backward calls.
template <class ExecSpace, class T>
void mha_forward(const ExecSpace& space, const MhaForward<T, ExecSpace>& args,
                 const MhaOptions& opts) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::mha_forward<ExecSpace, T>(space, args, opts);
}

/// From dout = dL/dout: dq, dk, dv and, if given, dresidual (dout with the
/// padded query rows zeroed). Needs the forward's reserve; leaves in it the
/// projections' gradients for mha_backward_weights.
template <class ExecSpace, class T>
void mha_backward_data(const ExecSpace& space, const MhaBackwardData<T, ExecSpace>& args,
                       const MhaOptions& opts) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::mha_backward_data<ExecSpace, T>(space, args, opts);
}

/// The weight and bias gradients, overwritten or added to (args.mode). Runs
/// after mha_backward_data on the same reserve, which holds dL/dout and the
/// projections' gradients.
template <class ExecSpace, class T>
void mha_backward_weights(const ExecSpace& space, const MhaBackwardWeights<T, ExecSpace>& args,
                          const MhaOptions& opts) {
  const kdnn::impl::SpaceLock exclusive(space);
  impl::mha_backward_weights<ExecSpace, T>(space, args, opts);
}

/// mha_forward with its arguments one by one, cuDNN's order (T is the
/// weights' scalar type; `seqs`: packed sequences, or none).
template <class ExecSpace, class W, class T = std::remove_const_t<W>>
void mha_forward(const ExecSpace& space, const MhaOptions& opts,
                 const AttentionMask<ExecSpace>& mask, const MhaParams<W, ExecSpace>& weights,
                 const impl::NoDeduce<Tensor3<const T, ExecSpace>>& q,
                 const impl::NoDeduce<Tensor3<const T, ExecSpace>>& k,
                 const impl::NoDeduce<Tensor3<const T, ExecSpace>>& v,
                 const impl::NoDeduce<Tensor3<const T, ExecSpace>>& residual,
                 const impl::NoDeduce<Tensor3<T, ExecSpace>>& out,
                 const impl::NoDeduce<Vector<T, ExecSpace>>& reserve,
                 const impl::NoDeduce<Vector<T, ExecSpace>>& workspace,
                 const PackedSequences<ExecSpace>& seqs = {}) {
  mha_forward(space,
              MhaForward<T, ExecSpace>{weights.as_const(), q, k, v, residual, out, reserve,
                                       workspace, mask, seqs},
              opts);
}

/// mha_backward_data with its arguments one by one, cuDNN's order.
template <class ExecSpace, class W, class T = std::remove_const_t<W>>
void mha_backward_data(const ExecSpace& space, const MhaOptions& opts,
                       const AttentionMask<ExecSpace>& mask, const MhaParams<W, ExecSpace>& weights,
                       const impl::NoDeduce<Tensor3<const T, ExecSpace>>& dout,
                       const impl::NoDeduce<Tensor3<T, ExecSpace>>& dq,
                       const impl::NoDeduce<Tensor3<T, ExecSpace>>& dk,
                       const impl::NoDeduce<Tensor3<T, ExecSpace>>& dv,
                       const impl::NoDeduce<Tensor3<T, ExecSpace>>& dresidual,
                       const impl::NoDeduce<Vector<T, ExecSpace>>& reserve,
                       const impl::NoDeduce<Vector<T, ExecSpace>>& workspace,
                       const PackedSequences<ExecSpace>& seqs = {}) {
  mha_backward_data(space,
                    MhaBackwardData<T, ExecSpace>{weights.as_const(), dout, dq, dk, dv, dresidual,
                                                  reserve, workspace, mask, seqs},
                    opts);
}

/// mha_backward_weights with its arguments one by one, cuDNN's order.
template <class ExecSpace, class W, class T = std::remove_const_t<W>>
void mha_backward_weights(const ExecSpace& space, const MhaOptions& opts,
                          const MhaParams<W, ExecSpace>& weights,
                          const impl::NoDeduce<Tensor3<const T, ExecSpace>>& q,
                          const impl::NoDeduce<Tensor3<const T, ExecSpace>>& k,
                          const impl::NoDeduce<Tensor3<const T, ExecSpace>>& v,
                          const impl::NoDeduce<MhaParams<T, ExecSpace>>& grads, WgradMode mode,
                          const impl::NoDeduce<Vector<T, ExecSpace>>& reserve) {
  mha_backward_weights(
      space, MhaBackwardWeights<T, ExecSpace>{weights.as_const(), q, k, v, grads, reserve, mode},
      opts);
}

}  // namespace kdnn::attention

#include "kdnn/attention/impl/mha_impl.hpp"
