// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The fused attention's tables of forms (core/impl/forms.hpp), forward and
// backward: the tensor-core forms (fused_forward_mma_kernel.hpp,
// fused_backward_mma_kernels.hpp) and the GPU forms
// (fused_forward_gpu_kernel.hpp, fused_backward_gpu_kernels.hpp), each at
// the head-size pairs (D, Dv) it is compiled for; the host forms
// (fused_forward_kernel.hpp, fused_backward_kernels.hpp) run every other
// call. The GPU and tensor-core forms mask the columns past a call's head
// sizes, so a call runs on the next larger compiled pair (D = 80 on 128, as
// flash-attn does). The checks, plans and runs of fused_attention_impl.hpp
// walk these tables.
#include <array>

#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/impl/flash_mma_team.hpp"
#include "kdnn/attention/impl/fused_backward_gpu_kernels.hpp"
#include "kdnn/attention/impl/fused_backward_mma_kernels.hpp"
#include "kdnn/attention/impl/fused_forward_gpu_kernel.hpp"
#include "kdnn/attention/impl/fused_forward_mma_kernel.hpp"
#include "kdnn/core/impl/forms.hpp"
#include "kdnn/core/impl/team_mma.hpp"

namespace kdnn::attention::impl {

using kdnn::impl::KernelType;

/// The head-size pairs (D, Dv) of each form.
using MmaHeadPairs = kdnn::impl::SizeGrid<MmaHeadSizes, MmaHeadSizes>;
using FlashHeadPairs = kdnn::impl::SizeGrid<FlashHeadSizes, FlashHeadSizes>;
template <class T>
using FlashBackwardHeadPairs =
    kdnn::impl::SizeGrid<FlashBackwardHeadSizes<T>, FlashBackwardHeadSizes<T>>;

/// The forward on tensor cores at the precision the launch asks for.
template <class ExecSpace, class T>
struct ForwardMmaKernels {
  template <class S, class F>
  static void visit(const Launch& launch, const F& f) {
    kdnn::impl::with_mma_precision<T>(launch, [&](auto p) {
      f(KernelType<
          FusedForwardMmaKernel<ExecSpace, T, S::values[0], S::values[1], decltype(p)::value>>{});
    });
  }
};

/// The forward's GPU form.
template <class ExecSpace, class T>
struct ForwardGpuKernels {
  template <class S, class F>
  static void visit(const Launch&, const F& f) {
    f(KernelType<FusedForwardGpuKernel<ExecSpace, T, S::values[0], S::values[1]>>{});
  }
};

/// The backward on tensor cores: one kernel, which adds dQ too (the second
/// kernel void; launch_backward_teams).
template <class ExecSpace, class T>
struct BackwardMmaKernels {
  template <class S, class F>
  static void visit(const Launch& launch, const F& f) {
    kdnn::impl::with_mma_precision<T>(launch, [&](auto p) {
      f(KernelType<
            FusedBackwardMmaKernel<ExecSpace, T, S::values[0], S::values[1], decltype(p)::value>>{},
        KernelType<void>{});
    });
  }
};

/// The backward's GPU form: dK and dV per key block, then dQ per query block.
template <class ExecSpace, class T>
struct BackwardGpuKernels {
  template <class S, class F>
  static void visit(const Launch&, const F& f) {
    constexpr int HD = S::values[0], HDV = S::values[1];
    f(KernelType<FusedBackwardKVGpuKernel<ExecSpace, T, HD, HDV>>{},
      KernelType<FusedBackwardQGpuKernel<ExecSpace, T, HD, HDV>>{});
  }
};

template <class ExecSpace, class T>
using FusedForwardForms = kdnn::impl::Forms<
    kdnn::impl::Form<KernelForm::tensor_cores, MmaHeadPairs, kdnn::impl::SizeMatch::round_up,
                     ForwardMmaKernels<ExecSpace, T>>,
    kdnn::impl::Form<KernelForm::gpu, FlashHeadPairs, kdnn::impl::SizeMatch::round_up,
                     ForwardGpuKernels<ExecSpace, T>>>;

template <class ExecSpace, class T>
using FusedBackwardForms = kdnn::impl::Forms<
    kdnn::impl::Form<KernelForm::tensor_cores, MmaHeadPairs, kdnn::impl::SizeMatch::round_up,
                     BackwardMmaKernels<ExecSpace, T>>,
    kdnn::impl::Form<KernelForm::gpu, FlashBackwardHeadPairs<T>, kdnn::impl::SizeMatch::round_up,
                     BackwardGpuKernels<ExecSpace, T>>>;

/// The largest head size of axis i (0: D, 1: Dv) that a GPU or tensor-core
/// form of the forward or of the backward runs (the forward's GPU form
/// reaches furthest; the backward's in double stops short of it, its larger
/// sizes run by the host form): past it, only the host form could.
template <class ExecSpace, class T>
constexpr int largest_gpu_head_size(std::size_t i) {
  const int forward = FusedForwardForms<ExecSpace, T>::largest(i);
  const int backward = FusedBackwardForms<ExecSpace, T>::largest(i);
  return forward > backward ? forward : backward;
}

/// The form the forward runs for D and Dv (Forms::chosen).
template <class ExecSpace, class T>
KernelForm forward_form(const ExecSpace& space, const FusedAttentionOptions& opts, int D, int Dv) {
  return FusedForwardForms<ExecSpace, T>::chosen(space, opts.launch.form,
                                                 std::array<int, 2>{D, Dv});
}

/// The form the backward runs for D and Dv.
template <class ExecSpace, class T>
KernelForm backward_form(const ExecSpace& space, const FusedAttentionOptions& opts, int D, int Dv) {
  return FusedBackwardForms<ExecSpace, T>::chosen(space, opts.launch.form,
                                                  std::array<int, 2>{D, Dv});
}

}  // namespace kdnn::attention::impl
