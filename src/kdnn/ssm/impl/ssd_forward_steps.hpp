// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The forward's steps of the chunked SSD and what every step shares (the
// chunk launches, the state passes); see ssd_steps.hpp for the pipeline.
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <string>
#include <type_traits>

#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/block_sums.hpp"
#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/team_plan.hpp"
#include "kdnn/core/impl/unroll.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/ssm/impl/ssd_chunk_output_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_output_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_output_mma_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_scores_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_scores_mma_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_state_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_state_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_state_mma_kernel.hpp"
#include "kdnn/ssm/impl/ssd_forms.hpp"
#include "kdnn/ssm/impl/ssd_sequence_states_kernel.hpp"
#include "kdnn/ssm/impl/ssd_skip.hpp"
#include "kdnn/ssm/ssd.hpp"

namespace kdnn::ssm::impl {

template <class T, class ExecSpace>
using ChunkDecays = Kokkos::View<T***, Kokkos::LayoutRight, typename ExecSpace::memory_space>;

/// The inputs every chunk kernel reads, its sizes and its launch request.
template <class ExecSpace, class T, class Kernel, class Args>
void set_ssd_inputs(Kernel& k, const Args& a, const SsdOptions& opts) {
  k.x = a.x;
  k.dt = a.dt;
  k.A = a.A;
  k.Bm = a.B;
  k.Cm = a.C;
  k.seq = a.seq_idx;
  k.has_seq = validate::given(a.seq_idx) && a.x.extent(1) > 0;
  k.set_sizes(opts.chunk);
  k.launch = opts.launch;
}

/// Plans and launches a chunk kernel (one team per (b, h, chunk)) whose
/// scratch layout is `carve(ScratchCarver&)`.
template <class ExecSpace, class Kernel, class Carve>
void launch_chunks(const char* op, const ExecSpace& space, Kernel kernel, const Carve& carve,
                   const char* label) {
  if (kernel.league() == 0) return;
  const std::size_t bytes = kdnn::impl::layout_bytes(carve);
  constexpr bool host = kdnn::impl::BackendTraits<ExecSpace>::is_host;
  const auto plan = kdnn::impl::plan_team<ExecSpace, Kernel>(
      op, space, kernel.league(), kernel.launch, host ? 1 : 32, bytes,
      "a chunk of Q=" + std::to_string(kernel.Q) + " steps with P=" + std::to_string(kernel.P()) +
          ", N=" + std::to_string(kernel.N()));
  plan.launch(label, space, kernel);
}

/// Plans and launches the GPU form of a chunk kernel (ssd_gpu_chunks.hpp):
/// kernel.blocks teams of Kernel::NT threads per chunk.
template <class ExecSpace, class Kernel>
void launch_gpu_chunks(const char* op, const ExecSpace& space, Kernel kernel, const char* label) {
  if (kernel.teams() == 0) return;
  const std::size_t bytes = Kernel::scratch_bytes(kernel.Q);
  const auto plan = kdnn::impl::plan_register_team<ExecSpace, Kernel>(
      op, space, int(kernel.teams()), kernel.launch, bytes,
      "a chunk of Q=" + std::to_string(kernel.Q) + " steps (GPU form)");
  plan.launch(label, space, kernel);
}

/// Runs run(step), the SsdStep the table (ssd_forms.hpp) gives a's sizes on
/// `space`, and returns true when the chunk kernels run a GPU or tensor-core
/// form with `blocks` row blocks per chunk; false, running nothing, where
/// they run the host form.
template <class ExecSpace, class T, class Args, class Run>
bool gpu_chunk_form(const ExecSpace& space, const Args& a, const SsdOptions& opts, int Q,
                    int chunks, int blocks, const Run& run) {
  const int P = int(a.x.extent(3)), N = int(a.B.extent(3));
  if (!ssd_gpu_form<ExecSpace>(opts.launch, a.x.extent(0), a.x.extent(2), chunks, Q, P, N,
                               blocks)) {
    return false;
  }
  return SsdForms<T>::visit(space, opts.launch, std::array<int, 2>{P, N},
                            [&](auto step, const char*) { run(step); });
}

/// Row blocks per chunk of the GPU forms whose teams own kSsdGpuRows<T>
/// steps of a chunk of Q.
template <class T>
int gpu_row_blocks(int Q) {
  return (Q + kSsdGpuRows<T> - 1) / kSsdGpuRows<T>;
}

/// As gpu_chunk_form, for the backward's kernels (the same answer in its
/// two halves).
template <class ExecSpace, class T, class Run>
bool gpu_backward_form(const ExecSpace& space, const SsdBackward<T, ExecSpace>& a,
                       const SsdOptions& opts, const Run& run) {
  SsdChunks<ExecSpace, T> sizes;
  set_ssd_inputs<ExecSpace, T>(sizes, a, opts);
  return gpu_chunk_form<ExecSpace, T>(space, a, opts, sizes.Q, sizes.chunks,
                                      gpu_row_blocks<T>(sizes.Q), run);
}

/// Launches the chunk sums of outer products (ssd_chunk_sums.hpp: S_c, or
/// dS_c) in the form of Step (an SsdStep: on tensor cores or with FMAs);
/// `sums` their operands, `label` the kernel's name before its form.
template <class ExecSpace, class T, class Step, class Args>
void launch_gpu_chunk_sums(const char* op, const ExecSpace& space, const Args& a,
                           const SsdOptions& opts, const SsdChunkSums<ExecSpace, T>& sums,
                           const std::string& label) {
  const auto launch = [&](auto kernel, const char* form) {
    set_ssd_inputs<ExecSpace, T>(kernel, a, opts);
    static_cast<SsdChunkSums<ExecSpace, T>&>(kernel) = sums;
    kernel.blocks = decltype(kernel)::kBlocks;
    launch_gpu_chunks(op, space, kernel, (label + form).c_str());
  };
  if constexpr (Step::mma) {
    launch(SsdChunkStateMmaKernel<ExecSpace, T, Step::P, Step::N, Step::precision>{},
           "[tensor cores]");
  } else {
    launch(SsdChunkStateGpuKernel<ExecSpace, T, Step::P, Step::N>{}, "[gpu]");
  }
}

/// states(b, h, c) = S_c and decay(b, h, c) = exp(cum_last) for every chunk
/// (states has chunks + 1 rows; the last is left for the state pass).
template <class ExecSpace, class T, class Args>
void chunk_states(const char* op, const ExecSpace& space, const Args& a, const SsdOptions& opts,
                  ChunkStates<T, ExecSpace>& states, ChunkDecays<T, ExecSpace>& decay) {
  SsdChunkStateKernel<ExecSpace, T> k;
  set_ssd_inputs<ExecSpace, T>(k, a, opts);
  const int B = int(a.x.extent(0)), H = int(a.x.extent(2));
  states = ChunkStates<T, ExecSpace>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kdnn::ssm::ssd_states")), B, H,
      k.chunks + 1, std::size_t(k.P()) * k.N());
  decay = ChunkDecays<T, ExecSpace>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kdnn::ssm::ssd_decay")), B, H,
      k.chunks);
  k.states = states;
  k.decay = decay;
  const auto gpu = [&](auto step) {
    SsdChunkSums<ExecSpace, T> sums;
    sums.states = states;
    sums.decay = decay;
    launch_gpu_chunk_sums<ExecSpace, T, decltype(step)>(op, space, a, opts, sums,
                                                        "kdnn::ssm::ssd_chunk_states");
  };
  if (gpu_chunk_form<ExecSpace, T>(space, a, opts, k.Q, k.chunks, k.N() / kSsdGpuRows<T>, gpu)) {
    return;
  }
  launch_chunks(
      op, space, k, [&](kdnn::impl::ScratchCarver& s) { decltype(k)::carve(s, k.Qp, k.Pp, k.Np); },
      "kdnn::ssm::ssd_chunk_states");
}

/// w of a block of width W: W itself where it is 1 (a GPU), so that arrays
/// of a block's values are indexed by constants and stay in registers.
template <int W>
KOKKOS_FORCEINLINE_FUNCTION constexpr int block_width(int w) {
  return W == 1 ? 1 : w;
}

/// Runs f(b, h, e0, w) over blocks [e0, e0 + w) of the elements of each
/// (b, h)'s chunk states (NP of them), w ≤ StateBlock<ExecSpace>::width: on
/// a host 64, so that each chunk's row of a block is a contiguous vector
/// loop; on a GPU 1, consecutive threads taking consecutive elements.
template <class ExecSpace>
struct StateBlock {
  static constexpr int width = kdnn::impl::BackendTraits<ExecSpace>::is_host ? 64 : 1;
};
template <class ExecSpace, class F>
void for_state_blocks(const ExecSpace& space, const char* label, int B, int H, int NP, const F& f) {
  constexpr int W = StateBlock<ExecSpace>::width;
  const int per = (NP + W - 1) / W;
  const long long count = (long long)B * H * per;
  if (count == 0) return;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<ExecSpace>(space, 0, count), KOKKOS_LAMBDA(long long idx) {
        const int e0 = int(idx % per) * W, bh = int(idx / per);
        f(bh / H, bh % H, e0, NP - e0 < W ? NP - e0 : W);
      });
}

/// Chunks whose states a state pass loads together before it stores any of
/// them. Each pass is in place (chunk c's result overwrites its input), and
/// to a compiler the store to chunk c may alias the load of the next chunk,
/// so loaded one at a time every chunk would wait a full memory latency
/// (about 0.25 ms over 256 chunks on a GPU); loaded ahead, a thread has
/// kStatePassAhead loads in flight. The arithmetic and its order are
/// unchanged.
constexpr int kStatePassAhead = 8;

/// local[u][j] = rows(b, h, c, e0 + j) and d[u] = decay(b, h, c) for the
/// chunks c = c0 + u·step, u < kStatePassAhead, step +1 towards `end`
/// (exclusive) if end > c0, else −1; j < w ≤ W.
template <int W, class T, class States, class Decays>
KOKKOS_INLINE_FUNCTION void load_ahead(const States& rows, const Decays& decay, int b, int h,
                                       int c0, int end, int e0, int w,
                                       T (&local)[kStatePassAhead][W], T (&d)[kStatePassAhead]) {
  const int step = end > c0 ? 1 : -1;
  const int n_j = block_width<W>(w);
  KDNN_IMPL_UNROLL
  for (int u = 0; u < kStatePassAhead; ++u) {
    const int c = c0 + u * step;
    if (step > 0 ? c < end : c > end) {
      d[u] = decay(b, h, c);
      const T* row = &rows(b, h, c, e0);
      for (int j = 0; j < n_j; ++j) local[u][j] = row[j];
    }
  }
}

/// The forward state pass, in place: on entry states(b, h, c) = S_c; on exit
/// states(b, h, c) = H_c, the state entering chunk c (H_0 = init, zeros when
/// empty), and states(b, h, chunks) = the final state, also written to
/// `final_state` when given. A [B, H, P, N] state s[p, n] is element n·P + p
/// of a chunk state.
template <class ExecSpace, class T>
void state_pass(const ExecSpace& space, const ChunkStates<T, ExecSpace>& states,
                const ChunkDecays<T, ExecSpace>& decay, const Tensor4<const T, ExecSpace>& init,
                const Tensor4<T, ExecSpace>& final_state) {
  constexpr int W = StateBlock<ExecSpace>::width;
  const int chunks = int(states.extent(2)) - 1;
  const bool has_init = validate::given(init), has_final = validate::given(final_state);
  const int P = has_init ? int(init.extent(2)) : has_final ? int(final_state.extent(2)) : 1;
  for_state_blocks(
      space, "kdnn::ssm::ssd_state_pass", int(states.extent(0)), int(states.extent(1)),
      int(states.extent(3)), KOKKOS_LAMBDA(int b, int h, int e0, int w_run) {
        const int w = block_width<W>(w_run);
        T s[W];
        for (int j = 0; j < w; ++j) {
          const int e = e0 + j;
          s[j] = has_init ? init(b, h, e % P, e / P) : T(0);
        }
        for (int c0 = 0; c0 < chunks; c0 += kStatePassAhead) {
          T local[kStatePassAhead][W], d[kStatePassAhead];
          load_ahead<W>(states, decay, b, h, c0, chunks, e0, w, local, d);
          KDNN_IMPL_UNROLL
          for (int u = 0; u < kStatePassAhead; ++u) {
            if (c0 + u < chunks) {
              T* row = &states(b, h, c0 + u, e0);
              for (int j = 0; j < w; ++j) {
                row[j] = s[j];
                s[j] = d[u] * s[j] + local[u][j];
              }
            }
          }
        }
        T* last = &states(b, h, chunks, e0);
        for (int j = 0; j < w; ++j) last[j] = s[j];
        if (has_final) {
          for (int j = 0; j < w; ++j) final_state(b, h, (e0 + j) % P, (e0 + j) / P) = s[j];
        }
      });
}

/// Each packed sequence's final state, a.sequence_states (with cu_seqlens),
/// from the chunk states after state_pass (ssd_sequence_states_kernel.hpp).
template <class ExecSpace, class T>
void sequence_states(const ExecSpace& space, const SsdForward<T, ExecSpace>& a,
                     const SsdOptions& opts, const ChunkStates<T, ExecSpace>& states) {
  if (a.sequence_states.size() == 0) return;
  SsdSequenceStates<ExecSpace, T> k;
  set_ssd_inputs<ExecSpace, T>(k, a, opts);
  k.cu = a.cu_seqlens;
  k.entering = states;
  k.out = a.sequence_states;
  Kokkos::parallel_for("kdnn::ssm::ssd_sequence_states",
                       Kokkos::RangePolicy<ExecSpace>(space, 0, a.sequence_states.size()), k);
}

/// The reverse state pass, in place: on entry dstates(b, h, c) = dS_c (the
/// gradient Y_off of chunk c sends to H_c); on exit dstates(b, h, c) =
/// dH_{c+1}, the gradient of the state leaving chunk c (dH_chunks = dfinal,
/// zeros when empty), and d(initial state) = dH_0 when `dinit` is given.
template <class ExecSpace, class T>
void reverse_state_pass(const ExecSpace& space, const ChunkStates<T, ExecSpace>& dstates,
                        const ChunkDecays<T, ExecSpace>& decay,
                        const Tensor4<const T, ExecSpace>& dfinal,
                        const Tensor4<T, ExecSpace>& dinit, int P) {
  constexpr int W = StateBlock<ExecSpace>::width;
  const int chunks = int(dstates.extent(2));
  const bool has_dfinal = validate::given(dfinal), has_dinit = validate::given(dinit);
  if (P == 0) return;
  for_state_blocks(
      space, "kdnn::ssm::ssd_reverse_state_pass", int(dstates.extent(0)), int(dstates.extent(1)),
      int(dstates.extent(3)), KOKKOS_LAMBDA(int b, int h, int e0, int w_run) {
        const int w = block_width<W>(w_run);
        T s[W];
        for (int j = 0; j < w; ++j) {
          const int e = e0 + j;
          s[j] = has_dfinal ? dfinal(b, h, e % P, e / P) : T(0);
        }
        for (int c0 = chunks - 1; c0 >= 0; c0 -= kStatePassAhead) {
          T local[kStatePassAhead][W], d[kStatePassAhead];
          load_ahead<W>(dstates, decay, b, h, c0, -1, e0, w, local, d);
          KDNN_IMPL_UNROLL
          for (int u = 0; u < kStatePassAhead; ++u) {
            if (c0 - u >= 0) {
              T* row = &dstates(b, h, c0 - u, e0);
              for (int j = 0; j < w; ++j) {
                row[j] = s[j];
                s[j] = local[u][j] + d[u] * s[j];
              }
            }
          }
        }
        if (has_dinit) {
          for (int j = 0; j < w; ++j) dinit(b, h, (e0 + j) % P, (e0 + j) / P) = s[j];
        }
      });
}

/// The products of every chunk's steps with each other on tensor cores
/// (ssd_chunk_scores_mma_kernel.hpp) at `Precision`: C·Bᵀ per group (K =
/// N), or dY·X̃ᵀ per head (K = P, from `dy`).
template <class ExecSpace, class T, int K, SsdScores Which, kdnn::impl::MmaPrecision Precision,
          class Args>
ChunkScores<T, ExecSpace> mma_scores(const char* op, const ExecSpace& space, const Args& a,
                                     const SsdOptions& opts,
                                     const Tensor4<const T, ExecSpace>& dy = {}) {
  SsdChunkScoresMmaKernel<ExecSpace, T, K, Which, Precision> k;
  set_ssd_inputs<ExecSpace, T>(k, a, opts);
  k.dy = dy;
  const std::size_t ld = scores_ld<T>(k.Q);
  ChunkScores<T, ExecSpace> scores(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kdnn::ssm::ssd_scores")),
      k.rows(), ld * ld);
  k.scores = scores;
  k.blocks = k.row_blocks(k.Q);
  launch_gpu_chunks(op, space, k,
                    Which == SsdScores::cb ? "kdnn::ssm::ssd_chunk_scores[tensor cores]"
                                           : "kdnn::ssm::ssd_dy_xt[tensor cores]");
  return scores;
}

/// C·Bᵀ of every chunk once per group for the GPU forms' output kernel and
/// dX̃ gradient, in the form of Step: on tensor cores (mma_scores) for every
/// H and G; else with FMAs (SsdChunkScoresGpuKernel) where heads share a
/// group (H > G), and empty where they do not (those kernels then compute
/// it themselves).
template <class ExecSpace, class T, class Step, class Args>
ChunkScores<T, ExecSpace> group_scores(const char* op, const ExecSpace& space, const Args& a,
                                       const SsdOptions& opts) {
  if constexpr (Step::mma) {
    return mma_scores<ExecSpace, T, Step::N, SsdScores::cb, Step::precision>(op, space, a, opts);
  } else {
    if (a.x.extent(2) <= a.B.extent(2)) return {};
    SsdChunkScoresGpuKernel<ExecSpace, T, Step::P, Step::N> k;
    set_ssd_inputs<ExecSpace, T>(k, a, opts);
    const std::size_t ld = scores_ld<T>(k.Q);
    ChunkScores<T, ExecSpace> scores(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kdnn::ssm::ssd_scores")),
        a.x.extent(0) * std::size_t(k.chunks) * a.B.extent(2), ld * ld);
    k.scores = scores;
    k.blocks = k.row_blocks(k.Q);
    launch_gpu_chunks(op, space, k, "kdnn::ssm::ssd_chunk_scores[gpu]");
    return scores;
  }
}

/// group_scores in the form the table gives a's sizes on `space` (empty
/// where the host form runs): the stored products alone, for tests.
template <class ExecSpace, class T, class Args>
ChunkScores<T, ExecSpace> chunk_group_scores(const char* op, const ExecSpace& space, const Args& a,
                                             const SsdOptions& opts) {
  SsdChunks<ExecSpace, T> sizes;
  set_ssd_inputs<ExecSpace, T>(sizes, a, opts);
  ChunkScores<T, ExecSpace> scores;
  gpu_chunk_form<ExecSpace, T>(
      space, a, opts, sizes.Q, sizes.chunks, gpu_row_blocks<T>(sizes.Q),
      [&](auto step) { scores = group_scores<ExecSpace, T, decltype(step)>(op, space, a, opts); });
  return scores;
}

/// The output kernel (Y_diag + D·x with `diag`, + Y_off from `states` with
/// `off`).
template <class ExecSpace, class T>
void chunk_output(const char* op, const ExecSpace& space, const SsdForward<T, ExecSpace>& a,
                  const SsdOptions& opts, const ChunkStates<T, ExecSpace>& states, bool diag,
                  bool off) {
  SsdOutputData<ExecSpace, T> out;
  out.skip = SsdSkip<ExecSpace, T>(a.D, a.x.extent(2), a.x.extent(3));
  out.states = states;
  out.y = a.y;
  out.diag = diag;
  out.off = off;
  SsdChunkOutputKernel<ExecSpace, T> k;
  set_ssd_inputs<ExecSpace, T>(k, a, opts);
  k.out = out;
  const int Q = k.Q, blocks = gpu_row_blocks<T>(Q);
  const auto gpu = [&](auto step) {
    using Step = decltype(step);
    const auto launch = [&](auto g, int g_blocks, const char* label) {
      set_ssd_inputs<ExecSpace, T>(g, a, opts);
      g.blocks = g_blocks;
      g.out = out;
      if (diag) g.scores = group_scores<ExecSpace, T, Step>(op, space, a, opts);
      launch_gpu_chunks(op, space, g, label);
    };
    if constexpr (Step::mma) {
      using K = SsdChunkOutputMmaKernel<ExecSpace, T, Step::P, Step::N, Step::precision>;
      launch(K{}, K::blocks_per_chunk(Q), "kdnn::ssm::ssd_chunk_output[tensor cores]");
    } else {
      launch(SsdChunkOutputGpuKernel<ExecSpace, T, Step::P, Step::N>{}, blocks,
             "kdnn::ssm::ssd_chunk_output[gpu]");
    }
  };
  if (gpu_chunk_form<ExecSpace, T>(space, a, opts, Q, k.chunks, blocks, gpu)) {
    return;
  }
  launch_chunks(
      op, space, k,
      [&](kdnn::impl::ScratchCarver& s) { decltype(k)::carve(s, k.Qp, k.Pp, k.Np, diag, off); },
      "kdnn::ssm::ssd_chunk_output");
}

}  // namespace kdnn::ssm::impl
