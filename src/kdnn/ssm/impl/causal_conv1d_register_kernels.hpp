// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The GPU form of the causal depthwise conv1d (causal_conv1d.hpp) for a
// compile-time width K: one thread per (batch entry, run of steps, channel),
// consecutive threads on consecutive channels when x is channel-last (every
// load and store of [B, L, C] tensors coalesced), else on consecutive runs
// of steps of a channel (a channel-first [B, C, L] x: each thread streams
// its run, and a warp's runs are one span). A thread slides a
// window of the last K inputs through registers along its run of steps: no
// scratch, no barrier, each input read once (plus K − 1 halo steps per run).
// The sums add their terms in the order of the tiled kernels
// (causal_conv1d_kernels.hpp): bias first, then k = 0 … K − 1.
#include <Kokkos_Core.hpp>

#include "kdnn/core/tensor.hpp"
#include "kdnn/ssm/impl/causal_conv1d_inputs.hpp"

namespace kdnn::ssm::impl {

/// What both register kernels share: the thread mapping and the window.
template <class ExecSpace, class T, int K>
struct ConvRuns : ConvInputs<ExecSpace, T> {
  using typename ConvInputs<ExecSpace, T>::Compute;
  int run = 64;  ///< steps per thread

  KOKKOS_INLINE_FUNCTION int runs() const { return (this->last - this->first + run - 1) / run; }
  /// Threads: B · runs · C.
  long long threads() const { return (long long)this->x.extent(0) * runs() * this->x.extent(2); }

  /// Thread `idx`'s batch entry b, channel c, steps [s0, s0 + n) and run index.
  struct Run {
    int b, c, s0, n, index;
  };
  KOKKOS_INLINE_FUNCTION Run run_of(long long idx) const {
    const int C = int(this->x.extent(2)), R = runs();
    int c, r, b;
    if (this->channels_inner) {
      c = int(idx % C);
      const long long rest = idx / C;
      r = int(rest % R), b = int(rest / R);
    } else {
      r = int(idx % R);
      const long long rest = idx / R;
      c = int(rest % C), b = int(rest / C);
    }
    const int s0 = this->first + r * run;
    return {b, c, s0, this->last - s0 < run ? this->last - s0 : run, r};
  }

  /// x̄[b, s, c]: the initial state (or 0) before step 0, x in [0, L), 0 after.
  KOKKOS_INLINE_FUNCTION Compute xbar(int b, int s, int c) const {
    if (s >= 0) return s < int(this->x.extent(1)) ? to_compute(this->x(b, s, c)) : Compute(0);
    return this->has_init && s >= -(K - 1) ? to_compute(this->init(b, s + K - 1, c)) : Compute(0);
  }

  /// The channel's weights and bias into registers.
  KOKKOS_INLINE_FUNCTION void load_weights(int c, Compute (&wk)[K], Compute& bc) const {
    for (int k = 0; k < K; ++k) wk[k] = this->w(c, k);
    bc = this->has_bias ? this->bias(c) : Compute(0);
  }

  /// kernel.steps<Seq>(run_of(idx)) with Seq = seq.active: the window of
  /// sequence ids is compiled in only for packed sequences.
  template <class Kernel>
  KOKKOS_FORCEINLINE_FUNCTION static void run_steps(const Kernel& kernel, long long idx) {
    if (kernel.seq.active) {
      kernel.template steps<true>(kernel.run_of(idx));
    } else {
      kernel.template steps<false>(kernel.run_of(idx));
    }
  }

  /// window[k] = window[k + 1], window[K − 1] = v.
  template <class V>
  KOKKOS_FORCEINLINE_FUNCTION static void push(V (&window)[K], V v) {
    for (int k = 0; k + 1 < K; ++k) window[k] = window[k + 1];
    window[K - 1] = v;
  }

  /// bias + Σ_k wk[k]·window[k], in order of k.
  KOKKOS_FORCEINLINE_FUNCTION static Compute correlate(const Compute (&wk)[K], Compute bc,
                                                       const Compute (&window)[K]) {
    Compute acc = bc;
    for (int k = 0; k < K; ++k) acc += wk[k] * window[k];
    return acc;
  }
  /// correlate() with the terms of steps outside the last step's sequence
  /// read as 0 (ids[k]: the sequence of window[k]), as a call per sequence
  /// reads the zeros before its first step.
  KOKKOS_FORCEINLINE_FUNCTION static Compute correlate(const Compute (&wk)[K], Compute bc,
                                                       const Compute (&window)[K],
                                                       const int (&ids)[K]) {
    Compute acc = bc;
    for (int k = 0; k < K; ++k) acc += wk[k] * (ids[k] == ids[K - 1] ? window[k] : Compute(0));
    return acc;
  }
};

/// y[b, t, c] for t in [first, last).
template <class ExecSpace, class T, int K>
struct ConvRegisterForward : ConvRuns<ExecSpace, T, K> {
  StridedTensor3<T, ExecSpace> y;

  KOKKOS_INLINE_FUNCTION void operator()(long long idx) const { this->run_steps(*this, idx); }

  /// The run's outputs; `Seq`: packed sequences, a window of their ids
  /// beside the window of inputs.
  template <bool Seq>
  KOKKOS_INLINE_FUNCTION void steps(const typename ConvRuns<ExecSpace, T, K>::Run& r) const {
    using Compute = compute_t<T>;
    Compute wk[K], bc, window[K];
    int ids[K] = {};  // (set before use where Seq; zeroed for the compilers' analysis)
    this->load_weights(r.c, wk, bc);
    for (int k = 0; k + 1 < K; ++k) {
      const int s = r.s0 - (K - 1) + k;
      window[k + 1] = this->xbar(r.b, s, r.c);
      if constexpr (Seq) ids[k + 1] = this->seq.of(r.b, s);
    }
    for (int i = 0; i < r.n; ++i) {
      const int t = r.s0 + i;
      this->push(window, to_compute(this->x(r.b, t, r.c)));
      Compute z;
      if constexpr (Seq) {
        this->push(ids, this->seq.of(r.b, t));
        z = this->correlate(wk, bc, window, ids);
      } else {
        z = this->correlate(wk, bc, window);
      }
      y(r.b, t, r.c) = from_compute<T>(this->silu ? z * sigmoid(z) : z);
    }
  }
};

/// The backward over steps s in [first, last) of x̄ (s < 0: the initial
/// state), as ConvBackwardKernel computes it: dz = dy·SiLU'(z) recomputed
/// from a window of x̄, dx̄[s] = Σ_k w[k]·dz[s+K−1−k] from a window of dz (+
/// dfinal for the last K−1 steps); with `params`, each thread's partial sums
/// Σ_t dz[t]·x̄[t−K+1+k] (dw) and Σ_t dz[t] (dbias) over its steps t into
/// partial[b·runs + run index, c·(K+1) + k] (k = K: dbias).
template <class ExecSpace, class T, int K>
struct ConvRegisterBackward : ConvRuns<ExecSpace, T, K> {
  StridedTensor3<const T, ExecSpace> dy;      ///< [B, L, C]
  StridedTensor3<const T, ExecSpace> dfinal;  ///< [B, K−1, C] or empty
  StridedTensor3<T, ExecSpace> dx;            ///< [B, L, C] (written for s ≥ 0)
  StridedTensor3<T, ExecSpace> dinit;         ///< [B, K−1, C] (written for s < 0)
  Matrix<compute_t<T>, ExecSpace> partial;    ///< [B·runs, C·(K+1)] when params
  bool has_dfinal = false, params = false;

  KOKKOS_INLINE_FUNCTION void operator()(long long idx) const { this->run_steps(*this, idx); }

  /// The run's gradients; `Seq`: packed sequences, ids[k] the sequence of
  /// step t − K + 1 + k (that of xw[k] and of dzw[k]), and every term
  /// between two steps of different sequences is 0.
  template <bool Seq>
  KOKKOS_INLINE_FUNCTION void steps(const typename ConvRuns<ExecSpace, T, K>::Run& r) const {
    using Compute = compute_t<T>;
    const int L = int(this->x.extent(1));
    Compute wk[K], bc, xw[K], dzw[K], pw[K + 1];
    int ids[K] = {};  // (set before use where Seq; zeroed for the compilers' analysis)
    const auto same = [&](int k, int j) { return !Seq || ids[k] == ids[j]; };
    this->load_weights(r.c, wk, bc);
    for (int k = 0; k < K; ++k) dzw[k] = Compute(0);
    for (int k = 0; k <= K; ++k) pw[k] = Compute(0);
    for (int k = 0; k + 1 < K; ++k) {
      const int s = r.s0 - (K - 1) + k;
      xw[k + 1] = this->xbar(r.b, s, r.c);
      if constexpr (Seq) ids[k + 1] = this->seq.of(r.b, s);
    }
    // Step t: x̄[t] enters the window, dz[t] is computed; from t = s0 + K − 1
    // on, the window of dz holds every term of dx̄[t − K + 1].
    for (int t = r.s0; t < r.s0 + r.n + K - 1; ++t) {
      this->push(xw, this->xbar(r.b, t, r.c));
      if constexpr (Seq) this->push(ids, this->seq.of(r.b, t));
      Compute dz = Compute(0);
      if (t >= 0 && t < L) {
        const Compute g = to_compute(dy(r.b, t, r.c));
        if (this->silu) {
          Compute z;
          if constexpr (Seq) {
            z = this->correlate(wk, bc, xw, ids);
          } else {
            z = this->correlate(wk, bc, xw);
          }
          const Compute sg = sigmoid(z);
          dz = g * (sg * (Compute(1) + z * (Compute(1) - sg)));
        } else {
          dz = g;
        }
      }
      if (params && t < r.s0 + r.n) {
        for (int k = 0; k < K; ++k) pw[k] += dz * (same(k, K - 1) ? xw[k] : Compute(0));
        pw[K] += dz;
      }
      this->push(dzw, dz);
      const int s = t - (K - 1);
      if (s < r.s0) continue;
      Compute acc = Compute(0);
      for (int k = 0; k < K; ++k) {
        acc += wk[k] * (same(0, K - 1 - k) ? dzw[K - 1 - k] : Compute(0));
      }
      const int fin = s - (L - (K - 1));  // index into the final state
      if (has_dfinal && fin >= 0 && (!Seq || this->seq.in_last_sequence(r.b, s))) {
        acc = acc + to_compute(dfinal(r.b, fin, r.c));
      }
      if (s < 0) {
        dinit(r.b, s + K - 1, r.c) = from_compute<T>(acc);
      } else {
        dx(r.b, s, r.c) = from_compute<T>(acc);
      }
    }
    if (params) {
      const int row = r.b * this->runs() + r.index;
      for (int k = 0; k <= K; ++k) partial(row, r.c * (K + 1) + k) = pw[k];
    }
  }
};

}  // namespace kdnn::ssm::impl
