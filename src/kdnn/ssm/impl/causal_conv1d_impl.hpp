// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Definitions of kdnn::ssm::impl::{causal_conv1d_forward, causal_conv1d_backward}
// and the step-range launches the context-parallel conv (kdnn::cp) builds on.
#include <climits>
#include <string>
#include <type_traits>

#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/block_sums.hpp"
#include "kdnn/core/impl/compiled_sizes.hpp"
#include "kdnn/core/impl/eti.hpp"
#include "kdnn/core/impl/finite_values.hpp"
#include "kdnn/core/impl/team_plan.hpp"
#include "kdnn/core/validate.hpp"
#include "kdnn/ssm/causal_conv1d.hpp"
#include "kdnn/ssm/impl/causal_conv1d_kernels.hpp"
#include "kdnn/ssm/impl/causal_conv1d_register_kernels.hpp"

namespace kdnn::ssm::impl {

/// Steps and channels per team: on a host a tile of 64 steps by up to 256
/// channels (the forward's x̄ tile then stays in L2); on a GPU 64 steps by
/// 64 channels, vector lanes over the channels (coalesced rows).
template <class ExecSpace, class Kernel>
void conv_tiling(Kernel& kernel, int C) {
  constexpr bool host = kdnn::impl::BackendTraits<ExecSpace>::is_host;
  const int max_ct = host ? Kernel::host_max_ct : 64;
  kernel.tt = 64;
  kernel.ct = C < max_ct ? (C > 0 ? C : 1) : max_ct;
}

/// Plans and launches `kernel` over its steps [first, last) (with B, C > 0).
template <class ExecSpace, class Kernel>
void launch_conv(const char* op, const ExecSpace& space, Kernel kernel, const Launch& launch,
                 const char* label) {
  const int B = int(kernel.x.extent(0)), K = int(kernel.w.extent(1));
  if (kernel.last <= kernel.first || B == 0 || kernel.x.extent(2) == 0) return;
  const long long league = (long long)B * kernel.time_tiles() * kernel.channel_tiles();
  if (league > INT_MAX) fail(op, ": ", league, " tiles of steps and channels, above 2^31 - 1");
  const std::size_t bytes = kdnn::impl::layout_bytes(
      [&](kdnn::impl::ScratchCarver& s) { Kernel::carve(s, kernel.tt, kernel.ct, K); });
  constexpr bool host = kdnn::impl::BackendTraits<ExecSpace>::is_host;
  const auto plan = kdnn::impl::plan_team<ExecSpace, Kernel>(
      op, space, int(league), launch, host ? 1 : 32, bytes,
      "a tile of " + std::to_string(kernel.tt) + " steps and " + std::to_string(kernel.ct) +
          " channels with K=" + std::to_string(K));
  plan.launch(label, space, kernel);
}

/// The filter widths K the register kernels (the GPU form) are compiled for.
using RegisterWidths = kdnn::impl::CompiledSizes<2, 3, 4>;

/// Runs `run(std::integral_constant<int, K>{})` and returns true when the
/// launch asks for the GPU form and K is one of RegisterWidths.
template <class ExecSpace, class Run>
bool register_width(const CausalConv1dOptions& opts, int K, const Run& run) {
  return kdnn::impl::use_gpu_form<ExecSpace>(opts.launch.form) && RegisterWidths::dispatch(K, run);
}

/// Steps per thread of a register kernel: 64 (K − 1 halo loads per 64
/// steps), halved down to 8 while fewer than 2^16 threads would run.
template <class Kernel>
void set_runs(Kernel& k) {
  k.run = 64;
  while (k.run > 8 && k.threads() < (1LL << 16)) k.run /= 2;
}

/// Launches a register kernel: one thread per (b, run of steps, channel).
/// The index is 64-bit and a range policy has no league to bound (on CUDA,
/// Kokkos strides over the range), so B · runs · C may pass 2^31 here,
/// unlike the tiled kernels' league (launch_conv).
template <class ExecSpace, class Kernel>
void launch_runs(const ExecSpace& space, const Kernel& k, const char* label) {
  if (k.threads() <= 0) return;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<long long>>(space, 0, k.threads()),
      k);
}

template <class ExecSpace, class T, class Kernel>
void set_conv_inputs(Kernel& k, const StridedTensor3<const T, ExecSpace>& x,
                     const Matrix<const compute_t<T>, ExecSpace>& w,
                     const Vector<const compute_t<T>, ExecSpace>& bias,
                     const StridedTensor3<const T, ExecSpace>& init,
                     const ConvSequenceIds<ExecSpace>& ids, const CausalConv1dOptions& opts,
                     int first, int last) {
  k.x = x;
  k.channels_inner = x.stride(2) <= x.stride(1);
  k.w = w;
  k.bias = bias;
  k.init = init;
  k.has_bias = validate::given(bias);
  k.has_init = validate::given(init);
  k.silu = opts.silu;
  k.first = first;
  k.last = last;
  k.seq = ids;
}

/// Whether every given [B, ·, C] View has its channels contiguous (stride
/// 1, or at most one channel): the tiled kernels' `Unit` case.
template <class... Views>
bool unit_channels(const Views&... views) {
  return ((!validate::given(views) || views.extent(2) <= 1 || views.stride(2) == 1) && ...);
}

/// Runs `run(std::integral_constant<bool, Unit>{})` with Unit = unit_channels(views...).
template <class Run, class... Views>
void with_channel_stride(const Run& run, const Views&... views) {
  if (unit_channels(views...)) {
    run(std::true_type{});
  } else {
    run(std::false_type{});
  }
}

/// y at steps [first, last) (0 ≤ first ≤ last ≤ L); no checks. With
/// seq_idx, `ids_before` [B, K−1] are the sequence ids of the initial
/// state's steps (default: step 0's).
template <class ExecSpace, class T>
void conv_forward_steps(const ExecSpace& space, const ConvForward<T, ExecSpace>& a,
                        const CausalConv1dOptions& opts, int first, int last,
                        const Matrix<const int, ExecSpace>& ids_before = {}) {
  const char* label = "kdnn::ssm::causal_conv1d_forward";
  const ConvSequenceIds<ExecSpace> ids(a.seq_idx, ids_before);
  const auto in_registers = [&](auto width) {
    ConvRegisterForward<ExecSpace, T, decltype(width)::value> k;
    set_conv_inputs<ExecSpace, T>(k, a.x, a.w, a.bias, a.initial_state, ids, opts, first, last);
    k.y = a.y;
    set_runs(k);
    launch_runs(space, k, label);
  };
  if (register_width<ExecSpace>(opts, int(a.w.extent(1)), in_registers)) return;
  const auto tiled = [&](auto unit) {
    ConvForwardKernel<ExecSpace, T, decltype(unit)::value> k;
    set_conv_inputs<ExecSpace, T>(k, a.x, a.w, a.bias, a.initial_state, ids, opts, first, last);
    conv_tiling<ExecSpace>(k, int(a.x.extent(2)));
    k.y = a.y;
    launch_conv("ssm::causal_conv1d_forward", space, k, opts.launch, label);
  };
  with_channel_stride(tiled, a.x, a.initial_state, a.y);
}

/// final[b, j, c] = x̄[b, L−K+1+j, c]: the last K−1 steps of x̄ (with
/// sequence ids, 0 at the steps outside the last step's sequence).
template <class ExecSpace, class T>
void conv_final_state(const ExecSpace& space, const StridedTensor3<const T, ExecSpace>& x,
                      const StridedTensor3<const T, ExecSpace>& init,
                      const StridedTensor3<T, ExecSpace>& final_state,
                      const ConvSequenceIds<ExecSpace>& ids) {
  const int B = int(final_state.extent(0)), K1 = int(final_state.extent(1));
  const int C = int(final_state.extent(2)), L = int(x.extent(1));
  const bool has_init = validate::given(init);
  if (std::size_t(B) * K1 * C == 0) return;
  Kokkos::parallel_for(
      "kdnn::ssm::causal_conv1d_final_state",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0}, {B, K1, C}),
      KOKKOS_LAMBDA(int b, int j, int c) {
        const int s = L - K1 + j;
        const bool kept = ids.in_last_sequence(b, s);
        final_state(b, j, c) = !kept      ? T{}
                               : s >= 0   ? x(b, s, c)
                               : has_init ? init(b, s + K1, c)
                                          : T{};
      });
}

/// dw and dbias from the partial sums of the blocks of steps (partial
/// [blocks, C·(K+1)], summed in double); zeros when there were no steps.
template <class ExecSpace, class T>
void conv_param_sums(const ExecSpace& space, const ConvBackward<T, ExecSpace>& a,
                     const Matrix<compute_t<T>, ExecSpace>& partial) {
  using Compute = compute_t<T>;
  const int K = int(a.w.extent(1));
  const auto dw = a.dw;
  const auto dbias = a.dbias;
  const bool has_dbias = validate::given(dbias);
  if (partial.extent(0) == 0) {  // no steps: zero gradients
    Kokkos::deep_copy(space, dw, Compute(0));
    if (has_dbias) Kokkos::deep_copy(space, dbias, Compute(0));
    return;
  }
  kdnn::impl::sum_blocks(
      space, "kdnn::ssm::causal_conv1d_param_sums", partial, KOKKOS_LAMBDA(int j, double v) {
        const int c = j / (K + 1), kk = j % (K + 1);
        if (kk < K) {
          dw(c, kk) = Compute(v);
        } else if (has_dbias) {
          dbias(c) = Compute(v);
        }
      });
}

/// The backward kernel's outputs and, with `params`, its partial sums
/// [blocks, C·(K+1)].
template <class ExecSpace, class T, class Kernel>
void set_conv_gradients(Kernel& k, const ConvBackward<T, ExecSpace>& a, bool params,
                        long long blocks) {
  k.dy = a.dy;
  k.dfinal = a.dfinal_state;
  k.has_dfinal = validate::given(a.dfinal_state);
  k.dx = a.dx;
  k.dinit = a.dinitial_state;
  k.params = params;
  const bool steps = k.last > k.first && a.x.extent(0) > 0 && a.x.extent(2) > 0;
  if (params) {
    k.partial = Matrix<compute_t<T>, ExecSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kdnn::ssm::conv_partial_sums"),
        steps ? blocks : 0, a.x.extent(2) * (a.w.extent(1) + 1));
  }
}

/// The backward at steps s in [first, last) of x̄ (−K+1 ≤ first ≤ last ≤ L;
/// s < 0 writes d(initial state)); with `params`, also dw and dbias (then the
/// range must cover [0, L)). No checks. `ids_before` as in conv_forward_steps.
template <class ExecSpace, class T>
void conv_backward_steps(const ExecSpace& space, const ConvBackward<T, ExecSpace>& a,
                         const CausalConv1dOptions& opts, int first, int last, bool params,
                         const Matrix<const int, ExecSpace>& ids_before = {}) {
  const char* op = "ssm::causal_conv1d_backward";
  const ConvSequenceIds<ExecSpace> ids(a.seq_idx, ids_before);
  const char* label = "kdnn::ssm::causal_conv1d_backward";
  const long long B = a.x.extent(0);
  Matrix<compute_t<T>, ExecSpace> partial;
  const auto in_registers = [&](auto width) {
    ConvRegisterBackward<ExecSpace, T, decltype(width)::value> k;
    set_conv_inputs<ExecSpace, T>(k, a.x, a.w, a.bias, a.initial_state, ids, opts, first, last);
    set_runs(k);
    set_conv_gradients(k, a, params, B * k.runs());
    launch_runs(space, k, label);
    partial = k.partial;
  };
  const auto tiled = [&](auto unit) {
    ConvBackwardKernel<ExecSpace, T, decltype(unit)::value> k;
    set_conv_inputs<ExecSpace, T>(k, a.x, a.w, a.bias, a.initial_state, ids, opts, first, last);
    conv_tiling<ExecSpace>(k, int(a.x.extent(2)));
    set_conv_gradients(k, a, params, B * k.time_tiles());
    launch_conv(op, space, k, opts.launch, label);
    partial = k.partial;
  };
  if (!register_width<ExecSpace>(opts, int(a.w.extent(1)), in_registers)) {
    with_channel_stride(tiled, a.x, a.initial_state, a.dy, a.dfinal_state, a.dx, a.dinitial_state);
  }
  if (params) conv_param_sums(space, a, partial);
}

/// A state [B, K−1, C] of x [B, L, C] and w [C, K].
template <class State, class X, class W>
void check_state(const char* op, const char* name, const State& state, const X& x, const W& w) {
  validate::extent(op, name, state, 0, x.extent(0), "B, x's extent(0)");
  validate::extent(op, name, state, 1, w.extent(1) - 1, "K-1, from w's extent(1)");
  validate::extent(op, name, state, 2, x.extent(2), "C, x's extent(2)");
}

/// Host-side checks of the views shared by the forward and the backward.
template <class ExecSpace, class T>
void check_conv_inputs(const char* op, const StridedTensor3<const T, ExecSpace>& x,
                       const Matrix<const compute_t<T>, ExecSpace>& w,
                       const Vector<const compute_t<T>, ExecSpace>& bias,
                       const StridedTensor3<const T, ExecSpace>& init) {
  const std::size_t C = x.extent(2);
  if (w.extent(1) < 1) fail(op, ": w has extent(1)=", w.extent(1), ", expected K >= 1");
  validate::extent(op, "w", w, 0, C, "C, x's extent(2)");
  if (x.extent(1) > std::size_t(INT_MAX) || C > std::size_t(INT_MAX) ||
      w.extent(1) > std::size_t(INT_MAX / 4)) {
    fail(op, ": x has shape [", x.extent(0), ", ", x.extent(1), ", ", C, "] and K=", w.extent(1),
         ", expected L, C < 2^31 and K < 2^29");
  }
  if (validate::given(bias)) validate::extent(op, "bias", bias, 0, C, "C, x's extent(2)");
  if (validate::given(init)) check_state(op, "initial_state", init, x, w);
}

/// Every host-side check of causal_conv1d_forward (`op` names the caller).
template <class ExecSpace, class T>
void check_conv_forward(const char* op, const ConvForward<T, ExecSpace>& a) {
  check_conv_inputs<ExecSpace, T>(op, a.x, a.w, a.bias, a.initial_state);
  validate::sequence_ids(op, a.seq_idx, a.x);
  validate::same_shape(op, "y", a.y, "x", a.x);
  validate::distinct_elements(op, "y", a.y);
  if (validate::given(a.final_state)) {
    check_state(op, "final_state", a.final_state, a.x, a.w);
    validate::distinct_elements(op, "final_state", a.final_state);
  }
  using validate::memory_of;
  const auto inputs = {memory_of("x", a.x), memory_of("w", a.w), memory_of("bias", a.bias),
                       memory_of("initial_state", a.initial_state),
                       memory_of("seq_idx", a.seq_idx)};
  validate::disjoint(op, {memory_of("y", a.y), memory_of("final_state", a.final_state)}, inputs);
}

/// opts.check_finite of the conv's forward: no NaN or infinity in its inputs.
template <class ExecSpace, class T>
void check_conv_finite(const char* op, const ExecSpace& space, const ConvForward<T, ExecSpace>& a,
                       const CausalConv1dOptions& opts) {
  if (!opts.check_finite) return;
  using kdnn::impl::check_finite;
  check_finite(op, space, "x", a.x);
  check_finite(op, space, "w", a.w);
  check_finite(op, space, "bias", a.bias);
  check_finite(op, space, "initial_state", a.initial_state);
}

/// The same of the backward: its inputs and the incoming gradients.
template <class ExecSpace, class T>
void check_conv_finite(const char* op, const ExecSpace& space, const ConvBackward<T, ExecSpace>& a,
                       const CausalConv1dOptions& opts) {
  if (!opts.check_finite) return;
  ConvForward<T, ExecSpace> inputs;
  inputs.x = a.x, inputs.w = a.w, inputs.bias = a.bias, inputs.initial_state = a.initial_state;
  check_conv_finite(op, space, inputs, opts);
  kdnn::impl::check_finite(op, space, "dy", a.dy);
  kdnn::impl::check_finite(op, space, "dfinal_state", a.dfinal_state);
}

template <class ExecSpace, class T>
void causal_conv1d_forward(const ExecSpace& space, const ConvForward<T, ExecSpace>& a,
                           const CausalConv1dOptions& opts) {
  check_conv_forward("ssm::causal_conv1d_forward", a);
  check_conv_finite("ssm::causal_conv1d_forward", space, a, opts);
  conv_forward_steps(space, a, opts, 0, int(a.x.extent(1)));
  if (validate::given(a.final_state)) {
    conv_final_state(space, a.x, a.initial_state, a.final_state,
                     ConvSequenceIds<ExecSpace>(a.seq_idx, {}));
  }
}

/// Every host-side check of causal_conv1d_backward (`op` names the caller).
template <class ExecSpace, class T>
void check_conv_backward(const char* op, const ConvBackward<T, ExecSpace>& a) {
  check_conv_inputs<ExecSpace, T>(op, a.x, a.w, a.bias, a.initial_state);
  validate::sequence_ids(op, a.seq_idx, a.x);
  validate::same_shape(op, "dy", a.dy, "x", a.x);
  validate::same_shape(op, "dx", a.dx, "x", a.x);
  validate::distinct_elements(op, "dx", a.dx);
  validate::same_shape(op, "dw", a.dw, "w", a.w);
  if (validate::given(a.dbias)) validate::extent(op, "dbias", a.dbias, 0, a.x.extent(2), "C");
  if (validate::given(a.dfinal_state)) check_state(op, "dfinal_state", a.dfinal_state, a.x, a.w);
  if (validate::given(a.dinitial_state)) {
    check_state(op, "dinitial_state", a.dinitial_state, a.x, a.w);
    validate::distinct_elements(op, "dinitial_state", a.dinitial_state);
  }
  using validate::memory_of;
  const auto inputs = {memory_of("x", a.x),
                       memory_of("w", a.w),
                       memory_of("bias", a.bias),
                       memory_of("initial_state", a.initial_state),
                       memory_of("dy", a.dy),
                       memory_of("dfinal_state", a.dfinal_state),
                       memory_of("seq_idx", a.seq_idx)};
  validate::disjoint(op,
                     {memory_of("dx", a.dx), memory_of("dw", a.dw), memory_of("dbias", a.dbias),
                      memory_of("dinitial_state", a.dinitial_state)},
                     inputs);
}

template <class ExecSpace, class T>
void causal_conv1d_backward(const ExecSpace& space, const ConvBackward<T, ExecSpace>& a,
                            const CausalConv1dOptions& opts) {
  check_conv_backward("ssm::causal_conv1d_backward", a);
  check_conv_finite("ssm::causal_conv1d_backward", space, a, opts);
  const int K = int(a.w.extent(1));
  if (validate::given(a.dinitial_state)) conv_backward_steps(space, a, opts, -(K - 1), 0, false);
  conv_backward_steps(space, a, opts, 0, int(a.x.extent(1)), true);
}

// The steps that hold the conv's kernels, which the context-parallel conv
// (cp/impl/conv_dt_impl.hpp) launches around its halo exchange: compiled
// once in libkdnn (ssm_eti.cpp) for the pairs of core/impl/eti.hpp, like the
// operators, and declared extern here for every other file.
#define KDNN_CONV_STEPS(PREFIX, ExecSpace, T)                                                      \
  PREFIX void conv_forward_steps<ExecSpace, T>(const ExecSpace&, const ConvForward<T, ExecSpace>&, \
                                               const CausalConv1dOptions&, int, int,               \
                                               const Matrix<const int, ExecSpace>&);               \
  PREFIX void conv_backward_steps<ExecSpace, T>(                                                   \
      const ExecSpace&, const ConvBackward<T, ExecSpace>&, const CausalConv1dOptions&, int, int,   \
      bool, const Matrix<const int, ExecSpace>&);                                                  \
  PREFIX void conv_final_state<ExecSpace, T>(                                                      \
      const ExecSpace&, const StridedTensor3<const T, ExecSpace>&,                                 \
      const StridedTensor3<const T, ExecSpace>&, const StridedTensor3<T, ExecSpace>&,              \
      const ConvSequenceIds<ExecSpace>&);
#define KDNN_CONV_STEPS_EXTERN(ExecSpace, T) KDNN_CONV_STEPS(extern template, ExecSpace, T)
KDNN_ETI_FOR_EACH_STORAGE(KDNN_CONV_STEPS_EXTERN)
#undef KDNN_CONV_STEPS_EXTERN

}  // namespace kdnn::ssm::impl
