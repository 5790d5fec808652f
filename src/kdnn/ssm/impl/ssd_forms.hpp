// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The SSD's table of forms (core/impl/forms.hpp): its chunk kernels' GPU
// forms (ssd_gpu_chunks.hpp) and tensor-core forms (ssd_*_mma_kernel.hpp),
// both at the (P, N) pairs of SsdGpuSizes; the host forms run every other
// call. A step of ssd_steps.hpp visits the table and is handed an SsdStep:
// the form, P and N, and the tensor cores' precision, from which it names
// its kernels.
#include <Kokkos_Core.hpp>
#include <array>
#include <climits>
#include <type_traits>

#include "kdnn/core/impl/backend_traits.hpp"
#include "kdnn/core/impl/forms.hpp"
#include "kdnn/core/impl/team_mma.hpp"
#include "kdnn/ssm/impl/ssd_gpu_chunks.hpp"

namespace kdnn::ssm::impl {

/// The (P, N) pairs of the GPU and tensor-core forms.
using SsdGpuPairs = kdnn::impl::SizeGrid<SsdGpuSizes, SsdGpuSizes>;

/// What a step runs: on tensor cores (mma) or with FMAs, for P and N, at
/// the tensor cores' precision.
template <bool Mma, int P_, int N_, kdnn::impl::MmaPrecision Precision>
struct SsdStep {
  static constexpr bool mma = Mma;
  static constexpr int P = P_, N = N_;
  static constexpr kdnn::impl::MmaPrecision precision = Precision;
};

/// The kernels of one form of the table: an SsdStep for the sizes (and, on
/// tensor cores, the precision the launch asks for in T).
template <class T, KernelForm Form>
struct SsdStepsOf {
  template <class S, class F>
  static void visit(const Launch& launch, const F& f) {
    constexpr int P = S::values[0], N = S::values[1];
    if constexpr (Form == KernelForm::tensor_cores) {
      kdnn::impl::with_mma_precision<T>(
          launch, [&](auto p) { f(SsdStep<true, P, N, decltype(p)::value>{}); });
    } else {
      f(SsdStep<false, P, N, kdnn::impl::MmaPrecision::full>{});
    }
  }
};

template <class T>
using SsdForms = kdnn::impl::Forms<
    kdnn::impl::Form<KernelForm::tensor_cores, SsdGpuPairs, kdnn::impl::SizeMatch::exact,
                     SsdStepsOf<T, KernelForm::tensor_cores>>,
    kdnn::impl::Form<KernelForm::gpu, SsdGpuPairs, kdnn::impl::SizeMatch::exact,
                     SsdStepsOf<T, KernelForm::gpu>>>;

/// Calls run(P, N), two std::integral_constant<int, …>, when (P, N) is one
/// of the table's pairs; says whether it did.
template <class Run>
bool dispatch_ssd_sizes(int P, int N, const Run& run) {
  return SsdGpuPairs::dispatch(std::array<int, 2>{P, N}, kdnn::impl::SizeMatch::exact,
                               [&](auto sizes) {
                                 using S = decltype(sizes);
                                 run(std::integral_constant<int, S::values[0]>{},
                                     std::integral_constant<int, S::values[1]>{});
                               });
}

/// Whether a chunk kernel runs a form of the table: the launch asks for a
/// GPU form, (P, N) is one of its pairs, the chunk fits kSsdGpuMaxChunk, and
/// its teams (`blocks` per chunk) number below 2^31 (else the host form
/// runs).
template <class ExecSpace>
bool ssd_gpu_form(const Launch& launch, long long B, long long H, long long chunks, int Q, int P,
                  int N, int blocks) {
  return kdnn::impl::use_gpu_form<ExecSpace>(launch.form) &&
         SsdGpuPairs::admits(std::array<int, 2>{P, N}, kdnn::impl::SizeMatch::exact) &&
         Q <= kSsdGpuMaxChunk && B * H * chunks * blocks <= INT_MAX;
}

}  // namespace kdnn::ssm::impl
