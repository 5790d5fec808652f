// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The chunked SSD's GPU forms (P, N in {64, 128}, Q <= 256) against its
// host forms and the float64 recurrence: where the launch runs them and
// their scratch within on-chip size; a GPU launch past level 0 bitwise the
// host launch; forward, the output kernel's halves and backward to rounding;
// the scores shared by a group's heads bitwise each head's own.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "all_sizes.hpp"
#include "allclose.hpp"
#include "kdnn/ssm/ssd.hpp"
#include "ssd_reference.hpp"
#include "ssd_runs.hpp"
#include "ssd_test_problems.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
using ssm_ref::SsdCase;
using ssm_ref::Vec;
namespace ssm = kdnn::ssm;

using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Ssd, Types);

// Chunks whose scratch is past on-chip size (Q = N = 64, P = 80, not a
// size of the forward's GPU forms): a GPU launch (forced here) strides a
// bounded league over them in a team workspace (core/impl/team_work.hpp),
// team barriers between chunks, while a host launch gives each chunk its
// team and level-1 scratch. The same kernels: bitwise the same outputs and
// gradients.
TYPED_TEST(Ssd, GpuLaunchPastLevelZeroMatchesTheHostLaunch) {
  using T = TypeParam;
  const Config c{{2, 150, 3, 80, 1, 64}, 64};
  const std::size_t bytes = kdnn::impl::layout_bytes([](kdnn::impl::ScratchCarver& s) {
    ssm::impl::SsdChunkStateKernel<Space, T>::carve(s, 64, 80, 64);
  });
  ASSERT_GT(bytes, kdnn::impl::scratch_capacity<Space>(0)) << "the case must be past level 0";
  const SsdCase a = make_case(c.s, kAll, 900);
  const auto gpu = kdnn::KernelForm::gpu, host = kdnn::KernelForm::host;
  const auto fg = run_forward<T>(a, c.chunk, gpu), fh = run_forward<T>(a, c.chunk, host);
  EXPECT_EQ(fg.y, fh.y);
  EXPECT_EQ(fg.final_state, fh.final_state);
  const auto bg = run_backward<T>(a, c.chunk, gpu), bh = run_backward<T>(a, c.chunk, host);
  const std::vector<std::pair<const char*, std::pair<Vec, Vec>>> grads = {
      {"dx", {bg.dx, bh.dx}},         {"ddt", {bg.ddt, bh.ddt}}, {"dA", {bg.dA, bh.dA}},
      {"dB", {bg.dB, bh.dB}},         {"dC", {bg.dC, bh.dC}},    {"dD", {bg.dD, bh.dD}},
      {"dinit", {bg.dinit, bh.dinit}}};
  for (const auto& [name, pair] : grads) EXPECT_EQ(pair.first, pair.second) << name;
  const auto expected = ssm_ref::ssd_forward(a);
  EXPECT_ALLCLOSE(fg.y, expected.y, tol<T>(), sum_tol<T>(c.s.N * 4.0));
}

// The GPU forms of the chunk kernels (P, N in {64, 128}, Q <= 256;
// ssd_gpu_chunks.hpp) run where the launch asks for them, and only there.
TEST(SsdGpuForm, RunsForItsSizesWithinOnChipScratch) {
  KDNN_TEST_NEEDS_ALL_SIZES();
  namespace impl = ssm::impl;
  const bool gpu = !kdnn::impl::BackendTraits<Space>::is_host;
  kdnn::Launch launch;
  for (int P : {32, 64, 80, 128, 256}) {
    for (int N : {16, 64, 128, 192}) {
      const bool sizes = (P == 64 || P == 128) && (N == 64 || N == 128);
      const std::string pair = "P=" + std::to_string(P) + ", N=" + std::to_string(N);
      launch.form = kdnn::KernelForm::gpu;
      EXPECT_EQ(impl::ssd_gpu_form<Space>(launch, 2, 8, 64, 64, P, N, 2), sizes) << pair;
      EXPECT_EQ(impl::ssd_gpu_form<Space>(launch, 2, 8, 64, 256, P, N, 8), sizes) << pair;
      EXPECT_FALSE(impl::ssd_gpu_form<Space>(launch, 2, 8, 64, 257, P, N, 9)) << pair;
      // Teams past 2^31 − 1: the host form (which the checks bound) runs.
      EXPECT_FALSE(impl::ssd_gpu_form<Space>(launch, 1 << 16, 1 << 10, 8, 64, P, N, 4)) << pair;
      launch.form = kdnn::KernelForm::automatic;
      EXPECT_EQ(impl::ssd_gpu_form<Space>(launch, 2, 8, 64, 64, P, N, 2), sizes && gpu) << pair;
      launch.form = kdnn::KernelForm::host;
      EXPECT_FALSE(impl::ssd_gpu_form<Space>(launch, 2, 8, 64, 64, P, N, 2)) << pair;
    }
  }
  const std::size_t level0 = 48 * 1024 - kdnn::impl::kScratchAlign;
  const auto bytes = [](auto carve) { return kdnn::impl::layout_bytes(carve); };
  int pairs = 0;
  for (int P : {64, 128}) {
    for (int N : {64, 128}) {
      impl::dispatch_ssd_sizes(P, N, [&](auto p, auto n) {
        constexpr int Pc = decltype(p)::value, Nc = decltype(n)::value;
        EXPECT_EQ(Pc, P);
        EXPECT_EQ(Nc, N);
        ++pairs;
        const auto check = [&](auto type) {
          using T = decltype(type);
          const int Q = impl::kSsdGpuMaxChunk;
          EXPECT_LE(bytes([&](kdnn::impl::ScratchCarver& s) {
                      impl::SsdChunkStateGpuKernel<Space, T, Pc, Nc>::carve(s, Q);
                    }),
                    level0)
              << "P=" << P << " N=" << N;
          EXPECT_LE(bytes([&](kdnn::impl::ScratchCarver& s) {
                      impl::SsdChunkOutputGpuKernel<Space, T, Pc, Nc>::carve(s, Q);
                    }),
                    level0)
              << "P=" << P << " N=" << N;
          // The backward's.
          using G = impl::SsdGradient;
          const std::size_t backward[] = {
              bytes([&](kdnn::impl::ScratchCarver& s) {
                impl::SsdGradientGpuKernel<Space, T, Pc, Nc, G::dx>::carve(s, Q);
              }),
              bytes([&](kdnn::impl::ScratchCarver& s) {
                impl::SsdGradientGpuKernel<Space, T, Pc, Nc, G::dB>::carve(s, Q);
              }),
              bytes([&](kdnn::impl::ScratchCarver& s) {
                impl::SsdGradientGpuKernel<Space, T, Pc, Nc, G::dC>::carve(s, Q);
              }),
              bytes([&](kdnn::impl::ScratchCarver& s) {
                impl::SsdDaDiagGpuKernel<Space, T, Pc, Nc>::carve(s, Q);
              }),
              bytes([&](kdnn::impl::ScratchCarver& s) {
                impl::SsdBackwardFinishGpuKernel<Space, T, Pc, Nc>::carve(s, Q);
              })};
          for (const std::size_t b : backward) EXPECT_LE(b, level0) << "P=" << P << " N=" << N;
        };
        check(float());
        check(double());
      });
    }
  }
  EXPECT_EQ(pairs, 4);
}

// The GPU forms (the forward's and the backward's) against the host forms
// and the float64 recurrence: P and N of each compiled size, chunks of one and of several
// row blocks, a Q that is not a multiple of the blocks, a short last chunk,
// G < H, D and the initial state; and the output kernel's halves (Y_diag +
// D·x, then Y_off added, as the context-parallel forward runs them) against
// the whole; the backward under the same launch against the host launch
// and the adjoint recurrence.
// The two forms sum in other orders: agreement to rounding.
TYPED_TEST(Ssd, GpuFormsMatchTheHostForms) {
  using T = TypeParam;
  namespace impl = ssm::impl;
  const Config configs[] = {{{2, 150, 4, 64, 2, 64}, 64},
                            {{1, 100, 2, 128, 1, 64}, 48},
                            {{1, 70, 2, 64, 2, 128}, 128},
                            {{1, 45, 1, 128, 1, 128}, 32},
                            {{1, 300, 2, 64, 1, 64}, 256}};
  unsigned seed = 2300;
  for (const Config& c : configs) {
    SCOPED_TRACE(describe(c, kD | kInit));
    const auto& s = c.s;
    const SsdCase a = make_case(s, kD | kInit, seed += 10);
    const auto gpu = kdnn::KernelForm::gpu;
    const auto fg = run_forward<T>(a, c.chunk, gpu);
    const auto fh = run_forward<T>(a, c.chunk, kdnn::KernelForm::host);
    const double t = form_tol<T>(c);
    EXPECT_ALLCLOSE(fg.y, fh.y, t, t);
    EXPECT_ALLCLOSE(fg.final_state, fh.final_state, t, t);

    EXPECT_ALLCLOSE(output_in_halves<T>(a, options(c.chunk, gpu)), fg.y, t, t);

    // The backward under a GPU launch: every chunk kernel's GPU form.
    const auto bg = run_backward<T>(a, c.chunk, gpu);
    const auto bh = run_backward<T>(a, c.chunk, kdnn::KernelForm::host);
    expect_same_gradients(bg, bh, t);
    expect_recurrence<T>(a, fg, bg);
  }
}

// C·Bᵀ once per group (ssd_chunk_scores_gpu_kernel.hpp): heads that share a
// group read the group's scores, computed by the product the output kernel
// runs itself when each head has its own group. So two heads sharing one
// group give bitwise the y of the same two heads with a group each holding
// copies of that B and C, on every backend (and the backward's dX̃, which
// reads the same scores transposed, the same gradients): chunks of one and
// of several row blocks, a short last chunk, D and the initial state.
TYPED_TEST(Ssd, SharedGroupScoresAreTheHeadsOwnProducts) {
  using T = TypeParam;
  const Config configs[] = {{{2, 150, 2, 64, 1, 64}, 64}, {{1, 70, 4, 64, 1, 128}, 128}};
  unsigned seed = 2500;
  for (const Config& c : configs) {
    SCOPED_TRACE(describe(c, kD | kInit));
    const auto& s = c.s;
    const SsdCase shared = make_case(s, kD | kInit, seed += 10);
    SsdCase own = shared;  // G = H, every group a copy of the one
    own.s.G = s.H;
    own.Bm.assign(std::size_t(s.B) * s.L * s.H * s.N, 0.0);
    own.Cm = own.Bm;
    for (int b = 0; b < s.B; ++b) {
      for (int t = 0; t < s.L; ++t) {
        for (int h = 0; h < s.H; ++h) {
          for (int n = 0; n < s.N; ++n) {
            const std::size_t from = ((std::size_t(b) * s.L + t) * s.G) * s.N + n;
            const std::size_t to = ((std::size_t(b) * s.L + t) * s.H + h) * s.N + n;
            own.Bm[to] = shared.Bm[from];
            own.Cm[to] = shared.Cm[from];
          }
        }
      }
    }
    const auto y_shared = run_forward<T>(shared, c.chunk, kdnn::KernelForm::gpu);
    const auto y_own = run_forward<T>(own, c.chunk, kdnn::KernelForm::gpu);
    EXPECT_EQ(y_shared.y, y_own.y);
    EXPECT_EQ(y_shared.final_state, y_own.final_state);

    // The backward's dX̃ reads B_j·C_i from the same scores: every gradient
    // of a head's own inputs bitwise; dB and dC, the group's sums over its
    // heads, to rounding of those sums.
    const auto g_shared = run_backward<T>(shared, c.chunk, kdnn::KernelForm::gpu);
    const auto g_own = run_backward<T>(own, c.chunk, kdnn::KernelForm::gpu);
    EXPECT_EQ(g_shared.dx, g_own.dx);
    EXPECT_EQ(g_shared.ddt, g_own.ddt);
    EXPECT_EQ(g_shared.dA, g_own.dA);
    EXPECT_EQ(g_shared.dD, g_own.dD);
    EXPECT_EQ(g_shared.dinit, g_own.dinit);
    for (const auto& [name, pair] : std::vector<std::pair<const char*, std::pair<Vec, Vec>>>{
             {"dB", {g_shared.dB, g_own.dB}}, {"dC", {g_shared.dC, g_own.dC}}}) {
      const Vec& group = pair.first;
      const Vec& heads = pair.second;
      ASSERT_EQ(heads.size(), group.size() * s.H) << name;
      for (std::size_t bt = 0; bt < group.size() / s.N; ++bt) {
        for (int n = 0; n < s.N; ++n) {
          double sum = 0, magnitude = 0;
          for (int h = 0; h < s.H; ++h) {
            sum += heads[(bt * s.H + h) * s.N + n];
            magnitude += std::abs(heads[(bt * s.H + h) * s.N + n]);
          }
          ASSERT_NEAR(group[bt * s.N + n], sum,
                      4 * s.H * std::numeric_limits<T>::epsilon() * magnitude)
              << name << " at " << bt << ", " << n;
        }
      }
    }
  }
}

}  // namespace
