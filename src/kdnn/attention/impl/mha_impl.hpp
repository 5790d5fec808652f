// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of kdnn::attention::impl::{mha_forward, mha_backward_data,
// mha_backward_weights}: the layer composed from the family's operators
// (Linear, then fused attention or batched GEMM, masked softmax and dropout)
// and its own layout kernels. Backward, for the forward of mha.hpp with
// G = dL/dout (padded rows zeroed):
//   dA = G·W_o                           dA_h → its head's slice
//   dQ_h, dK_g, dV_g from dA_h: fused_attention_backward (fused), or
//     dV_g = Σ_h∈g dropout(P_h)ᵀ·dA_h    dP_h = dropout⁻ᵀ(dA_h·V_gᵀ)
//     dScores_h = softmax_backward(P_h, dP_h)     (includes the scale s)
//     dQ_h = dScores_h·K_g               dK_g = Σ_h∈g dScores_hᵀ·Q_h   (unfused)
//   where g is query head h's key/value head. Unfused, each product runs
//   once per key/value head on its group's query heads stacked (grouped()),
//   so the sums over a group are the GEMMs' own inner sums.
//   dq = dQ·W_q,  dk = dK·W_k,  dv = dV·W_v
//   dW_q = dQᵀ·q, db_q = Σ dQ (same for K, V);  dW_o = Gᵀ·A, db_o = Σ G.
#include <cmath>
#include <optional>
#include <utility>

#include "kdnn/attention/batched_gemm.hpp"
#include "kdnn/attention/dropout.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/fused_attention_varlen.hpp"
#include "kdnn/attention/impl/mha_buffers.hpp"
#include "kdnn/attention/impl/mha_kernels.hpp"
#include "kdnn/attention/impl/visible_keys.hpp"
#include "kdnn/attention/linear.hpp"
#include "kdnn/attention/mha.hpp"
#include "kdnn/attention/softmax.hpp"
#include "kdnn/core/impl/finite_values.hpp"
#include "kdnn/core/impl/gemm.hpp"
#include "kdnn/core/validate.hpp"

namespace kdnn::attention::impl {

/// Checks the options, the weights and the three activations (q, k, v or
/// their gradients, named `names`) against each other and the mask; returns
/// the layer's shape (o_size from w_o).
template <class ExecSpace, class T>
MhaShape mha_shape(const char* op, const MhaOptions& opts, const AttentionMask<ExecSpace>& mask,
                   const MhaParams<const T, ExecSpace>& w, const char* const (&names)[3],
                   const Tensor3<const T, ExecSpace>& q, const Tensor3<const T, ExecSpace>& k,
                   const Tensor3<const T, ExecSpace>& v) {
  if (opts.heads < 1) fail(op, ": opts.heads=", opts.heads, ", expected at least 1");
  check_algo(op, "opts.algo", opts.algo);
  check_kv_heads(op, "opts.kv_heads", opts.kv_heads, "opts.heads", opts.heads);
  MhaShape s;
  s.algo = opts.algo;
  s.heads = std::size_t(opts.heads);
  s.kv_heads = std::size_t(opts.kv_heads);
  const std::size_t H = s.heads, Hkv = kv_heads_of(s);
  const bool grouped_query = Hkv != H;
  const auto per_head = [&](const char* name, std::size_t rows, const char* heads, std::size_t n,
                            const char* what) {
    if (rows == 0 || rows % n != 0) {
      fail(op, ": weights.", name, " has extent(0)=", rows, ", expected a positive multiple of ",
           heads, "=", n, " (", what, ")");
    }
    return rows / n;
  };
  s.head_dim = per_head("w_q", w.w_q.extent(0), "opts.heads", H, "H·D, the query projection size");
  s.v_head_dim = per_head("w_v", w.w_v.extent(0), grouped_query ? "opts.kv_heads" : "opts.heads",
                          Hkv, "Hkv·Dv, the value projection size");
  s.o_size = w.w_o.extent(0);
  s.batch = q.extent(0);
  s.seq_q = q.extent(1);
  s.seq_k = k.extent(1);
  s.q_size = w.w_q.extent(1);
  s.k_size = w.w_k.extent(1);
  s.v_size = w.w_v.extent(1);
  validate::extent(op, "weights.w_k", w.w_k, 0, Hkv * s.head_dim,
                   grouped_query ? "Hkv·D, D from weights.w_q" : "H·D, as weights.w_q");
  validate::extent(op, "weights.w_o", w.w_o, 1, H * s.v_head_dim, "H·Dv, Dv from weights.w_v");
  const auto bias = [&](const char* name, const auto& b, std::size_t size, const char* what) {
    if (validate::given(b)) validate::extent(op, name, b, 0, size, what);
  };
  bias("weights.b_q", w.b_q, H * s.head_dim, "H·D");
  bias("weights.b_k", w.b_k, Hkv * s.head_dim, grouped_query ? "Hkv·D" : "H·D");
  bias("weights.b_v", w.b_v, Hkv * s.v_head_dim, grouped_query ? "Hkv·Dv" : "H·Dv");
  bias("weights.b_o", w.b_o, s.o_size, "E_o, weights.w_o's extent(0)");

  validate::extent(op, names[0], q, 2, s.q_size, "E_q, weights.w_q's extent(1)");
  validate::extent(op, names[1], k, 0, s.batch, std::string("the batch of ") + names[0]);
  validate::extent(op, names[1], k, 2, s.k_size, "E_k, weights.w_k's extent(1)");
  validate::extent(op, names[2], v, 0, s.batch, std::string("the batch of ") + names[0]);
  validate::extent(op, names[2], v, 1, s.seq_k, std::string("the key length of ") + names[1]);
  validate::extent(op, names[2], v, 2, s.v_size, "E_v, weights.w_v's extent(1)");

  if (opts.sm_scaler) validate::finite_as<T>(op, "opts.sm_scaler", *opts.sm_scaler);
  validate::in_half_open(op, "opts.dropout.p", opts.dropout.p, 0.0, 1.0);
  check_mask(op, mask, s.batch, s.seq_q, s.seq_k);
  return s;
}

/// Requires `buffer` (reserve or workspace) to hold at least `needed` elements.
template <class View>
void require_buffer(const char* op, const char* name, const View& buffer, std::size_t needed) {
  if (buffer.extent(0) < needed) {
    fail(op, ": ", name, " has extent(0)=", buffer.extent(0), ", expected at least ", needed,
         " (mha_buffer_sizes(shape).", name, ")");
  }
}

/// Requires an [B, S, E_o] tensor (out, dout, dresidual, residual).
template <class View>
void require_output_shape(const char* op, const char* name, const View& t, const MhaShape& s) {
  validate::extent(op, name, t, 0, s.batch, "B");
  validate::extent(op, name, t, 1, s.seq_q, "S, the query length");
  validate::extent(op, name, t, 2, s.o_size, "E_o, weights.w_o's extent(0)");
}

/// The scores' scale s: opts.sm_scaler, else 1/√D.
inline double score_scale(const MhaOptions& opts, const MhaShape& s) {
  return opts.sm_scaler ? *opts.sm_scaler : 1.0 / std::sqrt(double(s.head_dim));
}

inline SoftmaxOptions softmax_options(const MhaOptions& opts, const MhaShape& s) {
  return {SoftmaxMode::accurate, score_scale(opts, s)};
}

inline FusedAttentionOptions fused_options(const MhaOptions& opts, const MhaShape& s) {
  FusedAttentionOptions f;
  f.scale = score_scale(opts, s);
  f.dropout = opts.dropout;
  return f;
}

/// The fused backward's arguments: the per-head tensors of the reserve and
/// the workspace, every scratch tensor in the workspace.
template <class ExecSpace, class T>
FusedAttentionBackward<T, ExecSpace> fused_backward_args(
    const MhaReserve<T, ExecSpace>& r, const MhaBackwardDataWorkspace<T, ExecSpace>& ws,
    const AttentionMask<ExecSpace>& mask) {
  return {r.qh,   r.kh, r.vh, r.oh, r.lse,    ws.doh,       ws.dqh,      ws.dkh,
          ws.dvh, mask, {},   {},   ws.delta, ws.dk_shares, ws.dv_shares};
}

/// The fused path's launch plans, made but not launched, so that the one
/// check of fused_attention_forward / _backward that the layer's own checks
/// do not imply (a block's team scratch within the backend's limit, which
/// grows with D and Dv) fails before the layer launches anything
/// (check_fused_launch).
template <class ExecSpace, class T>
void check_fused_plans(const char* op, const ExecSpace& space, const MhaShape& s,
                       const FusedAttentionOptions& fopts, bool backward) {
  if (s.algo != AttentionAlgo::fused) return;
  check_fused_launch<ExecSpace, T>(op, space, int(s.batch), int(s.heads), int(s.seq_q),
                                   int(s.seq_k), int(s.head_dim), int(s.v_head_dim), fopts,
                                   backward);
}

/// The same per-head tensor x [B, H, R, C] (contiguous) as
/// [B, H / group, group·R, C]: each group's `group` consecutive heads
/// stacked, so that one GEMM per key/value head serves its whole group.
template <class View>
View grouped(const View& x, std::size_t group) {
  return View(x.data(), x.extent(0), x.extent(1) / group, group * x.extent(2), x.extent(3));
}

/// Whether the layer's call packs sequences; if so, checks that it can (one
/// batch entry, the fused algorithm) and the packing against S and Sk.
template <class ExecSpace>
std::optional<Packing<ExecSpace>> layer_packing(const char* op, const ExecSpace& space,
                                                const MhaShape& s,
                                                const PackedSequences<ExecSpace>& seqs,
                                                const AttentionMask<ExecSpace>& mask) {
  if (seqs.cu_seqlens_q.extent(0) == 0 && seqs.cu_seqlens_k.extent(0) == 0) return std::nullopt;
  if (s.batch != 1) {
    fail(op, ": packed sequences (seqs) with a batch of ", s.batch,
         ", expected 1 (the sequences lie along S and Sk)");
  }
  if (s.algo != AttentionAlgo::fused) {
    fail(op, ": packed sequences (seqs) with opts.algo=unfused, expected AttentionAlgo::fused");
  }
  return packing(op, space, seqs, s.seq_q, s.seq_k, 0, mask);
}

/// opts.check_finite of the layer: the weights and the named tensors hold no
/// NaN or infinity.
template <class ExecSpace, class T, class... Named>
void check_layer_finite(const char* op, const ExecSpace& space, const MhaOptions& opts,
                        const MhaParams<const T, ExecSpace>& w, const Named&... named) {
  if (!opts.check_finite) return;
  using kdnn::impl::check_finite;
  (check_finite(op, space, named.first, named.second), ...);
  check_finite(op, space, "weights.w_q", w.w_q);
  check_finite(op, space, "weights.w_k", w.w_k);
  check_finite(op, space, "weights.w_v", w.w_v);
  check_finite(op, space, "weights.w_o", w.w_o);
  check_finite(op, space, "weights.b_q", w.b_q);
  check_finite(op, space, "weights.b_k", w.b_k);
  check_finite(op, space, "weights.b_v", w.b_v);
  check_finite(op, space, "weights.b_o", w.b_o);
}

template <class ExecSpace, class T>
void mha_forward(const ExecSpace& space, const MhaForward<T, ExecSpace>& a,
                 const MhaOptions& opts) {
  constexpr const char* op = "attention::mha_forward";
  const auto& w = a.weights;
  const auto &q = a.q, &k = a.k, &v = a.v, &residual = a.residual;  // one type per declaration
  const auto& out = a.out;
  const auto &reserve = a.reserve, &workspace = a.workspace;
  const auto& mask = a.mask;
  const auto& seqs = a.seqs;
  const MhaShape s = mha_shape(op, opts, mask, w, {"q", "k", "v"}, q, k, v);
  const auto packed = layer_packing(op, space, s, seqs, mask);
  require_output_shape(op, "out", out, s);
  if (validate::given(residual)) validate::same_shape(op, "residual", residual, "out", out);
  const MhaReserve<T, ExecSpace> r(s, reserve.data());
  const MhaForwardWorkspace<T, ExecSpace> ws(s, workspace.data());
  require_buffer(op, "reserve", reserve, r.size);
  require_buffer(op, "workspace", workspace, mha_buffer_sizes(s).workspace);
  const FusedAttentionOptions fopts = fused_options(opts, s);
  using validate::memory_of;
  validate::disjoint(
      op, {memory_of("out", out), memory_of("reserve", reserve), memory_of("workspace", workspace)},
      {memory_of("q", q), memory_of("k", k), memory_of("v", v), memory_of("residual", residual),
       memory_of("weights.w_q", w.w_q), memory_of("weights.w_k", w.w_k),
       memory_of("weights.w_v", w.w_v), memory_of("weights.w_o", w.w_o),
       memory_of("weights.b_q", w.b_q), memory_of("weights.b_k", w.b_k),
       memory_of("weights.b_v", w.b_v), memory_of("weights.b_o", w.b_o)});
  check_fused_plans<ExecSpace, T>(op, space, s, fopts, false);
  check_layer_finite(op, space, opts, w, std::pair("q", q), std::pair("k", k), std::pair("v", v),
                     std::pair("residual", residual));

  attention::linear_forward(space, q, w.w_q, w.b_q, ws.q);
  split_heads(space, Tensor3<const T, ExecSpace>(ws.q), r.qh);
  attention::linear_forward(space, k, w.w_k, w.b_k, ws.k);
  split_heads(space, Tensor3<const T, ExecSpace>(ws.k), r.kh);
  attention::linear_forward(space, v, w.w_v, w.b_v, ws.v);
  split_heads(space, Tensor3<const T, ExecSpace>(ws.v), r.vh);

  if (packed) {
    packed_fused_forward<ExecSpace, T>(op, space, {r.qh, r.kh, r.vh, r.oh, r.lse}, fopts, *packed);
    merge_heads(space, Tensor4<const T, ExecSpace>(r.oh), r.a);
  } else if (s.algo == AttentionAlgo::fused) {
    // Checked above: mha_shape's checks imply fused_attention_forward's,
    // the mask's included (checked once per layer call).
    impl::fused_attention_forward<ExecSpace, T>(space, {r.qh, r.kh, r.vh, r.oh, r.lse, mask}, fopts,
                                                MaskCheck::done_by_caller);
    merge_heads(space, Tensor4<const T, ExecSpace>(r.oh), r.a);
  } else {
    const std::size_t g = s.heads / kv_heads_of(s);
    attention::batched_gemm(space, Op::none, Op::transpose, Op::none, T(1), grouped(r.qh, g), r.kh,
                            T(0), grouped(ws.scores, g));
    impl::softmax_forward<ExecSpace, T>(space, ws.scores, r.p, softmax_options(opts, s), mask,
                                        MaskCheck::done_by_caller);
    Tensor4<const T, ExecSpace> dropped = r.p;
    if (opts.dropout.p > 0) {
      attention::dropout_forward(space, r.p, ws.scores, opts.dropout);
      dropped = ws.scores;
    }
    attention::batched_gemm(space, Op::none, Op::none, Op::none, T(1), grouped(dropped, g), r.vh,
                            T(0), grouped(ws.oh, g));
    merge_heads(space, Tensor4<const T, ExecSpace>(ws.oh), r.a);
  }

  attention::linear_forward(space, r.a, w.w_o, w.b_o, out);
  if (validate::given(residual) || validate::given(mask.seq_q)) {
    output_rows(space, Tensor3<const T, ExecSpace>(out), residual, mask.seq_q, out);
  }
}

template <class ExecSpace, class T>
void mha_backward_data(const ExecSpace& space, const MhaBackwardData<T, ExecSpace>& a,
                       const MhaOptions& opts) {
  constexpr const char* op = "attention::mha_backward_data";
  const auto& w = a.weights;
  const auto& dout = a.dout;
  const auto &dq = a.dq, &dk = a.dk, &dv = a.dv, &dresidual = a.dresidual;
  const auto &reserve = a.reserve, &workspace = a.workspace;
  const auto& mask = a.mask;
  const auto& seqs = a.seqs;
  const MhaShape s =
      mha_shape(op, opts, mask, w, {"dq", "dk", "dv"}, Tensor3<const T, ExecSpace>(dq),
                Tensor3<const T, ExecSpace>(dk), Tensor3<const T, ExecSpace>(dv));
  const auto packed = layer_packing(op, space, s, seqs, mask);
  require_output_shape(op, "dout", dout, s);
  if (validate::given(dresidual)) validate::same_shape(op, "dresidual", dresidual, "dout", dout);
  const MhaReserve<T, ExecSpace> r(s, reserve.data());
  const MhaBackwardDataWorkspace<T, ExecSpace> ws(s, workspace.data());
  require_buffer(op, "reserve", reserve, r.size);
  require_buffer(op, "workspace", workspace, mha_buffer_sizes(s).workspace);
  const FusedAttentionOptions fopts = fused_options(opts, s);
  using validate::memory_of;
  validate::disjoint(
      op,
      {memory_of("dq", dq), memory_of("dk", dk), memory_of("dv", dv),
       memory_of("dresidual", dresidual), memory_of("reserve", reserve),
       memory_of("workspace", workspace)},
      {memory_of("dout", dout), memory_of("weights.w_q", w.w_q), memory_of("weights.w_k", w.w_k),
       memory_of("weights.w_v", w.w_v), memory_of("weights.w_o", w.w_o)});
  check_fused_plans<ExecSpace, T>(op, space, s, fopts, true);
  check_layer_finite(op, space, opts, w, std::pair("dout", dout));

  // G = dL/dout with the padded rows zeroed, kept for backward-weights.
  output_rows(space, dout, {}, mask.seq_q, r.dout);
  const Tensor3<const T, ExecSpace> g = r.dout;
  if (validate::given(dresidual)) Kokkos::deep_copy(space, dresidual, g);
  kdnn::impl::gemm(space, false, false, T(1), rows_of(g), w.w_o, T(0), rows_of(ws.da));
  split_heads(space, Tensor3<const T, ExecSpace>(ws.da), ws.doh);

  if (packed) {
    packed_fused_backward<ExecSpace, T>(op, space, fused_backward_args(r, ws, mask), fopts,
                                        *packed);
  } else if (s.algo == AttentionAlgo::fused) {
    // The probabilities recomputed from Q_h, K_h and the forward's lse;
    // every scratch tensor in the workspace.
    impl::fused_attention_backward<ExecSpace, T>(space, fused_backward_args(r, ws, mask), fopts,
                                                 MaskCheck::done_by_caller);
  } else {
    // dV_g = Σ_h∈g dropout(P_h)ᵀ·dA_h and dP_h = dropout⁻ᵀ(dA_h·V_gᵀ),
    // dropout's mask regenerated from its (seed, offset); each product on
    // a group's query heads stacked.
    const bool dropout = opts.dropout.p > 0;
    const std::size_t g = s.heads / kv_heads_of(s);
    Tensor4<const T, ExecSpace> dropped = r.p;
    if (dropout) {
      attention::dropout_forward(space, r.p, ws.sk1, opts.dropout);
      dropped = ws.sk1;
    }
    attention::batched_gemm(space, Op::transpose, Op::none, Op::none, T(1), grouped(dropped, g),
                            grouped(ws.doh, g), T(0), ws.dvh);
    attention::batched_gemm(space, Op::none, Op::transpose, Op::none, T(1), grouped(ws.doh, g),
                            r.vh, T(0), grouped(ws.sk2, g));
    Tensor4<T, ExecSpace> dp = ws.sk2, dscores = ws.sk1;
    if (dropout) {
      attention::dropout_backward(space, ws.sk2, ws.sk1, opts.dropout);
      dp = ws.sk1;
      dscores = ws.sk2;
    }
    impl::softmax_backward<ExecSpace, T>(space, r.p, dp, dscores, softmax_options(opts, s), mask,
                                         MaskCheck::done_by_caller);
    attention::batched_gemm(space, Op::none, Op::none, Op::none, T(1), grouped(dscores, g), r.kh,
                            T(0), grouped(ws.dqh, g));
    attention::batched_gemm(space, Op::transpose, Op::none, Op::none, T(1), grouped(dscores, g),
                            grouped(r.qh, g), T(0), ws.dkh);
  }

  merge_heads(space, Tensor4<const T, ExecSpace>(ws.dqh), r.dq);
  merge_heads(space, Tensor4<const T, ExecSpace>(ws.dkh), r.dk);
  merge_heads(space, Tensor4<const T, ExecSpace>(ws.dvh), r.dv);
  kdnn::impl::gemm(space, false, false, T(1), rows_of(r.dq), w.w_q, T(0), rows_of(dq));
  kdnn::impl::gemm(space, false, false, T(1), rows_of(r.dk), w.w_k, T(0), rows_of(dk));
  kdnn::impl::gemm(space, false, false, T(1), rows_of(r.dv), w.w_v, T(0), rows_of(dv));
}

template <class ExecSpace, class T>
void mha_backward_weights(const ExecSpace& space, const MhaBackwardWeights<T, ExecSpace>& a,
                          const MhaOptions& opts) {
  constexpr const char* op = "attention::mha_backward_weights";
  const auto& w = a.weights;
  const auto &q = a.q, &k = a.k, &v = a.v;
  const auto& grads = a.grads;
  const auto& reserve = a.reserve;
  const WgradMode mode = a.mode;
  validate_wgrad_mode(op, mode);
  const MhaShape s = mha_shape(op, opts, AttentionMask<ExecSpace>{}, w, {"q", "k", "v"}, q, k, v);
  check_layer_finite(op, space, opts, w, std::pair("q", q), std::pair("k", k), std::pair("v", v));
  validate::same_shape(op, "grads.w_q", grads.w_q, "weights.w_q", w.w_q);
  validate::same_shape(op, "grads.w_k", grads.w_k, "weights.w_k", w.w_k);
  validate::same_shape(op, "grads.w_v", grads.w_v, "weights.w_v", w.w_v);
  validate::same_shape(op, "grads.w_o", grads.w_o, "weights.w_o", w.w_o);
  const auto bias_grad = [&](const char* name, const char* bias, const auto& g, const auto& b) {
    if (!validate::given(g)) return;
    if (!validate::given(b)) fail(op, ": ", name, " given but ", bias, " is not (no such bias)");
    validate::same_shape(op, name, g, bias, b);
  };
  bias_grad("grads.b_q", "weights.b_q", grads.b_q, w.b_q);
  bias_grad("grads.b_k", "weights.b_k", grads.b_k, w.b_k);
  bias_grad("grads.b_v", "weights.b_v", grads.b_v, w.b_v);
  bias_grad("grads.b_o", "weights.b_o", grads.b_o, w.b_o);
  const MhaReserve<T, ExecSpace> r(s, reserve.data());
  require_buffer(op, "reserve", reserve, r.size);
  using validate::memory_of;
  validate::disjoint(
      op,
      {memory_of("grads.w_q", grads.w_q), memory_of("grads.w_k", grads.w_k),
       memory_of("grads.w_v", grads.w_v), memory_of("grads.w_o", grads.w_o),
       memory_of("grads.b_q", grads.b_q), memory_of("grads.b_k", grads.b_k),
       memory_of("grads.b_v", grads.b_v), memory_of("grads.b_o", grads.b_o)},
      {memory_of("q", q), memory_of("k", k), memory_of("v", v), memory_of("reserve", reserve),
       memory_of("weights.w_q", w.w_q), memory_of("weights.w_k", w.w_k),
       memory_of("weights.w_v", w.w_v), memory_of("weights.w_o", w.w_o),
       memory_of("weights.b_q", w.b_q), memory_of("weights.b_k", w.b_k),
       memory_of("weights.b_v", w.b_v), memory_of("weights.b_o", w.b_o)});

  const Tensor3<T, ExecSpace> none;
  attention::linear_backward(space, q, w.w_q, r.dq, none, grads.w_q, grads.b_q, mode);
  attention::linear_backward(space, k, w.w_k, r.dk, none, grads.w_k, grads.b_k, mode);
  attention::linear_backward(space, v, w.w_v, r.dv, none, grads.w_v, grads.b_v, mode);
  attention::linear_backward(space, r.a, w.w_o, r.dout, none, grads.w_o, grads.b_o, mode);
}

}  // namespace kdnn::attention::impl
