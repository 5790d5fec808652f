// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// How the multi-head attention layer (mha.hpp) lays out its caller-owned
// buffers. Each layout is built from the layer's shape and a base pointer;
// with a null base it only counts, which is how mha_buffer_sizes answers, so
// the sizes and the views can never disagree. The shape's algorithm picks
// the layout: only the unfused one has [B, H, S, Sk] tensors.
#include <algorithm>
#include <cstddef>

#include "kdnn/attention/mha.hpp"
#include "kdnn/core/error.hpp"

namespace kdnn::attention::impl {

/// Requires `algo` (opts.algo, shape.algo, desc.algo) to be an AttentionAlgo.
inline void check_algo(const char* op, const char* name, AttentionAlgo algo) {
  if (algo != AttentionAlgo::fused && algo != AttentionAlgo::unfused) {
    fail(op, ": ", name, "=", int(algo),
         ", expected AttentionAlgo::fused or AttentionAlgo::unfused");
  }
}

/// Requires `kv_heads` (opts.kv_heads, shape.kv_heads, named `name`) to be 0
/// or a divisor of `heads` (named `heads_name`).
inline void check_kv_heads(const char* op, const char* name, long long kv_heads,
                           const char* heads_name, long long heads) {
  if (kv_heads < 0 || (kv_heads > 0 && heads % kv_heads != 0)) {
    fail(op, ": ", name, "=", kv_heads, ", expected a divisor of ", heads_name, "=", heads,
         " (or 0: ", heads_name, ")");
  }
}

/// Hkv, the key/value heads of a shape: shape.kv_heads, or H when it is 0.
inline std::size_t kv_heads_of(const MhaShape& s) { return s.kv_heads == 0 ? s.heads : s.kv_heads; }

/// Consecutive tensors cut from one buffer (or, with a null base, counted).
template <class T, class ExecSpace>
class Carver {
 public:
  explicit Carver(T* base) : base_(base) {}
  std::size_t used() const { return used_; }

  Tensor3<T, ExecSpace> take(std::size_t n0, std::size_t n1, std::size_t n2) {
    return Tensor3<T, ExecSpace>(next(n0 * n1 * n2), n0, n1, n2);
  }
  Tensor4<T, ExecSpace> take(std::size_t n0, std::size_t n1, std::size_t n2, std::size_t n3) {
    return Tensor4<T, ExecSpace>(next(n0 * n1 * n2 * n3), n0, n1, n2, n3);
  }
  /// A region of `count` elements for tensors that overlay one another.
  T* region(std::size_t count) { return next(count); }

 private:
  T* next(std::size_t count) {
    T* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += count;
    return p;
  }
  T* base_;
  std::size_t used_ = 0;
};

/// Kept from the forward to backward-weights: the per-head projections, what
/// the attention's backward needs (fused: the per-head outputs and their
/// rows' log-sum-exp; unfused: the probabilities) and the concatenated head
/// outputs (forward), and the projections' and the output's gradients
/// (backward-data, for backward-weights, which therefore needs neither dout
/// nor the mask). The views of the other algorithm are empty.
template <class T, class ExecSpace>
struct MhaReserve {
  Tensor4<T, ExecSpace> qh, kh, vh;  ///< [B, H, S, D], [B, Hkv, Sk, D], [B, Hkv, Sk, Dv]
  Tensor4<T, ExecSpace> oh;          ///< fused: A_h [B, H, S, Dv]
  Tensor3<T, ExecSpace> lse;         ///< fused: each query's log-sum-exp [B, H, S]
  Tensor4<T, ExecSpace> p;           ///< unfused: softmax probabilities [B, H, S, Sk]
  Tensor3<T, ExecSpace> a;           ///< heads side by side [B, S, H·Dv]
  /// dL/dQ [B, S, H·D], dL/dK [B, Sk, Hkv·D], dL/dV [B, Sk, Hkv·Dv]
  Tensor3<T, ExecSpace> dq, dk, dv;
  Tensor3<T, ExecSpace> dout;  ///< dL/dout, padded query rows zeroed [B, S, E_o]
  std::size_t size = 0;

  MhaReserve(const MhaShape& s, T* base) {
    Carver<T, ExecSpace> c(base);
    const std::size_t B = s.batch, H = s.heads, Hkv = kv_heads_of(s);
    qh = c.take(B, H, s.seq_q, s.head_dim);
    kh = c.take(B, Hkv, s.seq_k, s.head_dim);
    vh = c.take(B, Hkv, s.seq_k, s.v_head_dim);
    if (s.algo == AttentionAlgo::unfused) {
      p = c.take(B, H, s.seq_q, s.seq_k);
    } else {
      oh = c.take(B, H, s.seq_q, s.v_head_dim);
      lse = c.take(B, H, s.seq_q);
    }
    a = c.take(B, s.seq_q, H * s.v_head_dim);
    dq = c.take(B, s.seq_q, H * s.head_dim);
    dk = c.take(B, s.seq_k, Hkv * s.head_dim);
    dv = c.take(B, s.seq_k, Hkv * s.v_head_dim);
    dout = c.take(B, s.seq_q, s.o_size);
    size = c.used();
  }
};

/// The forward's scratch: the three projections and then (unfused) the
/// per-head outputs share one region (each is done with before the next);
/// unfused, the raw scores, later the dropped-out probabilities, another.
/// The fused path keeps its per-head outputs in the reserve.
template <class T, class ExecSpace>
struct MhaForwardWorkspace {
  Tensor3<T, ExecSpace> q, k, v;  ///< projections [B, S, H·D], [B, Sk, Hkv·D], [B, Sk, Hkv·Dv]
  Tensor4<T, ExecSpace> oh;       ///< unfused: P_h·V_h [B, H, S, Dv]
  Tensor4<T, ExecSpace> scores;   ///< unfused: Q_h K_hᵀ, then dropout(P) [B, H, S, Sk]
  std::size_t size = 0;

  MhaForwardWorkspace(const MhaShape& s, T* base) {
    Carver<T, ExecSpace> c(base);
    const std::size_t B = s.batch, H = s.heads, Hkv = kv_heads_of(s), S = s.seq_q, Sk = s.seq_k;
    const bool unfused = s.algo == AttentionAlgo::unfused;
    T* shared =
        c.region(std::max({B * S * H * s.head_dim, B * Sk * Hkv * s.head_dim,
                           B * Sk * Hkv * s.v_head_dim, unfused ? B * H * S * s.v_head_dim : 0}));
    q = Tensor3<T, ExecSpace>(shared, B, S, H * s.head_dim);
    k = Tensor3<T, ExecSpace>(shared, B, Sk, Hkv * s.head_dim);
    v = Tensor3<T, ExecSpace>(shared, B, Sk, Hkv * s.v_head_dim);
    if (unfused) {
      oh = Tensor4<T, ExecSpace>(shared, B, H, S, s.v_head_dim);
      scores = c.take(B, H, S, Sk);
    }
    size = c.used();
  }
};

/// Backward-data's scratch, one tensor per intermediate gradient.
template <class T, class ExecSpace>
struct MhaBackwardDataWorkspace {
  Tensor3<T, ExecSpace> da;        ///< dL/dA [B, S, H·Dv]
  Tensor4<T, ExecSpace> doh;       ///< dL/dA_h [B, H, S, Dv]
  Tensor4<T, ExecSpace> sk1, sk2;  ///< unfused: two [B, H, S, Sk]: dropout(P), dL/dP, dL/dscores
  Tensor4<T, ExecSpace> dqh, dkh, dvh;  ///< per-head gradients of Q, K, V (Hkv heads for K, V)
  Tensor3<T, ExecSpace> delta;          ///< fused: the rows' dO·O [B, H, S]
  /// fused with Hkv < H: the query heads' shares of dK and dV [B, H, Sk, ·]
  Tensor4<T, ExecSpace> dk_shares, dv_shares;
  std::size_t size = 0;

  MhaBackwardDataWorkspace(const MhaShape& s, T* base) {
    Carver<T, ExecSpace> c(base);
    const std::size_t B = s.batch, H = s.heads, Hkv = kv_heads_of(s), S = s.seq_q, Sk = s.seq_k;
    da = c.take(B, S, H * s.v_head_dim);
    doh = c.take(B, H, S, s.v_head_dim);
    if (s.algo == AttentionAlgo::unfused) {
      sk1 = c.take(B, H, S, Sk);
      sk2 = c.take(B, H, S, Sk);
    }
    dqh = c.take(B, H, S, s.head_dim);
    dkh = c.take(B, Hkv, Sk, s.head_dim);
    dvh = c.take(B, Hkv, Sk, s.v_head_dim);
    if (s.algo == AttentionAlgo::fused) {
      delta = c.take(B, H, S);
      if (Hkv < H) {
        dk_shares = c.take(B, H, Sk, s.head_dim);
        dv_shares = c.take(B, H, Sk, s.v_head_dim);
      }
    }
    size = c.used();
  }
};

}  // namespace kdnn::attention::impl

namespace kdnn::attention {

inline MhaBufferSizes mha_buffer_sizes(const MhaShape& shape) {
  constexpr const char* op = "attention::mha_buffer_sizes";
  impl::check_algo(op, "shape.algo", shape.algo);
  impl::check_kv_heads(op, "shape.kv_heads", (long long)shape.kv_heads, "shape.heads",
                       (long long)shape.heads);
  // The counts do not depend on the scalar type or the space.
  using T = double;
  using Space = Kokkos::DefaultHostExecutionSpace;
  MhaBufferSizes sizes;
  sizes.reserve = impl::MhaReserve<T, Space>(shape, nullptr).size;
  sizes.workspace = std::max(impl::MhaForwardWorkspace<T, Space>(shape, nullptr).size,
                             impl::MhaBackwardDataWorkspace<T, Space>(shape, nullptr).size);
  return sizes;
}

}  // namespace kdnn::attention
