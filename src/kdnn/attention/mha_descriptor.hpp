// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// A descriptor interface to the multi-head attention layer (mha.hpp) shaped
// like cuDNN's multi-head attention API, for code ported from it: one
// descriptor (cudnnSetAttnDescriptor), one weight buffer with a view per
// weight kind (cudnnGetMultiHeadAttnWeights), a size query
// (cudnnGetMultiHeadAttnBuffers) and the three calls in cuDNN's order
// (cudnnMultiHeadAttnForward, cudnnMultiHeadAttnBackwardData,
// cudnnMultiHeadAttnBackwardWeights). docs/attention.md maps each argument.
//
// Differences from cuDNN, by design: the element type is the template's T
// (no dataType / computePrec / mathType); activations are [B, S, E] Views
// (no sequence-data descriptors, no beams, no currIdx inference mode); the
// projections are required (sizes > 0); windows and sequence lengths are
// device Views of the actual S and B; dropout is counter-based, with the
// offset in the descriptor (advance it per step for a fresh mask);
// backward-weights takes no dout, it reads it from the reserve where
// backward-data left it (as cuDNN, it must follow backward-data); the
// descriptor also picks the layer's attention algorithm (`algo`, fused by
// default), which sets the reserve and workspace sizes.
#include <cstddef>
#include <cstdint>

#include "kdnn/attention/mha.hpp"
#include "kdnn/core/impl/space_lock.hpp"

namespace kdnn::attention {

/// cuDNN's attention descriptor fields (cudnnSetAttnDescriptor), by name.
struct AttnDescriptor {
  int heads = 1;                                   ///< nHeads
  double sm_scaler = 1.0;                          ///< smScaler
  double dropout_p = 0;                            ///< attnDropoutDesc: drop probability, [0, 1)
  std::uint64_t dropout_seed = 0;                  ///< attnDropoutDesc: seed
  std::uint64_t dropout_offset = 0;                ///< counter offset: a fresh mask per value
  std::size_t q_size = 0, k_size = 0, v_size = 0;  ///< qSize, kSize, vSize: E_q, E_k, E_v
  std::size_t q_proj_size = 0;                     ///< qProjSize: D, per head
  std::size_t k_proj_size = 0;                     ///< kProjSize: D, per head (equal to qProjSize)
  std::size_t v_proj_size = 0;                     ///< vProjSize: Dv, per head
  std::size_t o_proj_size = 0;                     ///< oProjSize: E_o
  std::size_t qo_max_seq_length = 0;               ///< the largest S
  std::size_t kv_max_seq_length = 0;               ///< the largest Sk
  std::size_t max_batch_size = 0;                  ///< the largest B
  bool proj_biases = false;                        ///< attnMode CUDNN_ATTN_ENABLE_PROJ_BIASES
  /// kdnn's addition, not a cuDNN field: fused (default) or unfused
  /// attention (MhaOptions::algo); the buffer sizes depend on it.
  AttentionAlgo algo = AttentionAlgo::fused;
};

/// cudnnMultiHeadAttnWeightKind_t.
enum class MhaWeightKind {
  q_weights,
  k_weights,
  v_weights,
  o_weights,
  q_biases,
  k_biases,
  v_biases,
  o_biases
};

/// cudnnGetMultiHeadAttnBuffers' answer, in bytes.
struct MhaBufferBytes {
  std::size_t weights = 0, workspace = 0, reserve = 0;
};

namespace impl {

/// Checks every field; throws kdnn::Error naming the first bad one.
void validate_descriptor(const char* op, const AttnDescriptor& d);

/// Offset (elements) and [rows, cols] of one weight kind in the buffer:
/// W_q [H·D, E_q], W_k [H·D, E_k], W_v [H·Dv, E_v], W_o [E_o, H·Dv], then
/// (with proj_biases) b_q, b_k [H·D], b_v [H·Dv], b_o [E_o] as [n, 1].
struct WeightSlot {
  std::size_t offset, rows, cols;
};
WeightSlot weight_slot(const AttnDescriptor& d, MhaWeightKind kind);
std::size_t weight_count(const AttnDescriptor& d);
MhaShape max_shape(const AttnDescriptor& d);
MhaOptions options_of(const AttnDescriptor& d);

/// The layer's parameters as Views into `buffer` (weight_count(d) elements).
template <class ExecSpace, class View, class T = typename View::value_type>
MhaParams<T, ExecSpace> params_of(const AttnDescriptor& d, const View& buffer) {
  const auto matrix = [&](MhaWeightKind kind) {
    const WeightSlot s = weight_slot(d, kind);
    return Matrix<T, ExecSpace>(buffer.data() + s.offset, s.rows, s.cols);
  };
  const auto vector = [&](MhaWeightKind kind) {
    if (!d.proj_biases) return Vector<T, ExecSpace>();
    const WeightSlot s = weight_slot(d, kind);
    return Vector<T, ExecSpace>(buffer.data() + s.offset, s.rows);
  };
  return {matrix(MhaWeightKind::q_weights), matrix(MhaWeightKind::k_weights),
          matrix(MhaWeightKind::v_weights), matrix(MhaWeightKind::o_weights),
          vector(MhaWeightKind::q_biases),  vector(MhaWeightKind::k_biases),
          vector(MhaWeightKind::v_biases),  vector(MhaWeightKind::o_biases)};
}

/// Requires a weight buffer of weight_count(d) elements and the actual
/// sizes within the descriptor's maxima.
template <class WView>
void check_weights(const char* op, const char* name, const AttnDescriptor& d, const WView& w) {
  if (w.extent(0) != weight_count(d)) {
    fail(op, ": ", name, " has extent(0)=", w.extent(0), ", expected ", weight_count(d),
         " (get_multi_head_attn_buffers(desc).weights / sizeof(T))");
  }
}
void check_within_maxima(const char* op, const AttnDescriptor& d, std::size_t batch,
                         std::size_t seq_q, std::size_t seq_k);

}  // namespace impl

/// cudnnGetMultiHeadAttnBuffers: the weight, workspace and reserve sizes in
/// bytes for T, at the descriptor's maximal B, S and Sk.
template <class T>
MhaBufferBytes get_multi_head_attn_buffers(const AttnDescriptor& desc) {
  impl::validate_descriptor("attention::get_multi_head_attn_buffers", desc);
  const MhaBufferSizes sizes = mha_buffer_sizes(impl::max_shape(desc));
  return {impl::weight_count(desc) * sizeof(T), sizes.workspace * sizeof(T),
          sizes.reserve * sizeof(T)};
}

/// cudnnGetMultiHeadAttnWeights: the View of one weight kind inside the
/// weight buffer ([rows, cols]; a bias as [n, 1]). Asking for a bias of a
/// descriptor without proj_biases is a kdnn::Error.
template <class WView>
Kokkos::View<typename WView::value_type**, Kokkos::LayoutRight, typename WView::memory_space>
get_multi_head_attn_weights(const AttnDescriptor& desc, MhaWeightKind kind, const WView& weights) {
  constexpr const char* op = "attention::get_multi_head_attn_weights";
  impl::validate_descriptor(op, desc);
  impl::check_weights(op, "weights", desc, weights);
  const impl::WeightSlot s = impl::weight_slot(desc, kind);
  using M =
      Kokkos::View<typename WView::value_type**, Kokkos::LayoutRight, typename WView::memory_space>;
  return M(weights.data() + s.offset, s.rows, s.cols);
}

/// cudnnMultiHeadAttnForward (training: what cuDNN does with currIdx < 0).
template <class ExecSpace, class T>
void multi_head_attn_forward(const ExecSpace& space, const AttnDescriptor& desc,
                             const impl::NoDeduce<Vector<const int, ExecSpace>>& lo_win,
                             const impl::NoDeduce<Vector<const int, ExecSpace>>& hi_win,
                             const impl::NoDeduce<Vector<const int, ExecSpace>>& seq_qo,
                             const impl::NoDeduce<Vector<const int, ExecSpace>>& seq_kv,
                             const impl::NoDeduce<Tensor3<const T, ExecSpace>>& q,
                             const impl::NoDeduce<Tensor3<const T, ExecSpace>>& residual,
                             const impl::NoDeduce<Tensor3<const T, ExecSpace>>& k,
                             const impl::NoDeduce<Tensor3<const T, ExecSpace>>& v,
                             const Tensor3<T, ExecSpace>& out,
                             const impl::NoDeduce<Vector<const T, ExecSpace>>& weights,
                             const impl::NoDeduce<Vector<T, ExecSpace>>& workspace,
                             const impl::NoDeduce<Vector<T, ExecSpace>>& reserve) {
  const kdnn::impl::SpaceLock exclusive(space);
  constexpr const char* op = "attention::multi_head_attn_forward";
  impl::validate_descriptor(op, desc);
  impl::check_weights(op, "weights", desc, weights);
  impl::check_within_maxima(op, desc, q.extent(0), q.extent(1), k.extent(1));
  const AttentionMask<ExecSpace> mask{false, lo_win, hi_win, seq_qo, seq_kv};
  mha_forward(space, impl::options_of(desc), mask, impl::params_of<ExecSpace>(desc, weights), q, k,
              v, residual, out, reserve, workspace);
}

/// cudnnMultiHeadAttnBackwardData: dq, dk, dv from dout (queries, keys and
/// values are not needed: the reserve holds what the forward saved).
template <class ExecSpace, class T>
void multi_head_attn_backward_data(const ExecSpace& space, const AttnDescriptor& desc,
                                   const impl::NoDeduce<Vector<const int, ExecSpace>>& lo_win,
                                   const impl::NoDeduce<Vector<const int, ExecSpace>>& hi_win,
                                   const impl::NoDeduce<Vector<const int, ExecSpace>>& seq_dqdo,
                                   const impl::NoDeduce<Vector<const int, ExecSpace>>& seq_dkdv,
                                   const impl::NoDeduce<Tensor3<const T, ExecSpace>>& dout,
                                   const Tensor3<T, ExecSpace>& dq,
                                   const impl::NoDeduce<Tensor3<T, ExecSpace>>& dk,
                                   const impl::NoDeduce<Tensor3<T, ExecSpace>>& dv,
                                   const impl::NoDeduce<Vector<const T, ExecSpace>>& weights,
                                   const impl::NoDeduce<Vector<T, ExecSpace>>& workspace,
                                   const impl::NoDeduce<Vector<T, ExecSpace>>& reserve) {
  const kdnn::impl::SpaceLock exclusive(space);
  constexpr const char* op = "attention::multi_head_attn_backward_data";
  impl::validate_descriptor(op, desc);
  impl::check_weights(op, "weights", desc, weights);
  impl::check_within_maxima(op, desc, dq.extent(0), dq.extent(1), dk.extent(1));
  const AttentionMask<ExecSpace> mask{false, lo_win, hi_win, seq_dqdo, seq_dkdv};
  mha_backward_data(space, impl::options_of(desc), mask, impl::params_of<ExecSpace>(desc, weights),
                    dout, dq, dk, dv, Tensor3<T, ExecSpace>(), reserve, workspace);
}

/// cudnnMultiHeadAttnBackwardWeights: the gradients of every weight kind
/// into `dweights` (laid out as the weight buffer), added to it with
/// WgradMode::add (CUDNN_WGRAD_MODE_ADD) or overwriting it (SET).
template <class ExecSpace, class T>
void multi_head_attn_backward_weights(const ExecSpace& space, const AttnDescriptor& desc,
                                      WgradMode add_grad,
                                      const impl::NoDeduce<Tensor3<const T, ExecSpace>>& q,
                                      const impl::NoDeduce<Tensor3<const T, ExecSpace>>& k,
                                      const impl::NoDeduce<Tensor3<const T, ExecSpace>>& v,
                                      const impl::NoDeduce<Vector<const T, ExecSpace>>& weights,
                                      const Vector<T, ExecSpace>& dweights,
                                      const impl::NoDeduce<Vector<T, ExecSpace>>& reserve) {
  const kdnn::impl::SpaceLock exclusive(space);
  constexpr const char* op = "attention::multi_head_attn_backward_weights";
  impl::validate_descriptor(op, desc);
  impl::check_weights(op, "weights", desc, weights);
  impl::check_weights(op, "dweights", desc, dweights);
  impl::check_within_maxima(op, desc, q.extent(0), q.extent(1), k.extent(1));
  mha_backward_weights(space, impl::options_of(desc), impl::params_of<ExecSpace>(desc, weights), q,
                       k, v, impl::params_of<ExecSpace>(desc, dweights), add_grad, reserve);
}

}  // namespace kdnn::attention
