// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The backward's steps of the chunked SSD (ssd_steps.hpp for the
// pipeline): the gradient buffers, diag_backward, state_backward,
// fused_backward and chunk_dstates.
#include <Kokkos_Core.hpp>

#include "kdnn/ssm/impl/ssd_backward_finish_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_backward_kernel.hpp"
#include "kdnn/ssm/impl/ssd_chunk_dstate_kernel.hpp"
#include "kdnn/ssm/impl/ssd_da_diag_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_diag_backward_kernel.hpp"
#include "kdnn/ssm/impl/ssd_forward_steps.hpp"
#include "kdnn/ssm/impl/ssd_gradient_gpu_kernel.hpp"
#include "kdnn/ssm/impl/ssd_gradient_mma_kernel.hpp"
#include "kdnn/ssm/impl/ssd_state_backward_kernel.hpp"

namespace kdnn::ssm::impl {

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

}  // namespace kdnn::ssm::impl
