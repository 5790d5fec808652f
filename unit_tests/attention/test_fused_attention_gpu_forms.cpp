// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Where the fused attention's GPU and tensor-core forms run: their compiled
// head sizes within on-chip scratch, and the sizes between them rounded up
// (extra columns masked), against the host form.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "all_sizes.hpp"
#include "allclose.hpp"
#include "allocation_counter.hpp"
#include "central_differences.hpp"
#include "expect_error.hpp"
#include "fused_attention_runs.hpp"
#include "fused_case.hpp"
#include "kdnn/attention/batched_gemm.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/impl/fused_attention_impl.hpp"
#include "mha_reference.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;

TYPED_TEST_SUITE(FusedAttention, Types);

// The GPU forms run where the launch asks for them (always with
// KernelForm::gpu, on a GPU backend with automatic) for D and Dv up to
// their largest compiled head size (the next larger compiled size, the
// extra columns masked); the tensor-core forms where asked for, or
// automatically on a device that has tensor cores, for D and Dv each up to
// 128 (rounded up likewise), the GPU forms' choice for larger sizes. Their
// team scratch
// fits a CUDA team's 48 KiB of level 0 for every pair of them, so on a GPU
// they never take a team workspace.
TEST(FusedAttentionGpuForm, RunsForTheCompiledHeadSizesWithinOnChipScratch) {
  KDNN_TEST_NEEDS_ALL_SIZES();
  using kdnn::KernelForm;
  const bool gpu = !kdnn::impl::BackendTraits<Space>::is_host;
  const bool tensor_cores = kdnn::impl::has_tensor_cores(Space());
  const auto compiled = [](int d) { return d > 0 && d <= 256; };  // rounded up
  const auto mma = [](int d) { return d > 0 && d <= 128; };       // rounded up
  at::FusedAttentionOptions opts;
  for (int D : {16, 32, 48, 64, 128, 256, 512}) {
    for (int Dv : {8, 32, 64, 96, 128, 256}) {
      const std::string pair = "D=" + std::to_string(D) + ", Dv=" + std::to_string(Dv);
      const bool both = compiled(D) && compiled(Dv);
      const bool both_mma = mma(D) && mma(Dv);
      const KernelForm gpu_or_host = both ? KernelForm::gpu : KernelForm::host;
      const KernelForm backward_double =
          both && D <= 128 && Dv <= 128 ? KernelForm::gpu : KernelForm::host;
      const auto forward = [&] {
        return at::impl::forward_form<Space, float>(Space(), opts, D, Dv);
      };
      const auto backward = [&](auto t) {
        return at::impl::backward_form<Space, decltype(t)>(Space(), opts, D, Dv);
      };
      opts.launch.form = KernelForm::gpu;
      EXPECT_EQ(forward(), gpu_or_host) << pair;
      EXPECT_EQ(backward(0.0f), gpu_or_host) << pair;
      // The backward in double: not where either head is past 128 (off-chip).
      EXPECT_EQ(backward(0.0), backward_double) << pair;
      opts.launch.form = KernelForm::tensor_cores;
      EXPECT_EQ(forward(), both_mma ? KernelForm::tensor_cores : gpu_or_host) << pair;
      EXPECT_EQ(backward(0.0), both_mma ? KernelForm::tensor_cores : backward_double) << pair;
      opts.launch.form = KernelForm::automatic;
      EXPECT_EQ(forward(), both_mma && tensor_cores ? KernelForm::tensor_cores
                           : gpu                    ? gpu_or_host
                                                    : KernelForm::host)
          << pair;
      opts.launch.form = KernelForm::host;
      EXPECT_EQ(forward(), KernelForm::host) << pair;
      EXPECT_EQ(backward(0.0f), KernelForm::host) << pair;
    }
  }
  const std::size_t level0 = 48 * 1024 - kdnn::impl::kScratchAlign;
  const auto check = [&](auto sizes) {
    constexpr int D = decltype(sizes)::values[0], Dv = decltype(sizes)::values[1];
    SCOPED_TRACE("D=" + std::to_string(D) + ", Dv=" + std::to_string(Dv));
    EXPECT_LE((at::impl::FusedForwardGpuKernel<Space, float, D, Dv>::scratch_bytes()), level0);
    EXPECT_LE((at::impl::FusedForwardGpuKernel<Space, double, D, Dv>::scratch_bytes()), level0);
    EXPECT_LE((at::impl::FusedBackwardKVGpuKernel<Space, float, D, Dv>::scratch_bytes()), level0);
    EXPECT_LE((at::impl::FusedBackwardQGpuKernel<Space, float, D, Dv>::scratch_bytes()), level0);
    if constexpr (D != 256 && Dv != 256) {
      EXPECT_LE((at::impl::FusedBackwardKVGpuKernel<Space, double, D, Dv>::scratch_bytes()),
                level0);
      EXPECT_LE((at::impl::FusedBackwardQGpuKernel<Space, double, D, Dv>::scratch_bytes()), level0);
    }
  };
  int pairs = 0;
  for (int D : {32, 64, 128, 256}) {
    for (int Dv : {32, 64, 128, 256}) {
      at::impl::FlashHeadPairs::dispatch(std::array<int, 2>{D, Dv}, kdnn::impl::SizeMatch::exact,
                                         [&](auto sizes) {
                                           EXPECT_EQ(decltype(sizes)::values[0], D);
                                           EXPECT_EQ(decltype(sizes)::values[1], Dv);
                                           check(sizes);
                                           ++pairs;
                                         });
    }
  }
  EXPECT_EQ(pairs, 16);

  // The tensor-core forms, within the 40,936 bytes of level 0 that Kokkos
  // 4.6 lets a CUDA team use.
  int mma_pairs = 0;
  for (int D : {32, 64, 128}) {
    for (int Dv : {32, 64, 128}) {
      at::impl::MmaHeadPairs::dispatch(
          std::array<int, 2>{D, Dv}, kdnn::impl::SizeMatch::exact, [&](auto sizes) {
            constexpr int HD = decltype(sizes)::values[0], HDV = decltype(sizes)::values[1];
            constexpr auto full = kdnn::impl::MmaPrecision::full;
            SCOPED_TRACE("D=" + std::to_string(HD) + ", Dv=" + std::to_string(HDV));
            const auto fits = [](std::size_t bytes) { return bytes <= 40936; };
            EXPECT_TRUE(fits(
                at::impl::FusedForwardMmaKernel<Space, float, HD, HDV, full>::scratch_bytes()));
            EXPECT_TRUE(fits(
                at::impl::FusedForwardMmaKernel<Space, double, HD, HDV, full>::scratch_bytes()));
            EXPECT_TRUE(fits(
                at::impl::FusedBackwardMmaKernel<Space, float, HD, HDV, full>::scratch_bytes()));
            EXPECT_TRUE(fits(
                at::impl::FusedBackwardMmaKernel<Space, double, HD, HDV, full>::scratch_bytes()));
            ++mma_pairs;
          });
    }
  }
  EXPECT_EQ(mma_pairs, 9);
}

// Head sizes between the compiled ones (those of real models: 80, 96, 160,
// 192; D != Dv either way) run the GPU and tensor-core forms at the next
// larger compiled pair (the tensor-core forms up to 128, the GPU forms
// beyond), the extra columns zero in their tiles and never stored: forward
// and backward agree with the host form's, with a causal mask,
// grouped-query heads and dropout, and the columns of o, dq, dk and dv past
// the call's own (the rest of wider tensors) keep their values.
TYPED_TEST(FusedAttention, HeadSizesBetweenCompiledOnesRoundUpOnTheGpuForms) {
  KDNN_TEST_NEEDS_ALL_SIZES();
  using T = TypeParam;
  using kdnn::KernelForm;
  unsigned seed = 700;
  const int pad = 8;  // extra columns of the wider outputs
  for (const auto& sizes : std::vector<std::pair<int, int>>{
           {80, 80}, {96, 96}, {160, 160}, {192, 192}, {96, 40}, {40, 160}}) {
    const int D = sizes.first, Dv = sizes.second;  // named: lambdas take them
    const std::string pair = "D=" + std::to_string(D) + ", Dv=" + std::to_string(Dv);
    SCOPED_TRACE(pair);
    const FusedCase c{"", 2, 4, 37, 45, D, Dv, true, {}, {}, {}, {}, 0.1};
    const auto in = random_inputs<T>(c, seed, 2);  // two query heads per k/v head
    const DeviceView<T****>&q = in[0], &k = in[1], &v = in[2], &g = in[3];
    const at::AttentionMask<Space> mask = mask_of(c);
    const auto run = [&](KernelForm form) {
      const at::FusedAttentionOptions opts = case_options(c, 11, 3, form);
      // Outputs as the first columns of wider tensors filled with 7.
      const auto wide = [&](const char* name, int rows, int cols) {
        DeviceView<T****> all(std::string(name), c.B, c.H, rows, cols + pad);
        Kokkos::deep_copy(all, T(7));
        return all;
      };
      const auto first = [](const DeviceView<T****>& all, int cols) {
        return Kokkos::subview(all, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL, std::make_pair(0, cols));
      };
      auto o_all = wide("o", c.S, Dv), dq_all = wide("dq", c.S, D);
      DeviceView<T****> dk_all("dk", c.B, 2, c.Sk, D + pad), dv_all("dv", c.B, 2, c.Sk, Dv + pad);
      Kokkos::deep_copy(dk_all, T(7));
      Kokkos::deep_copy(dv_all, T(7));
      DeviceView<T***> lse("lse", c.B, c.H, c.S);
      const auto o = first(o_all, Dv);
      at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
      at::fused_attention_backward(Space(), q, k, v, o, lse, g, first(dq_all, D), first(dk_all, D),
                                   first(dv_all, Dv), opts, mask);
      return std::vector<std::vector<double>>{to_host(o_all), to_host(lse), to_host(dq_all),
                                              to_host(dk_all), to_host(dv_all)};
    };
    const bool wide = std::max(D, Dv) > 128;
    const auto form_of = [&](KernelForm asked) {
      const at::FusedAttentionOptions opts = case_options(c, 11, 3, asked);
      return std::pair{at::impl::forward_form<Space, T>(Space(), opts, D, Dv),
                       at::impl::backward_form<Space, T>(Space(), opts, D, Dv)};
    };
    // The double backward's GPU form stops at 128 (its tiles' scratch).
    const KernelForm gpu_backward = sizeof(T) > 4 && wide ? KernelForm::host : KernelForm::gpu;
    EXPECT_EQ(form_of(KernelForm::gpu), std::pair(KernelForm::gpu, gpu_backward));
    EXPECT_EQ(form_of(KernelForm::tensor_cores),
              wide ? std::pair(KernelForm::gpu, gpu_backward)
                   : std::pair(KernelForm::tensor_cores, KernelForm::tensor_cores));
    const auto host = run(KernelForm::host);
    // The tensor-core forms' float products are 3×TF32: float's accuracy.
    const double tol = sizeof(T) == 8 ? 1e-12 : 2e-5;
    const char* names[] = {"o", "lse", "dq", "dk", "dv"};
    for (const KernelForm form : {KernelForm::gpu, KernelForm::tensor_cores}) {
      SCOPED_TRACE(form_suffix(form));
      const auto got = run(form);
      for (int x = 0; x < 5; ++x) EXPECT_ALLCLOSE(got[x], host[x], tol, tol) << names[x];
      // The columns past the call's: still 7.
      const auto past_untouched = [&](const std::vector<double>& all, int cols, const char* name) {
        const int width = cols + pad;
        for (std::size_t e = 0; e < all.size(); ++e) {
          if (int(e % width) >= cols && all[e] != 7) {
            ADD_FAILURE() << name << " element " << e << " past column " << cols << " is "
                          << all[e];
            return;
          }
        }
      };
      past_untouched(got[0], Dv, "o");
      past_untouched(got[2], D, "dq");
      past_untouched(got[3], D, "dk");
      past_untouched(got[4], Dv, "dv");
    }
  }
}

}  // namespace
