// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The team kernels of the causal depthwise conv1d (causal_conv1d.hpp). A team
// owns a tile of `tt` consecutive steps of one batch entry and `ct` channels;
// its scratch holds the steps of x̄ (x preceded by the initial state) the tile
// reads, w transposed ([K, ct], so that the channels are the contiguous,
// vectorised index) and the bias. Team threads split the steps, vector lanes
// the channels; every channel loop is a kdnn::impl::vector_for without
// branches on the channel, so that it vectorises on a host (with `Unit`, channels contiguous in
// every tensor; otherwise each step's channels are read through their stride, channel-first
// tensors included). A launch covers a range of steps
// [first, last), so that a context-parallel caller can compute the steps that need no halo while
// the halo is in flight.
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/exp_vectorisable.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/impl/team_work.hpp"
#include "kdnn/core/impl/vector_for.hpp"
#include "kdnn/core/tensor.hpp"
#include "kdnn/ssm/impl/causal_conv1d_inputs.hpp"

namespace kdnn::ssm::impl {

/// What both tiled conv kernels share: the tiling and the scratch loads.
template <class ExecSpace, class T, bool Unit>
struct ConvTiles : ConvInputs<ExecSpace, T> {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using typename ConvInputs<ExecSpace, T>::Compute;
  static constexpr bool host = kdnn::impl::BackendTraits<ExecSpace>::is_host;
  /// The most channels of a tile on a host (conv_tiling): the length of a
  /// host thread's row of sums in correlate().
  static constexpr int host_max_ct = 256;
  using ConvInputs<ExecSpace, T>::x;
  using ConvInputs<ExecSpace, T>::w;
  using ConvInputs<ExecSpace, T>::bias;
  using ConvInputs<ExecSpace, T>::init;
  using ConvInputs<ExecSpace, T>::has_bias;
  using ConvInputs<ExecSpace, T>::has_init;
  using ConvInputs<ExecSpace, T>::first;
  using ConvInputs<ExecSpace, T>::last;

  int tt = 1, ct = 1;         ///< steps and channels per team
  kdnn::impl::TeamWork work;  ///< set by the launch

  KOKKOS_INLINE_FUNCTION int time_tiles() const { return (last - first + tt - 1) / tt; }
  KOKKOS_INLINE_FUNCTION int channel_tiles() const { return (int(x.extent(2)) + ct - 1) / ct; }

  /// Work item `item`'s tile: batch entry b, steps [s0, s0 + n), channels [c0, c0 + nc).
  struct Tile {
    int b, s0, n, c0, nc;
  };
  KOKKOS_INLINE_FUNCTION Tile tile(int item) const {
    const int per_b = time_tiles() * channel_tiles();
    const int b = item / per_b, rest = item % per_b;
    const int ti = rest / channel_tiles(), ci = rest % channel_tiles();
    const int s0 = first + ti * tt, c0 = ci * ct;
    const int C = int(x.extent(2));
    return {b, s0, last - s0 < tt ? last - s0 : tt, c0, C - c0 < ct ? C - c0 : ct};
  }

  /// xs[j·ct + c] = x̄[b, s_first + j, c0 + c] for j < rows: the initial state
  /// (or 0) before step 0, x up to L, 0 after it. Pad channels are 0. With
  /// packed sequences, ids[j] = seq.of(b, s_first + j).
  KOKKOS_INLINE_FUNCTION void load_steps(const Member& team, const Tile& t, Compute* xs, int* ids,
                                         int s_first, int rows) const {
    const int L = int(x.extent(1)), K = int(w.extent(1));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int j) {
      const int s = s_first + j;
      if (this->seq.active)
        Kokkos::single(Kokkos::PerThread(team), [&]() { ids[j] = this->seq.of(t.b, s); });
      Compute* dst = xs + j * ct;
      if (s >= 0 && s < L) {
        const auto src = channel_row<Unit>(x, t.b, s, t.c0);
        vec(team, t.nc, [&](int c) { dst[c] = to_compute(src[c]); });
      } else if (s < 0 && s >= -(K - 1) && has_init) {
        const auto src = channel_row<Unit>(init, t.b, s + K - 1, t.c0);
        vec(team, t.nc, [&](int c) { dst[c] = to_compute(src[c]); });
      } else {
        vec(team, t.nc, [&](int c) { dst[c] = 0; });
      }
      vec(team, ct - t.nc, [&](int c) { dst[t.nc + c] = 0; });
    });
  }

  /// ws[k·ct + c] = w[c0 + c, k], bs[c] = bias[c0 + c] (0 for pad channels).
  KOKKOS_INLINE_FUNCTION void load_weights(const Member& team, const Tile& t, Compute* ws,
                                           Compute* bs) const {
    const int K = int(w.extent(1));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, K + 1), [&](int k) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, ct), [&](int c) {
        const bool live = c < t.nc;
        if (k < K) {
          ws[k * ct + c] = live ? w(t.c0 + c, k) : Compute(0);
        } else {
          bs[c] = live && has_bias ? bias(t.c0 + c) : Compute(0);
        }
      });
    });
  }

  template <class F>
  KOKKOS_FORCEINLINE_FUNCTION static void vec(const Member& team, int n, const F& f) {
    kdnn::impl::vector_for<ExecSpace>(team, n, f);
  }

  /// For each channel c < nc: epilogue(c, first(c) + Σ_k ws[k·ct + c]·v[(j + dir·k)·ct + c]),
  /// the terms added in order of k on every backend; a term whose row
  /// `visible(k)` is false (packed sequences: a step of another sequence)
  /// adds w·0, as a call per sequence adds the zeros before its first step.
  /// On a host k is the outer loop, so that each pass is a contiguous vector
  /// loop over the channels into a row of sums; on a GPU each lane keeps its
  /// sum in a register.
  template <class First, class Epilogue, class Visible>
  KOKKOS_FORCEINLINE_FUNCTION void correlate(const Member& team, const Compute* ws,
                                             const Compute* v, int j, int dir, int nc, int K,
                                             const First& first, const Epilogue& epilogue,
                                             const Visible& visible) const {
    if constexpr (host) {
      Compute sum[host_max_ct];
      vec(team, nc, [&](int c) { sum[c] = first(c); });
      for (int k = 0; k < K; ++k) {
        const Compute* wk = ws + k * ct;
        const Compute* vk = v + (j + dir * k) * ct;
        if (visible(k)) {
          vec(team, nc, [&](int c) { sum[c] += wk[c] * vk[c]; });
        } else {
          vec(team, nc, [&](int c) { sum[c] += wk[c] * Compute(0); });
        }
      }
      vec(team, nc, [&](int c) { epilogue(c, sum[c]); });
    } else {
      vec(team, nc, [&](int c) {
        Compute acc = first(c);
        for (int k = 0; k < K; ++k) {
          acc += ws[k * ct + c] * (visible(k) ? v[(j + dir * k) * ct + c] : Compute(0));
        }
        epilogue(c, acc);
      });
    }
  }

  /// Whether rows a and b of a tile's ids hold steps of one sequence
  /// (always, without packed sequences).
  KOKKOS_FORCEINLINE_FUNCTION bool same_sequence(const int* ids, int a, int b) const {
    return !this->seq.active || ids[a] == ids[b];
  }
};

/// y[b, t, c] for t in [first, last): one team per tile.
template <class ExecSpace, class T, bool Unit>
struct ConvForwardKernel : ConvTiles<ExecSpace, T, Unit> {
  using Base = ConvTiles<ExecSpace, T, Unit>;
  using typename Base::Compute;
  using typename Base::Member;
  StridedTensor3<T, ExecSpace> y;

  struct Work {
    Compute *xs, *ws, *bs;
    int* ids;
  };
  /// x̄ at the tile's steps and the K−1 before them, w transposed, bias, the
  /// steps' sequences.
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int tt, int ct, int K) {
    Work w;
    w.xs = s.take<Compute>(std::size_t(tt + K - 1) * ct);
    w.ws = s.take<Compute>(std::size_t(K) * ct);
    w.bs = s.take<Compute>(ct);
    w.ids = s.take<int>(tt + K - 1);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    this->work.for_each(team, [&](int item, void* scratch) { one_tile(team, item, scratch); });
  }

  /// Work item `item` (a tile), in the team's scratch.
  KOKKOS_INLINE_FUNCTION void one_tile(const Member& team, int item, void* scratch) const {
    const int K = int(this->w.extent(1));
    const auto t = this->tile(item);
    kdnn::impl::ScratchCarver carver(scratch);
    const Work s = carve(carver, this->tt, this->ct, K);
    this->load_steps(team, t, s.xs, s.ids, t.s0 - (K - 1), t.n + K - 1);
    this->load_weights(team, t, s.ws, s.bs);
    team.team_barrier();
    const auto bias = [&](int c) { return s.bs[c]; };
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, t.n), [&](int r) {
      const auto out = channel_row<Unit>(y, t.b, t.s0 + r, t.c0);
      // Row r + K − 1 of xs is the output's step.
      const auto visible = [&](int k) { return this->same_sequence(s.ids, r + k, r + K - 1); };
      if (this->silu) {
        this->correlate(
            team, s.ws, s.xs, r, 1, t.nc, K, bias,
            [&](int c, Compute z) { out[c] = from_compute<T>(z * sigmoid(z)); }, visible);
      } else {
        this->correlate(
            team, s.ws, s.xs, r, 1, t.nc, K, bias,
            [&](int c, Compute z) { out[c] = from_compute<T>(z); }, visible);
      }
    });
  }
};

/// The backward over steps s in [first, last) of x̄ (s < 0: the initial
/// state): dx̄[s] = Σ_k w[k]·dz[s+K−1−k] (+ dfinal[s−L+K−1] for the last K−1
/// steps), dz = dy·SiLU'(z) recomputed from x̄. With `params`, each team also
/// writes its partial sums Σ_t dz[t]·x̄[t−K+1+k] (dw) and Σ_t dz[t] (dbias)
/// over its steps t into partial[tile, c·(K+1) + k] (k = K: dbias).
template <class ExecSpace, class T, bool Unit>
struct ConvBackwardKernel : ConvTiles<ExecSpace, T, Unit> {
  using Base = ConvTiles<ExecSpace, T, Unit>;
  using typename Base::Compute;
  using typename Base::Member;
  StridedTensor3<const T, ExecSpace> dy;      ///< [B, L, C]
  StridedTensor3<const T, ExecSpace> dfinal;  ///< [B, K−1, C] or empty
  StridedTensor3<T, ExecSpace> dx;            ///< [B, L, C] (written for s ≥ 0)
  StridedTensor3<T, ExecSpace> dinit;         ///< [B, K−1, C] (written for s < 0)
  Matrix<Compute, ExecSpace> partial;         ///< [B·time_tiles, C·(K+1)] when params
  bool has_dfinal = false, params = false;

  struct Work {
    Compute *xs, *dz, *ws, *bs, *pw;
    int* ids;
  };
  /// x̄ at steps [s0−K+1, s0+n+K−1), dz at [s0, s0+n+K−1), w, bias, the
  /// partial parameter sums [K+1, ct], and the sequences of xs's steps.
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int tt, int ct, int K) {
    Work w;
    w.xs = s.take<Compute>(std::size_t(tt + 2 * K - 2) * ct);
    w.dz = s.take<Compute>(std::size_t(tt + K - 1) * ct);
    w.ws = s.take<Compute>(std::size_t(K) * ct);
    w.bs = s.take<Compute>(ct);
    w.pw = s.take<Compute>(std::size_t(K + 1) * ct);
    w.ids = s.take<int>(tt + 2 * K - 2);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    this->work.for_each(team, [&](int item, void* scratch) { one_tile(team, item, scratch); });
  }

  /// Work item `item` (a tile), in the team's scratch.
  KOKKOS_INLINE_FUNCTION void one_tile(const Member& team, int item, void* scratch) const {
    const int L = int(this->x.extent(1)), K = int(this->w.extent(1)), ct = this->ct;
    const auto t = this->tile(item);
    kdnn::impl::ScratchCarver carver(scratch);
    const Work s = carve(carver, this->tt, ct, K);
    this->load_steps(team, t, s.xs, s.ids, t.s0 - (K - 1), t.n + 2 * K - 2);
    this->load_weights(team, t, s.ws, s.bs);
    team.team_barrier();

    // dz[i] at step t = s0 + i (0 outside [0, L) and in pad channels). Row j
    // of xs (and of ids) is step s0 − K + 1 + j: dz[i]'s step is row i + K − 1.
    const auto bias = [&](int c) { return s.bs[c]; };
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, t.n + K - 1), [&](int i) {
      const int step = t.s0 + i;
      const int live = step >= 0 && step < L ? t.nc : 0;  // channels with a gradient
      Compute* g = s.dz + i * ct;
      if (live > 0) {
        const auto dyr = channel_row<Unit>(dy, t.b, step, t.c0);
        if (this->silu) {
          const auto visible = [&](int k) { return this->same_sequence(s.ids, i + k, i + K - 1); };
          this->correlate(
              team, s.ws, s.xs, i, 1, live, K, bias,
              [&](int c, Compute z) {
                const Compute sg = sigmoid(z);
                g[c] = to_compute(dyr[c]) * (sg * (Compute(1) + z * (Compute(1) - sg)));
              },
              visible);
        } else {
          this->vec(team, live, [&](int c) { g[c] = to_compute(dyr[c]); });
        }
      }
      this->vec(team, ct - live, [&](int c) { g[live + c] = 0; });
    });
    team.team_barrier();

    // dx̄[s] = Σ_k w[k]·dz[s + K − 1 − k] (+ the final state's gradient);
    // dx̄[s]'s step is row r + K − 1 of ids, dz[r + K − 1 − k]'s row r + 2K − 2 − k.
    const auto zero = [](int) { return Compute(0); };
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, t.n), [&](int r) {
      const int step = t.s0 + r;
      const int fin = step - (L - (K - 1));  // index into the final state
      const auto out = step < 0 ? channel_row<Unit>(dinit, t.b, step + K - 1, t.c0)
                                : channel_row<Unit>(dx, t.b, step, t.c0);
      const auto visible = [&](int k) {
        return this->same_sequence(s.ids, r + 2 * K - 2 - k, r + K - 1);
      };
      const bool in_final = this->has_dfinal && fin >= 0 && this->seq.in_last_sequence(t.b, step);
      if (in_final) {
        const auto df = channel_row<Unit>(dfinal, t.b, fin, t.c0);
        this->correlate(
            team, s.ws, s.dz, r + K - 1, -1, t.nc, K, zero,
            [&](int c, Compute acc) { out[c] = from_compute<T>(acc + to_compute(df[c])); },
            visible);
      } else {
        this->correlate(
            team, s.ws, s.dz, r + K - 1, -1, t.nc, K, zero,
            [&](int c, Compute acc) { out[c] = from_compute<T>(acc); }, visible);
      }
    });
    if (!params) return;

    // Partial parameter sums over the tile's steps (dz is 0 outside [0, L)).
    const int row = t.b * this->time_tiles() + (t.s0 - this->first) / this->tt;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, K + 1), [&](int k) {
      Compute* acc = s.pw + k * ct;
      this->vec(team, ct, [&](int c) { acc[c] = 0; });
      if (k < K) {
        for (int r = 0; r < t.n; ++r) {
          const Compute* g = s.dz + r * ct;
          const Compute* v = s.xs + (k + r) * ct;
          if (this->same_sequence(s.ids, k + r, r + K - 1)) {
            this->vec(team, ct, [&](int c) { acc[c] += g[c] * v[c]; });
          } else {
            this->vec(team, ct, [&](int c) { acc[c] += g[c] * Compute(0); });
          }
        }
      } else {
        for (int r = 0; r < t.n; ++r) {
          const Compute* g = s.dz + r * ct;
          this->vec(team, ct, [&](int c) { acc[c] += g[c]; });
        }
      }
      this->vec(team, t.nc, [&](int c) { partial(row, (t.c0 + c) * (K + 1) + k) = acc[c]; });
    });
  }
};

}  // namespace kdnn::ssm::impl
