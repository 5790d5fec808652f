// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The steps of the chunked SSD: the interface through which the single-rank
// operators (ssd_impl.hpp) and the context-parallel SSD (kdnn::cp,
// cp/impl/ssd_impl.hpp) compose it. Nothing else of ssm::impl is meant to be
// reached from outside ssm/.
//
//   forward:   chunk_states → state_pass (→ sequence_states) → chunk_output
//   backward:  chunk_states → state_pass → chunk_dstates → reverse_state_pass
//              → fused_backward (one rank), or gradient_buffers →
//              diag_backward (no state needed: may overlap communication) →
//              state_backward (after the states and their gradients are
//              complete)
//
// Where the sizes have GPU forms (ssd_gpu_chunks.hpp) and the launch asks
// for them, the backward's are split otherwise than the host forms:
// diag_backward computes da_diag alone (ssd_da_diag_gpu_kernel.hpp; on
// tensor cores from each chunk's C·Bᵀ and dY·X̃ᵀ, which it computes first
// and hands on in SsdGradients), and state_backward the gradients dX̃, dB
// and dC whole, each a kernel (ssd_gradient_gpu_kernel.hpp; on tensor cores
// ssd_gradient_mma_kernel.hpp), then da, ddt and the parameter sums
// (ssd_backward_finish_gpu_kernel.hpp); fused_backward runs the two.
//
// Chunk states travel between the steps in ChunkStates [B, H, chunks (+1),
// N·P] (element n·P + p of a chunk state is s[p, n]) and the chunks' total
// decays in ChunkDecays [B, H, chunks]. A context-parallel caller corrects
// both between the passes with the other ranks' summaries. Every step runs
// on `space` and checks nothing: the callers check their arguments first
// (ssd_checks.hpp).
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
#include "kdnn/ssm/impl/ssd_backward_finish_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_backward_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_dstate_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_output_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_output_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_output_mma_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_scores_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_scores_mma_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_state_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_state_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_state_mma_kernel.hpp"
#include "kdnn/ssm/impl/ssd_da_diag_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_diag_backward_kernel.hpp"
#include "kdnn/ssm/impl/ssd_forms.hpp"
#include "kdnn/ssm/impl/ssd_gradient_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_gradient_mma_kernel.hpp"
#include "kdnn/ssm/impl/ssd_sequence_states_kernel.hpp"
#include "kdnn/ssm/impl/ssd_skip.hpp"
#include "kdnn/ssm/impl/ssd_state_backward_kernel.hpp"
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

/// out(b, t, g, n) = Σ_{h in group g} per_head(b, t, h, n), heads in order.
template <class ExecSpace, class T>
void sum_group_heads(const ExecSpace& space, const Tensor4<T, ExecSpace>& per_head,
                     const Tensor4<T, ExecSpace>& out) {
  const int L = int(out.extent(1)), G = int(out.extent(2)), N = int(out.extent(3));
  const int per = int(per_head.extent(2)) / (G > 0 ? G : 1);
  const long long count = (long long)out.extent(0) * L * G;
  if (count == 0 || N == 0) return;
  Kokkos::parallel_for(
      "kdnn::ssm::ssd_sum_group_heads", Kokkos::RangePolicy<ExecSpace>(space, 0, count),
      KOKKOS_LAMBDA(long long idx) {
        const int g = int(idx % G), t = int(idx / G % L), b = int(idx / G / L);
        for (int n = 0; n < N; ++n) {
          T s = 0;
          for (int j = 0; j < per; ++j) s += per_head(b, t, g * per + j, n);
          out(b, t, g, n) = s;
        }
      });
}

/// Where the two backward kernels put their gradients (SsdGradients): the
/// outputs themselves, or per-head buffers for dB and dC when G < H.
template <class ExecSpace, class T>
SsdGradients<ExecSpace, T> gradient_buffers(const SsdBackward<T, ExecSpace>& a,
                                            bool with_da_diag = true) {
  const int B = int(a.x.extent(0)), L = int(a.x.extent(1)), H = int(a.x.extent(2));
  const int N = int(a.B.extent(3));
  const bool per_head = int(a.B.extent(2)) != H;
  const auto alloc = [&](const char* label) {
    return Tensor4<T, ExecSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), B, L, H, N);
  };
  SsdGradients<ExecSpace, T> g;
  g.dx = a.dx;
  g.dBh = per_head ? alloc("kdnn::ssm::ssd_dB_per_head") : a.dB;
  g.dCh = per_head ? alloc("kdnn::ssm::ssd_dC_per_head") : a.dC;
  if (with_da_diag) {  // the separate halves' hand-over (not the fused kernel's)
    g.da_diag = decltype(g.da_diag)(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kdnn::ssm::ssd_da_diag")), B,
        H, L);
  }
  return g;
}

/// The Y_diag half's kernel on a's inputs, writing into g.
template <class ExecSpace, class T>
SsdDiagBackwardKernel<ExecSpace, T> diag_backward_kernel(const SsdBackward<T, ExecSpace>& a,
                                                         const SsdOptions& opts,
                                                         const SsdGradients<ExecSpace, T>& g) {
  SsdDiagBackwardKernel<ExecSpace, T> k;
  set_ssd_inputs<ExecSpace, T>(k, a, opts);
  k.dy = a.dy;
  k.g = g;
  return k;
}

/// The backward of Y_diag (needs no state): the first half of the backward
/// (of the GPU forms: da_diag alone; on tensor cores from each chunk's C·Bᵀ
/// and dY·X̃ᵀ, which it leaves in g.cb and g.dy_xt for state_backward).
template <class ExecSpace, class T>
void diag_backward(const char* op, const ExecSpace& space, const SsdBackward<T, ExecSpace>& a,
                   const SsdOptions& opts, SsdGradients<ExecSpace, T>& g) {
  const auto gpu = [&](auto step) {
    using Step = decltype(step);
    SsdDaDiagGpuKernel<ExecSpace, T, Step::P, Step::N> k;
    set_ssd_inputs<ExecSpace, T>(k, a, opts);
    k.dy = a.dy;
    k.da_diag = g.da_diag;
    if constexpr (Step::mma) {
      g.cb = group_scores<ExecSpace, T, Step>(op, space, a, opts);
      g.dy_xt = mma_scores<ExecSpace, T, Step::P, SsdScores::dy_xt, Step::precision>(op, space, a,
                                                                                     opts, a.dy);
      k.cb = g.cb;
      k.dy_xt = g.dy_xt;
    }
    launch_gpu_chunks(op, space, k, "kdnn::ssm::ssd_da_diag[gpu]");
  };
  if (gpu_backward_form(space, a, opts, gpu)) return;
  const auto k = diag_backward_kernel(a, opts, g);
  launch_chunks(
      op, space, k, [&](kdnn::impl::ScratchCarver& s) { decltype(k)::carve(s, k.Qp, k.Pp, k.Np); },
      "kdnn::ssm::ssd_diag_backward");
}

/// The per-chunk sums the backward's last kernel leaves for dA and dD
/// (finish_backward): [B·chunks, 2H], Σ dt·da and Σ dy·x.
template <class ExecSpace, class T>
Matrix<double, ExecSpace> param_sums(const SsdBackward<T, ExecSpace>& a, int chunks) {
  return Matrix<double, ExecSpace>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kdnn::ssm::ssd_param_sums")),
      a.x.extent(0) * std::size_t(chunks), 2 * std::size_t(a.x.extent(2)));
}

/// The state half's kernel (or the fused kernel, Kernel) on a's inputs,
/// given H_c in `states` and dH_{c+1} in `dstates`, writing into g.
template <class Kernel, class ExecSpace, class T>
Kernel state_backward_kernel(const SsdBackward<T, ExecSpace>& a, const SsdOptions& opts,
                             const ChunkStates<T, ExecSpace>& states,
                             const ChunkStates<T, ExecSpace>& dstates,
                             const SsdGradients<ExecSpace, T>& g) {
  Kernel k;
  set_ssd_inputs<ExecSpace, T>(k, a, opts);
  k.dy = a.dy;
  k.skip = SsdSkip<ExecSpace, T>(a.D, a.x.extent(2), a.x.extent(3));
  k.states = states;
  k.dstates = dstates;
  k.g = g;
  k.ddt = a.ddt;
  k.partial = param_sums(a, k.chunks);
  return k;
}

/// dD per channel: dD[h·P + p] = Σ_{b,t} dy·x, summed in a fixed order
/// (partial sums over blocks of steps, then over the blocks).
template <class ExecSpace, class T>
void channel_skip_gradient(const ExecSpace& space, const SsdBackward<T, ExecSpace>& a) {
  const int Bt = int(a.x.extent(0)), L = int(a.x.extent(1)), H = int(a.x.extent(2)),
            P = int(a.x.extent(3));
  const long long rows = (long long)Bt * L;
  constexpr long long kRowsPerBlock = 256;
  const long long blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const auto dD = a.dD;
  if (blocks == 0) {
    Kokkos::deep_copy(space, dD, T(0));
    return;
  }
  const Matrix<double, ExecSpace> partial(
      Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                         std::string("kdnn::ssm::ssd_dD_channels")),
      blocks, std::size_t(H) * P);
  const auto x = a.x, dy = a.dy;
  const long long cols = (long long)H * P;
  Kokkos::parallel_for(
      "kdnn::ssm::ssd_dD_channel_blocks",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<long long>>(space, 0, blocks * cols),
      KOKKOS_LAMBDA(long long e) {
        const long long blk = e / cols;
        const int j = int(e % cols), h = j / P, p = j % P;  // consecutive e: consecutive channels
        const long long end = (blk + 1) * kRowsPerBlock < rows ? (blk + 1) * kRowsPerBlock : rows;
        double sum = 0;
        for (long long r = blk * kRowsPerBlock; r < end; ++r) {
          const int b = int(r / L), t = int(r % L);
          sum += double(dy(b, t, h, p)) * double(x(b, t, h, p));
        }
        partial(blk, j) = sum;
      });
  kdnn::impl::sum_blocks(
      space, "kdnn::ssm::ssd_dD_channels", partial,
      KOKKOS_LAMBDA(int j, double v) { dD(j) = T(v); });
}

/// After the state half: dA and dD from the per-chunk sums (dD per channel
/// from its own sums), and the sums over a group's heads.
template <class ExecSpace, class T>
void finish_backward(const ExecSpace& space, const SsdBackward<T, ExecSpace>& a,
                     const Matrix<double, ExecSpace>& partial,
                     const SsdGradients<ExecSpace, T>& g) {
  const int H = int(a.x.extent(2));
  const auto dA = a.dA;
  const auto dD = a.dD;
  const bool per_channel = validate::given(dD) && dD.extent(0) != std::size_t(H);  // H·P with P > 1
  if (per_channel) channel_skip_gradient(space, a);
  const bool has_dd = validate::given(dD) && !per_channel;
  if (partial.extent(0) == 0) {  // no steps: zero parameter gradients
    Kokkos::deep_copy(space, dA, T(0));
    if (has_dd) Kokkos::deep_copy(space, dD, T(0));
  } else {
    kdnn::impl::sum_blocks(
        space, "kdnn::ssm::ssd_dA_dD", partial, KOKKOS_LAMBDA(int j, double v) {
          if (j < H) {
            dA(j) = T(v);
          } else if (has_dd) {
            dD(j - H) = T(v);
          }
        });
  }
  if (g.dBh.data() != a.dB.data()) {  // per-head buffers (G < H)
    sum_group_heads(space, g.dBh, a.dB);
    sum_group_heads(space, g.dCh, a.dC);
  }
}

/// The inputs every gradient kernel of the GPU forms takes
/// (SsdGradientGpuKernel, SsdGradientMmaKernel): a's, H_c in `states`,
/// dH_{c+1} in `dstates`, and where it writes (g, sums).
template <class Kernel, class ExecSpace, class T>
void set_gradient_inputs(Kernel& k, const SsdBackward<T, ExecSpace>& a, const SsdOptions& opts,
                         const ChunkStates<T, ExecSpace>& states,
                         const ChunkStates<T, ExecSpace>& dstates,
                         const SsdGradients<ExecSpace, T>& g, const SsdStepSums<ExecSpace>& sums) {
  set_ssd_inputs<ExecSpace, T>(k, a, opts);
  k.dy = a.dy;
  k.skip = SsdSkip<ExecSpace, T>(a.D, a.x.extent(2), a.x.extent(3));
  k.states = states;
  k.dstates = dstates;
  k.g = g;
  k.sums = sums;
}

/// One of the backward's gradients on tensor cores
/// (ssd_gradient_mma_kernel.hpp) for Step: dx with the step sums row_a, sx
/// and sd (V the group's C·Bᵀ, group_scores), or dB or dC per head (V the
/// head's dY·X̃ᵀ, mma_scores), dC with dcum; from H_c in `states` and
/// dH_{c+1} in `dstates`.
template <class ExecSpace, class T, class Step, SsdGradient Which>
void launch_mma_gradient(const char* op, const ExecSpace& space, const SsdBackward<T, ExecSpace>& a,
                         const SsdOptions& opts, const ChunkStates<T, ExecSpace>& states,
                         const ChunkStates<T, ExecSpace>& dstates,
                         const ChunkScores<T, ExecSpace>& v, const SsdGradients<ExecSpace, T>& g,
                         const SsdStepSums<ExecSpace>& sums) {
  SsdGradientMmaKernel<ExecSpace, T, Step::P, Step::N, Which, Step::precision> k;
  set_gradient_inputs(k, a, opts, states, dstates, g, sums);
  k.blocks = k.blocks_per_chunk(k.Q);
  k.scores = v;
  launch_gpu_chunks(op, space, k,
                    Which == SsdGradient::dx   ? "kdnn::ssm::ssd_dx[tensor cores]"
                    : Which == SsdGradient::dB ? "kdnn::ssm::ssd_dB[tensor cores]"
                                               : "kdnn::ssm::ssd_dC[tensor cores]");
}

/// The backward's gradients dX̃ (into g.dx), dB and dC per head (g.dBh,
/// g.dCh) on tensor cores, where the table runs a's sizes there, from H_c in
/// `states` and dH_{c+1} in `dstates`, with their products C·Bᵀ and dY·X̃ᵀ:
/// the second half's products before its finish, for tests. Says whether
/// it ran them.
template <class ExecSpace, class T>
bool mma_gradients(const char* op, const ExecSpace& space, const SsdBackward<T, ExecSpace>& a,
                   const SsdOptions& opts, const ChunkStates<T, ExecSpace>& states,
                   const ChunkStates<T, ExecSpace>& dstates, const SsdGradients<ExecSpace, T>& g,
                   const SsdStepSums<ExecSpace>& sums) {
  bool ran = false;
  gpu_backward_form(space, a, opts, [&](auto step) {
    using Step = decltype(step);
    if constexpr (Step::mma) {
      using Which = SsdGradient;
      const auto cb = group_scores<ExecSpace, T, Step>(op, space, a, opts);
      const auto dy_xt = mma_scores<ExecSpace, T, Step::P, SsdScores::dy_xt, Step::precision>(
          op, space, a, opts, a.dy);
      launch_mma_gradient<ExecSpace, T, Step, Which::dx>(op, space, a, opts, states, dstates, cb, g,
                                                         sums);
      launch_mma_gradient<ExecSpace, T, Step, Which::dB>(op, space, a, opts, states, dstates, dy_xt,
                                                         g, sums);
      launch_mma_gradient<ExecSpace, T, Step, Which::dC>(op, space, a, opts, states, dstates, dy_xt,
                                                         g, sums);
      ran = true;
    }
  });
  return ran;
}

/// The GPU forms of the second half (see the top of this file): dX̃ (into
/// dx), dB, dC, then da, ddt and the per-chunk sums (returned). On tensor
/// cores from the products the first half left in g.cb and g.dy_xt.
template <class ExecSpace, class T, class Step>
Matrix<double, ExecSpace> gpu_state_backward(const char* op, const ExecSpace& space,
                                             const SsdBackward<T, ExecSpace>& a,
                                             const SsdOptions& opts,
                                             const ChunkStates<T, ExecSpace>& states,
                                             const ChunkStates<T, ExecSpace>& dstates,
                                             const SsdGradients<ExecSpace, T>& g) {
  const int B = int(a.x.extent(0)), L = int(a.x.extent(1)), H = int(a.x.extent(2));
  const auto steps = [&](const char* label) {
    return typename SsdStepSums<ExecSpace>::Steps(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), B, H, L);
  };
  SsdStepSums<ExecSpace> sums{steps("kdnn::ssm::ssd_row_a"), steps("kdnn::ssm::ssd_dcum"),
                              steps("kdnn::ssm::ssd_sx"), steps("kdnn::ssm::ssd_sd")};
  constexpr int P = Step::P, N = Step::N;
  // On tensor cores the first half's products (diag_backward).
  const auto scores = Step::mma ? g.cb : group_scores<ExecSpace, T, Step>(op, space, a, opts);
  const auto gradient = [&](auto which, const char* label) {
    SsdGradientGpuKernel<ExecSpace, T, P, N, decltype(which)::value> k;
    if constexpr (decltype(which)::value == SsdGradient::dx) k.scores = scores;
    set_gradient_inputs(k, a, opts, states, dstates, g, sums);
    k.blocks = gpu_row_blocks<T>(k.Q);
    launch_gpu_chunks(op, space, k, label);
  };
  using Which = SsdGradient;
  if constexpr (Step::mma) {
    launch_mma_gradient<ExecSpace, T, Step, Which::dx>(op, space, a, opts, states, dstates, scores,
                                                       g, sums);
    launch_mma_gradient<ExecSpace, T, Step, Which::dB>(op, space, a, opts, states, dstates, g.dy_xt,
                                                       g, sums);
    launch_mma_gradient<ExecSpace, T, Step, Which::dC>(op, space, a, opts, states, dstates, g.dy_xt,
                                                       g, sums);
  } else {
    gradient(std::integral_constant<Which, Which::dx>{}, "kdnn::ssm::ssd_dx[gpu]");
    gradient(std::integral_constant<Which, Which::dB>{}, "kdnn::ssm::ssd_dB[gpu]");
    gradient(std::integral_constant<Which, Which::dC>{}, "kdnn::ssm::ssd_dC[gpu]");
  }
  SsdBackwardFinishGpuKernel<ExecSpace, T, P, N> f;
  set_ssd_inputs<ExecSpace, T>(f, a, opts);
  f.states = states;
  f.dstates = dstates;
  f.da_diag = g.da_diag;
  f.sums = sums;
  f.ddt = a.ddt;
  f.partial = param_sums(a, f.chunks);
  launch_gpu_chunks(op, space, f, "kdnn::ssm::ssd_backward_finish[gpu]");
  return f.partial;
}

/// The second half, given H_c in `states` and dH_{c+1} in `dstates` (after
/// both state passes) and the first half in g: the state kernel, then dA, dD
/// and the sums over a group's heads.
template <class ExecSpace, class T>
void state_backward(const char* op, const ExecSpace& space, const SsdBackward<T, ExecSpace>& a,
                    const SsdOptions& opts, const ChunkStates<T, ExecSpace>& states,
                    const ChunkStates<T, ExecSpace>& dstates, const SsdGradients<ExecSpace, T>& g) {
  const auto gpu = [&](auto step) {
    const auto partial =
        gpu_state_backward<ExecSpace, T, decltype(step)>(op, space, a, opts, states, dstates, g);
    finish_backward(space, a, partial, g);
  };
  if (gpu_backward_form(space, a, opts, gpu)) return;
  const auto k =
      state_backward_kernel<SsdStateBackwardKernel<ExecSpace, T>>(a, opts, states, dstates, g);
  launch_chunks(
      op, space, k, [&](kdnn::impl::ScratchCarver& s) { decltype(k)::carve(s, k.Qp, k.Pp, k.Np); },
      "kdnn::ssm::ssd_state_backward");
  finish_backward(space, a, k.partial, g);
}

/// Both halves in one kernel (SsdBackwardKernel), after both state passes;
/// of the GPU forms, the two halves (g's da_diag given or not).
template <class ExecSpace, class T>
void fused_backward(const char* op, const ExecSpace& space, const SsdBackward<T, ExecSpace>& a,
                    const SsdOptions& opts, const ChunkStates<T, ExecSpace>& states,
                    const ChunkStates<T, ExecSpace>& dstates, const SsdGradients<ExecSpace, T>& g) {
  if (gpu_backward_form(space, a, opts, [](auto) {})) {
    auto halves = g;
    if (halves.da_diag.extent(0) == 0) halves.da_diag = gradient_buffers(a).da_diag;
    diag_backward(op, space, a, opts, halves);
    state_backward(op, space, a, opts, states, dstates, halves);
    return;
  }
  auto k = state_backward_kernel<SsdBackwardKernel<ExecSpace, T>>(a, opts, states, dstates, g);
  k.diag = diag_backward_kernel(a, opts, g);
  launch_chunks(
      op, space, k, [&](kdnn::impl::ScratchCarver& s) { decltype(k)::carve(s, k.Qp, k.Pp, k.Np); },
      "kdnn::ssm::ssd_backward");
  finish_backward(space, a, k.partial, g);
}

/// dS_c for every chunk into dstates (then reverse_state_pass).
template <class ExecSpace, class T>
void chunk_dstates(const char* op, const ExecSpace& space, const SsdBackward<T, ExecSpace>& a,
                   const SsdOptions& opts, ChunkStates<T, ExecSpace>& dstates) {
  SsdChunkDstateKernel<ExecSpace, T> k;
  set_ssd_inputs<ExecSpace, T>(k, a, opts);
  k.dy = a.dy;
  dstates = ChunkStates<T, ExecSpace>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kdnn::ssm::ssd_dstates")),
      a.x.extent(0), a.x.extent(2), k.chunks, std::size_t(k.P()) * k.N());
  k.dstates = dstates;
  const auto gpu = [&](auto step) {
    SsdChunkSums<ExecSpace, T> sums;
    sums.states = dstates;
    sums.dy = a.dy;
    sums.gradient = true;
    launch_gpu_chunk_sums<ExecSpace, T, decltype(step)>(op, space, a, opts, sums,
                                                        "kdnn::ssm::ssd_chunk_dstates");
  };
  if (gpu_chunk_form<ExecSpace, T>(space, a, opts, k.Q, k.chunks, k.N() / kSsdGpuRows<T>, gpu)) {
    return;
  }
  launch_chunks(
      op, space, k, [&](kdnn::impl::ScratchCarver& s) { decltype(k)::carve(s, k.Qp, k.Pp, k.Np); },
      "kdnn::ssm::ssd_chunk_dstates");
}

// The steps above are compiled into libkdnn with the operators (ssd_eti.cpp)
// for the pairs of core/impl/eti.hpp: the context-parallel SSD, the CLI and
// the tests that run single steps call them without compiling their kernels
// again (each such file took as long as the operators' own under nvcc).
// Each visits the table (ssd_forms.hpp), so each instantiates every form
// at every listed size: no list of sizes is kept here.
#define KDNN_SSD_STEPS(PREFIX, ExecSpace, T)                                                      \
  PREFIX void chunk_states<ExecSpace, T, SsdForward<T, ExecSpace>>(                               \
      const char*, const ExecSpace&, const SsdForward<T, ExecSpace>&, const SsdOptions&,          \
      ChunkStates<T, ExecSpace>&, ChunkDecays<T, ExecSpace>&);                                    \
  PREFIX void chunk_states<ExecSpace, T, SsdBackward<T, ExecSpace>>(                              \
      const char*, const ExecSpace&, const SsdBackward<T, ExecSpace>&, const SsdOptions&,         \
      ChunkStates<T, ExecSpace>&, ChunkDecays<T, ExecSpace>&);                                    \
  PREFIX void state_pass<ExecSpace, T>(                                                           \
      const ExecSpace&, const ChunkStates<T, ExecSpace>&, const ChunkDecays<T, ExecSpace>&,       \
      const Tensor4<const T, ExecSpace>&, const Tensor4<T, ExecSpace>&);                          \
  PREFIX void sequence_states<ExecSpace, T>(const ExecSpace&, const SsdForward<T, ExecSpace>&,    \
                                            const SsdOptions&, const ChunkStates<T, ExecSpace>&); \
  PREFIX void reverse_state_pass<ExecSpace, T>(                                                   \
      const ExecSpace&, const ChunkStates<T, ExecSpace>&, const ChunkDecays<T, ExecSpace>&,       \
      const Tensor4<const T, ExecSpace>&, const Tensor4<T, ExecSpace>&, int);                     \
  PREFIX void chunk_output<ExecSpace, T>(const char*, const ExecSpace&,                           \
                                         const SsdForward<T, ExecSpace>&, const SsdOptions&,      \
                                         const ChunkStates<T, ExecSpace>&, bool, bool);           \
  PREFIX void diag_backward<ExecSpace, T>(const char*, const ExecSpace&,                          \
                                          const SsdBackward<T, ExecSpace>&, const SsdOptions&,    \
                                          SsdGradients<ExecSpace, T>&);                           \
  PREFIX void state_backward<ExecSpace, T>(                                                       \
      const char*, const ExecSpace&, const SsdBackward<T, ExecSpace>&, const SsdOptions&,         \
      const ChunkStates<T, ExecSpace>&, const ChunkStates<T, ExecSpace>&,                         \
      const SsdGradients<ExecSpace, T>&);                                                         \
  PREFIX void fused_backward<ExecSpace, T>(                                                       \
      const char*, const ExecSpace&, const SsdBackward<T, ExecSpace>&, const SsdOptions&,         \
      const ChunkStates<T, ExecSpace>&, const ChunkStates<T, ExecSpace>&,                         \
      const SsdGradients<ExecSpace, T>&);                                                         \
  PREFIX void chunk_dstates<ExecSpace, T>(const char*, const ExecSpace&,                          \
                                          const SsdBackward<T, ExecSpace>&, const SsdOptions&,    \
                                          ChunkStates<T, ExecSpace>&);                            \
  PREFIX ChunkScores<T, ExecSpace> chunk_group_scores<ExecSpace, T, SsdForward<T, ExecSpace>>(    \
      const char*, const ExecSpace&, const SsdForward<T, ExecSpace>&, const SsdOptions&);         \
  PREFIX bool mma_gradients<ExecSpace, T>(                                                        \
      const char*, const ExecSpace&, const SsdBackward<T, ExecSpace>&, const SsdOptions&,         \
      const ChunkStates<T, ExecSpace>&, const ChunkStates<T, ExecSpace>&,                         \
      const SsdGradients<ExecSpace, T>&, const SsdStepSums<ExecSpace>&);

#define KDNN_SSD_STEPS_EXTERN(ExecSpace, T) KDNN_SSD_STEPS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH(KDNN_SSD_STEPS_EXTERN)
#undef KDNN_SSD_STEPS_EXTERN

}  // namespace kdnn::ssm::impl
