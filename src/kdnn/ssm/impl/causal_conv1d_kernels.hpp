#pragma once
// The team kernels of the causal depthwise conv1d (causal_conv1d.hpp). A team
// owns a tile of `tt` consecutive steps of one batch entry and `ct` channels;
// its scratch holds the steps of x̄ (x preceded by the initial state) the tile
// reads, w transposed ([K, ct], so that the channels are the contiguous,
// vectorised index) and the bias. Team threads split the steps, vector lanes
// the channels. A launch covers a range of steps [first, last), so that a
// context-parallel caller can compute the steps that need no halo while the
// halo is in flight.
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/impl/exp_vectorisable.hpp"
#include "kdnn/core/impl/scratch_layout.hpp"
#include "kdnn/core/tensor.hpp"

namespace kdnn::ssm::impl {

/// SiLU(z) = z·σ(z), and its derivative σ(z)·(1 + z·(1 − σ(z))).
template <class T>
KOKKOS_FORCEINLINE_FUNCTION T sigmoid(T z) {
  return T(1) / (T(1) + kdnn::impl::exp_vectorisable(-z));
}

/// What both conv kernels share: the arguments, the tiling and the scratch
/// loads.
template <class ExecSpace, class T>
struct ConvTiles {
  using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;

  Tensor3<const T, ExecSpace> x;     ///< [B, L, C]
  Matrix<const T, ExecSpace> w;      ///< [C, K]
  Vector<const T, ExecSpace> bias;   ///< [C] or empty
  Tensor3<const T, ExecSpace> init;  ///< [B, K−1, C] or empty (zeros)
  bool has_bias = false, has_init = false, silu = true;
  int first = 0, last = 0;  ///< the launch's steps [first, last)
  int tt = 1, ct = 1;       ///< steps and channels per team
  int level = 0;
  std::size_t scratch_bytes = 0;

  KOKKOS_INLINE_FUNCTION int time_tiles() const { return (last - first + tt - 1) / tt; }
  KOKKOS_INLINE_FUNCTION int channel_tiles() const { return (int(x.extent(2)) + ct - 1) / ct; }

  /// The team's tile: batch entry b, steps [s0, s0 + n), channels [c0, c0 + nc).
  struct Tile {
    int b, s0, n, c0, nc;
  };
  KOKKOS_INLINE_FUNCTION Tile tile(const Member& team) const {
    const int per_b = time_tiles() * channel_tiles();
    const int b = team.league_rank() / per_b, rest = team.league_rank() % per_b;
    const int ti = rest / channel_tiles(), ci = rest % channel_tiles();
    const int s0 = first + ti * tt, c0 = ci * ct;
    const int C = int(x.extent(2));
    return {b, s0, last - s0 < tt ? last - s0 : tt, c0, C - c0 < ct ? C - c0 : ct};
  }

  /// xs[j·ct + c] = x̄[b, s_first + j, c0 + c] for j < rows: the initial state
  /// (or 0) before step 0, x up to L, 0 after it. Pad channels are 0.
  KOKKOS_INLINE_FUNCTION void load_steps(const Member& team, const Tile& t, T* xs, int s_first,
                                         int rows) const {
    const int L = int(x.extent(1)), K = int(w.extent(1));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows), [&](int j) {
      const int s = s_first + j;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, ct), [&](int c) {
        T v = 0;
        if (c < t.nc) {
          if (s >= 0 && s < L) {
            v = x(t.b, s, t.c0 + c);
          } else if (s < 0 && s >= -(K - 1) && has_init) {
            v = init(t.b, s + K - 1, t.c0 + c);
          }
        }
        xs[j * ct + c] = v;
      });
    });
  }

  /// ws[k·ct + c] = w[c0 + c, k], bs[c] = bias[c0 + c] (0 for pad channels).
  KOKKOS_INLINE_FUNCTION void load_weights(const Member& team, const Tile& t, T* ws, T* bs) const {
    const int K = int(w.extent(1));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, K + 1), [&](int k) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, ct), [&](int c) {
        const bool live = c < t.nc;
        if (k < K) {
          ws[k * ct + c] = live ? w(t.c0 + c, k) : T(0);
        } else {
          bs[c] = live && has_bias ? bias(t.c0 + c) : T(0);
        }
      });
    });
  }

  /// z at one step from the K steps of xs starting at row j.
  KOKKOS_FORCEINLINE_FUNCTION T conv_at(const T* xs, const T* ws, const T* bs, int j, int c,
                                        int K) const {
    T acc = bs[c];
    for (int k = 0; k < K; ++k) acc += ws[k * ct + c] * xs[(j + k) * ct + c];
    return acc;
  }
};

/// y[b, t, c] for t in [first, last): one team per tile.
template <class ExecSpace, class T>
struct ConvForwardKernel : ConvTiles<ExecSpace, T> {
  using Base = ConvTiles<ExecSpace, T>;
  using typename Base::Member;
  Tensor3<T, ExecSpace> y;

  struct Work {
    T *xs, *ws, *bs;
  };
  /// x̄ at the tile's steps and the K−1 before them, w transposed, bias.
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int tt, int ct, int K) {
    Work w;
    w.xs = s.take<T>(std::size_t(tt + K - 1) * ct);
    w.ws = s.take<T>(std::size_t(K) * ct);
    w.bs = s.take<T>(ct);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const int K = int(this->w.extent(1));
    const auto t = this->tile(team);
    kdnn::impl::ScratchCarver carver(
        kdnn::impl::team_scratch_base(team, this->level, this->scratch_bytes));
    const Work s = carve(carver, this->tt, this->ct, K);
    this->load_steps(team, t, s.xs, t.s0 - (K - 1), t.n + K - 1);
    this->load_weights(team, t, s.ws, s.bs);
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, t.n), [&](int r) {
      T* out = &y(t.b, t.s0 + r, t.c0);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, t.nc), [&](int c) {
        const T z = this->conv_at(s.xs, s.ws, s.bs, r, c, K);
        out[c] = this->silu ? z * sigmoid(z) : z;
      });
    });
  }
};

/// The backward over steps s in [first, last) of x̄ (s < 0: the initial
/// state): dx̄[s] = Σ_k w[k]·dz[s+K−1−k] (+ dfinal[s−L+K−1] for the last K−1
/// steps), dz = dy·SiLU'(z) recomputed from x̄. With `params`, each team also
/// writes its partial sums Σ_t dz[t]·x̄[t−K+1+k] (dw) and Σ_t dz[t] (dbias)
/// over its steps t into partial[tile, c·(K+1) + k] (k = K: dbias).
template <class ExecSpace, class T>
struct ConvBackwardKernel : ConvTiles<ExecSpace, T> {
  using Base = ConvTiles<ExecSpace, T>;
  using typename Base::Member;
  Tensor3<const T, ExecSpace> dy;      ///< [B, L, C]
  Tensor3<const T, ExecSpace> dfinal;  ///< [B, K−1, C] or empty
  Tensor3<T, ExecSpace> dx;            ///< [B, L, C] (written for s ≥ 0)
  Tensor3<T, ExecSpace> dinit;         ///< [B, K−1, C] (written for s < 0)
  Matrix<T, ExecSpace> partial;        ///< [B·time_tiles, C·(K+1)] when params
  bool has_dfinal = false, params = false;

  struct Work {
    T *xs, *dz, *ws, *bs, *pw;
  };
  /// x̄ at steps [s0−K+1, s0+n+K−1), dz at [s0, s0+n+K−1), w, bias, and the
  /// partial parameter sums [K+1, ct].
  KOKKOS_INLINE_FUNCTION static Work carve(kdnn::impl::ScratchCarver& s, int tt, int ct, int K) {
    Work w;
    w.xs = s.take<T>(std::size_t(tt + 2 * K - 2) * ct);
    w.dz = s.take<T>(std::size_t(tt + K - 1) * ct);
    w.ws = s.take<T>(std::size_t(K) * ct);
    w.bs = s.take<T>(ct);
    w.pw = s.take<T>(std::size_t(K + 1) * ct);
    return w;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const int L = int(this->x.extent(1)), K = int(this->w.extent(1)), ct = this->ct;
    const auto t = this->tile(team);
    kdnn::impl::ScratchCarver carver(
        kdnn::impl::team_scratch_base(team, this->level, this->scratch_bytes));
    const Work s = carve(carver, this->tt, ct, K);
    this->load_steps(team, t, s.xs, t.s0 - (K - 1), t.n + 2 * K - 2);
    this->load_weights(team, t, s.ws, s.bs);
    team.team_barrier();

    // dz[i] at step t = s0 + i (0 outside [0, L)).
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, t.n + K - 1), [&](int i) {
      const int step = t.s0 + i;
      const bool live = step >= 0 && step < L;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, ct), [&](int c) {
        T g = 0;
        if (live && c < t.nc) {
          g = dy(t.b, step, t.c0 + c);
          if (this->silu) {
            const T z = this->conv_at(s.xs, s.ws, s.bs, i, c, K);
            const T sg = sigmoid(z);
            g *= sg * (T(1) + z * (T(1) - sg));
          }
        }
        s.dz[i * ct + c] = g;
      });
    });
    team.team_barrier();

    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, t.n), [&](int r) {
      const int step = t.s0 + r;
      const int fin = step - (L - (K - 1));  // index into the final state
      T* out = step < 0 ? &dinit(t.b, step + K - 1, t.c0) : &dx(t.b, step, t.c0);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, t.nc), [&](int c) {
        T acc = 0;
        for (int k = 0; k < K; ++k) acc += s.ws[k * ct + c] * s.dz[(r + K - 1 - k) * ct + c];
        if (this->has_dfinal && fin >= 0) acc += dfinal(t.b, fin, t.c0 + c);
        out[c] = acc;
      });
    });
    if (!params) return;

    // Partial parameter sums over the tile's steps (dz is 0 outside [0, L)).
    const int row = t.b * this->time_tiles() + (t.s0 - this->first) / this->tt;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, K + 1), [&](int k) {
      T* acc = s.pw + k * ct;
      const T* in = k < K ? s.xs + k * ct : nullptr;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, ct), [&](int c) { acc[c] = 0; });
      for (int r = 0; r < t.n; ++r) {
        const T* g = s.dz + r * ct;
        if (in) {
          const T* v = in + r * ct;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, ct),
                               [&](int c) { acc[c] += g[c] * v[c]; });
        } else {
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, ct), [&](int c) { acc[c] += g[c]; });
        }
      }
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, t.nc),
                           [&](int c) { partial(row, (t.c0 + c) * (K + 1) + k) = acc[c]; });
    });
  }
};

}  // namespace kdnn::ssm::impl
