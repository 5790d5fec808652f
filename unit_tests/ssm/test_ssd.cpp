// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The chunked SSD against the float64 step-by-step recurrence
// (ssd_reference.hpp): forward and backward, chunk sizes that do and do not
// divide L (and Q > L, Q = 1), G ∈ {1, 2, H}, with and without D, the
// initial state and d(final state), P and N that are not multiples of the
// GEMM tile, L = 0, L = 1, B = 0; directional finite differences of kdnn's
// double forward for every gradient; decays that underflow; the pieces
// (Y_diag, the summary, exp(cumsum)); bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/ssm/ssd.hpp"
#include "ssd_reference.hpp"
#include "ssd_runs.hpp"
#include "ssd_views.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
using ssm_ref::SsdCase;
using ssm_ref::SsdShape;
using ssm_ref::Vec;
namespace ssm = kdnn::ssm;

enum Given : unsigned { kD = 1, kInit = 2, kDfinal = 4, kAll = 7 };

/// dt in [0.05, 0.6] and A in [−1.5, −0.2] by default: decays per step of
/// 0.4 … 0.99, so that a chunk sees both fast and slow decay.
SsdCase make_case(SsdShape s, unsigned given, unsigned seed, double a_lo = -1.5,
                  double a_hi = -0.2) {
  SsdCase a;
  a.s = s;
  const std::size_t nx = std::size_t(s.B) * s.L * s.H * s.P;
  const std::size_t nbc = std::size_t(s.B) * s.L * s.G * s.N;
  const std::size_t ns = std::size_t(s.B) * s.H * s.P * s.N;
  a.x = normal(nx, seed);
  a.dt = uniform(std::size_t(s.B) * s.L * s.H, 0.05, 0.6, seed + 1);
  a.A = uniform(s.H, a_lo, a_hi, seed + 2);
  a.Bm = normal(nbc, seed + 3);
  a.Cm = normal(nbc, seed + 4);
  a.dy = normal(nx, seed + 5);
  if (given & kD) a.D = uniform(s.H, -1, 1, seed + 6);
  if (given & kInit) a.init = normal(ns, seed + 7);
  if (given & kDfinal) a.dfinal = normal(ns, seed + 8);
  return a;
}

/// options() of the tensor-core form, with one TF32 pass where allow_tf32.
ssm::SsdOptions tensor_core_options(int chunk, bool allow_tf32) {
  ssm::SsdOptions o = options(chunk, kdnn::KernelForm::tensor_cores);
  o.launch.allow_tf32 = allow_tf32;
  return o;
}

template <class T>
class Ssd : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Ssd, Types);

/// (B, L, H, P, G, N) and a chunk size each: Q divides L, does not, Q > L,
/// Q = 1, Q = L; one group, two, one per head; P and N off the GEMM tile.
struct Config {
  SsdShape s;
  int chunk;
};
const Config kConfigs[] = {{{2, 37, 4, 8, 2, 8}, 8},  {{1, 64, 2, 4, 1, 16}, 16},
                           {{2, 20, 3, 5, 3, 3}, 64}, {{1, 9, 2, 3, 1, 2}, 1},
                           {{1, 50, 4, 6, 4, 5}, 50}, {{2, 1, 2, 4, 2, 4}, 4},
                           {{1, 70, 2, 16, 1, 8}, 32}};

std::string describe(const Config& c, unsigned given) {
  const auto& s = c.s;
  return ::testing::PrintToString(std::vector<int>{s.B, s.L, s.H, s.P, s.G, s.N}) +
         " Q=" + std::to_string(c.chunk) + " given=" + std::to_string(given);
}

TYPED_TEST(Ssd, ForwardMatchesTheRecurrence) {
  using T = TypeParam;
  unsigned seed = 10;
  for (const Config& c : kConfigs) {
    for (unsigned given : {0u, unsigned(kD), unsigned(kAll)}) {
      SCOPED_TRACE(describe(c, given));
      const SsdCase a = make_case(c.s, given, seed += 10);
      const auto expected = ssm_ref::ssd_forward(a);
      const auto actual = run_forward<T>(a, c.chunk);
      const double atol = sum_tol<T>(c.s.N * 4.0);
      EXPECT_ALLCLOSE(actual.y, expected.y, tol<T>(), atol);
      EXPECT_ALLCLOSE(actual.final_state, expected.final_state, tol<T>(), atol);
    }
  }
}

TYPED_TEST(Ssd, BackwardMatchesTheAdjointRecurrence) {
  using T = TypeParam;
  unsigned seed = 500;
  for (const Config& c : kConfigs) {
    for (unsigned given : {0u, unsigned(kDfinal), unsigned(kAll)}) {
      SCOPED_TRACE(describe(c, given));
      const SsdCase a = make_case(c.s, given, seed += 10);
      const auto expected = ssm_ref::ssd_backward(a);
      const auto actual = run_backward<T>(a, c.chunk);
      const auto& s = c.s;
      // Per-step gradients sum over the state (P·N terms, more along the
      // decays); dA and dD over B·L steps, dB and dC over a group's heads.
      const double step = sum_tol<T>(4.0 * s.P * s.N);
      const double param = sum_tol<T>(4.0 * s.P * s.N * s.B * s.L);
      EXPECT_ALLCLOSE(actual.dx, expected.dx, tol<T>(), step);
      EXPECT_ALLCLOSE(actual.ddt, expected.ddt, tol<T>(), step);
      EXPECT_ALLCLOSE(actual.dB, expected.dB, tol<T>(), step * s.H);
      EXPECT_ALLCLOSE(actual.dC, expected.dC, tol<T>(), step * s.H);
      EXPECT_ALLCLOSE(actual.dA, expected.dA, tol<T>(), param);
      EXPECT_ALLCLOSE(actual.dD, expected.dD, tol<T>(), param);
      EXPECT_ALLCLOSE(actual.dinit, expected.dinit, tol<T>(), step);
    }
  }
}

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

/// The forward's y with the output kernel's halves run in turn (Y_diag +
/// D·x, then Y_off added), as the context-parallel forward runs them.
template <class T>
Vec output_in_halves(const SsdCase& a, const ssm::SsdOptions& opts) {
  namespace impl = ssm::impl;
  const auto& s = a.s;
  SsdViews<T> v(a);
  DeviceView<T****> y("y", s.B, s.L, s.H, s.P);
  ssm::SsdForward<T, Space> f;
  v.set_inputs(f);
  f.y = y;
  impl::ChunkStates<T, Space> states;
  impl::ChunkDecays<T, Space> decay;
  impl::chunk_states<Space, T>("test", Space(), f, opts, states, decay);
  impl::state_pass(Space(), states, decay, f.initial_state, kdnn::Tensor4<T, Space>());
  impl::chunk_output("test", Space(), f, opts, states, true, false);
  impl::chunk_output("test", Space(), f, opts, states, false, true);
  return to_host(y);
}

/// Two forms' gradients g and h alike to `t` of each gradient's largest
/// entry (at least 1).
void expect_same_gradients(const ssm_ref::SsdBackwardResult& g, const ssm_ref::SsdBackwardResult& h,
                           double t) {
  for (const auto& [name, pair] :
       std::vector<std::pair<const char*, std::pair<Vec, Vec>>>{{"dx", {g.dx, h.dx}},
                                                                {"ddt", {g.ddt, h.ddt}},
                                                                {"dB", {g.dB, h.dB}},
                                                                {"dC", {g.dC, h.dC}},
                                                                {"dA", {g.dA, h.dA}},
                                                                {"dD", {g.dD, h.dD}},
                                                                {"dinit", {g.dinit, h.dinit}}}) {
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < pair.first.size(); ++i) {
      worst = std::max(worst, std::abs(pair.first[i] - pair.second[i]));
      scale = std::max(scale, std::abs(pair.second[i]));
    }
    EXPECT_LE(worst, t * std::max(1.0, scale)) << name;
  }
}

/// The tolerance of two forms of y that sum Q·N + N·P products of a few
/// units each in other orders.
template <class T>
double form_tol(const Config& c) {
  return 4 * std::numeric_limits<T>::epsilon() * std::sqrt(double(c.chunk + c.s.P) * c.s.N);
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

// The tensor-core products (emulated on a host) against float64 sums of
// the same terms: each error below is the worst of |got − sum| / Σ|terms|.
// 3×TF32 keeps float32 accuracy (a few ulps) and double runs FP64; one TF32
// pass, the caller's explicit choice, is off by up to 2^-10 and measurably
// worse (so the option reaches the kernel).
template <class T, class Error>
void expect_tensor_core_accuracy(const std::vector<Config>& configs, unsigned seed,
                                 const Error& error) {
  for (const Config& c : configs) {
    SCOPED_TRACE(describe(c, 0));
    const SsdCase a = make_case(c.s, 0, seed += 10);
    SsdViews<T> v(a);
    ssm::SsdForward<T, Space> f;
    v.set_inputs(f);
    const double full = error(a, f, tensor_core_options(c.chunk, false));
    EXPECT_LE(full, 8 * std::numeric_limits<T>::epsilon());
    if constexpr (sizeof(T) == 4) {
      const double tf32 = error(a, f, tensor_core_options(c.chunk, true));
      EXPECT_LE(tf32, std::ldexp(1.0, -10));
      EXPECT_GT(tf32, 16 * full);
    }
  }
}

/// C·Bᵀ of every chunk and group (ssd_chunk_scores_mma_kernel.hpp): every
/// stored score of the lower triangle.
template <class T>
double tensor_core_scores_error(const SsdCase& a, const ssm::SsdForward<T, Space>& f,
                                const ssm::SsdOptions& opts) {
  namespace impl = ssm::impl;
  const auto& s = a.s;
  EXPECT_EQ(impl::SsdForms<T>::chosen(Space(), opts.launch.form, std::array<int, 2>{s.P, s.N}),
            kdnn::KernelForm::tensor_cores);
  const auto stored = impl::chunk_group_scores<Space, T>("test", Space(), f, opts);
  const int Q = std::min(opts.chunk, s.L), chunks = (s.L + Q - 1) / Q;
  const std::size_t ld = impl::scores_ld<T>(Q);
  EXPECT_EQ(stored.extent(0), std::size_t(s.B) * chunks * s.G);
  EXPECT_EQ(stored.extent(1), ld * ld);
  const Vec scores = to_host(stored);
  double worst = 0;
  for (int b = 0; b < s.B; ++b) {
    for (int ch = 0; ch < chunks; ++ch) {
      for (int g = 0; g < s.G; ++g) {
        const int row = (b * chunks + ch) * s.G + g, t0 = ch * Q, n = std::min(Q, s.L - t0);
        for (int i = 0; i < n; ++i) {
          for (int j = 0; j <= i; ++j) {
            double cb = 0, magnitude = 0;
            for (int m = 0; m < s.N; ++m) {
              const double ci = a.Cm[((std::size_t(b) * s.L + t0 + i) * s.G + g) * s.N + m];
              const double bj = a.Bm[((std::size_t(b) * s.L + t0 + j) * s.G + g) * s.N + m];
              // The inputs as T holds them.
              const double term = double(T(ci)) * double(T(bj));
              cb += term;
              magnitude += std::abs(term);
            }
            const double err = std::abs(scores[(row * ld + i) * ld + j] - cb) / magnitude;
            if (!std::isfinite(err)) return err;  // fails the caller's bound
            worst = std::max(worst, err);
          }
        }
      }
    }
  }
  return worst;
}

// C·Bᵀ for one group and two, chunks of one and of several row blocks, a
// short last chunk.
TYPED_TEST(Ssd, TensorCoreScoresAreCBTransposedPerGroup) {
  using T = TypeParam;
  expect_tensor_core_accuracy<T>(
      {{{1, 150, 2, 64, 1, 64}, 64}, {{2, 100, 4, 64, 2, 64}, 48}, {{1, 200, 2, 64, 2, 64}, 160}},
      2600, tensor_core_scores_error<T>);
}

/// The chunk states S_c[n, p] = Σ_j B_j[n]·exp(cum_last − cum_j)·dt_j·x_j[p]
/// (ssd_chunk_state_mma_kernel.hpp), and each chunk's total decay.
template <class T>
double tensor_core_state_error(const SsdCase& a, const ssm::SsdForward<T, Space>& f,
                               const ssm::SsdOptions& opts) {
  namespace impl = ssm::impl;
  const auto& s = a.s;
  impl::ChunkStates<T, Space> states;
  impl::ChunkDecays<T, Space> decay;
  impl::chunk_states<Space, T>("test", Space(), f, opts, states, decay);
  const Vec got = to_host(states), got_decay = to_host(decay);
  const int Q = std::min(opts.chunk, s.L), chunks = (s.L + Q - 1) / Q;
  double worst = 0;
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.H; ++h) {
      const int g = h / (s.H / s.G);
      const double A = double(T(a.A[h]));
      for (int ch = 0; ch < chunks; ++ch) {
        const int t0 = ch * Q, n = std::min(Q, s.L - t0);
        std::vector<double> cum(n);
        double run = 0;
        for (int j = 0; j < n; ++j) {
          run += std::max(double(T(a.dt[(std::size_t(b) * s.L + t0 + j) * s.H + h])) * A, -1000.0);
          cum[j] = run;
        }
        const std::size_t row = (std::size_t(b) * s.H + h) * (chunks + 1) + ch;
        EXPECT_NEAR(got_decay[(std::size_t(b) * s.H + h) * chunks + ch], std::exp(run),
                    4 * std::numeric_limits<T>::epsilon());
        for (int m = 0; m < s.N; ++m) {
          for (int p = 0; p < s.P; ++p) {
            double sum = 0, magnitude = 0;
            for (int j = 0; j < n; ++j) {
              const std::size_t t = std::size_t(b) * s.L + t0 + j;
              const double term = double(T(a.Bm[(t * s.G + g) * s.N + m])) *
                                  std::exp(run - cum[j]) * double(T(a.dt[t * s.H + h])) *
                                  double(T(a.x[(t * s.H + h) * s.P + p]));
              sum += term;
              magnitude += std::abs(term);
            }
            const double got_value = got[row * s.N * s.P + std::size_t(m) * s.P + p];
            worst = std::max(worst, std::abs(got_value - sum) / magnitude);
          }
        }
      }
    }
  }
  return worst;
}

// The chunk states for P and N of one block and of several, a short last
// chunk, Q past one tile of steps.
TYPED_TEST(Ssd, TensorCoreChunkStatesAreTheirSums) {
  using T = TypeParam;
  expect_tensor_core_accuracy<T>(
      {{{1, 150, 2, 64, 1, 64}, 64}, {{2, 100, 2, 128, 2, 128}, 48}, {{1, 90, 2, 64, 1, 128}, 256}},
      2800, tensor_core_state_error<T>);
}

/// The backward's gradients on tensor cores (ssd_gradient_mma_kernel.hpp)
/// for chunk states H_c and their gradients dH_{c+1} drawn at random, dX̃
/// through dx = dt·dX̃ (no D), dB and dC per head:
///   dX̃_j[p] = dend_j·Σ_n B_j[n]·dH[n, p] + Σ_{i≥j} (C_i·B_j)·m_ij·dY_i[p]
///   dB_j[n] = dend_j·Σ_p X̃_j[p]·dH[n, p] + Σ_{i≥j} (dY_i·X̃_j)·m_ij·C_i[n]
///   dC_i[n] = e_i·Σ_p dY_i[p]·H[n, p]    + Σ_{j≤i} (dY_i·X̃_j)·m_ij·B_j[n]
/// The worst error of the three.
template <class T>
double tensor_core_gradient_error(const SsdCase& a, const ssm::SsdForward<T, Space>&,
                                  const ssm::SsdOptions& opts) {
  namespace impl = ssm::impl;
  const auto& s = a.s;
  const ssm_ref::SsdIndex ix{s};
  const int Q = std::min(opts.chunk, s.L), chunks = (s.L + Q - 1) / Q;
  const std::size_t state_values = std::size_t(s.B) * s.H * chunks * s.N * s.P;
  const Vec hs = normal(state_values, 4141), dhs = normal(state_values, 4242);
  SsdViews<T> v(a);
  ssm::SsdBackward<T, Space> args;
  v.set_inputs(args);
  args.dy = v.dy;
  const auto states = to_device<T****>(hs, s.B, s.H, chunks, std::size_t(s.N) * s.P);
  const auto dstates = to_device<T****>(dhs, s.B, s.H, chunks, std::size_t(s.N) * s.P);
  impl::SsdGradients<Space, T> g;
  g.dx = DeviceView<T****>("dx", s.B, s.L, s.H, s.P);
  g.dBh = DeviceView<T****>("dBh", s.B, s.L, s.H, s.N);
  g.dCh = DeviceView<T****>("dCh", s.B, s.L, s.H, s.N);
  const auto steps = [&] {
    return typename impl::SsdStepSums<Space>::Steps("sums", s.B, s.H, s.L);
  };
  const impl::SsdStepSums<Space> sums{steps(), steps(), steps(), steps()};
  EXPECT_TRUE(impl::mma_gradients("test", Space(), args, opts, states, dstates, g, sums));
  const Vec dx = to_host(g.dx), dB = to_host(g.dBh), dC = to_host(g.dCh);
  const auto in = [](double value) { return double(T(value)); };  // as T holds it
  double worst = 0;
  // Adds |got − sum| / magnitude to worst.
  const auto check = [&](double got, double sum, double magnitude) {
    const double err = std::abs(got - sum) / magnitude;
    worst = std::isfinite(err) ? std::max(worst, err) : err;
    return std::isfinite(err);
  };
  // u·w of two rows of `count` values, and Σ|u·w|.
  const auto dot = [](const auto& u, const auto& w, int count, double& magnitude) {
    double sum = 0;
    magnitude = 0;
    for (int q = 0; q < count; ++q) {
      sum += u(q) * w(q);
      magnitude += std::abs(u(q) * w(q));
    }
    return sum;
  };
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.H; ++h) {
      const double A = double(T(a.A[h]));
      for (int ch = 0; ch < chunks; ++ch) {
        const int t0 = ch * Q, n = std::min(Q, s.L - t0);
        std::vector<double> cum(n);
        double run = 0;
        for (int j = 0; j < n; ++j) {
          run += std::max(double(T(a.dt[ix.dt(b, t0 + j, h)])) * A, -1000.0);
          cum[j] = run;
        }
        const std::size_t state0 = ((std::size_t(b) * s.H + h) * chunks + ch) * s.N * s.P;
        const auto Bv = [&](int j) {
          return [&, j](int m) { return in(a.Bm[ix.bc(b, t0 + j, h, m)]); };
        };
        const auto Cv = [&](int i) {
          return [&, i](int m) { return in(a.Cm[ix.bc(b, t0 + i, h, m)]); };
        };
        const auto dYv = [&](int i) {
          return [&, i](int p) { return in(a.dy[ix.x(b, t0 + i, h, p)]); };
        };
        const auto Xt = [&](int j) {
          return [&, j](int p) {
            return in(a.dt[ix.dt(b, t0 + j, h)]) * in(a.x[ix.x(b, t0 + j, h, p)]);
          };
        };
        for (int r = 0; r < n; ++r) {
          const double dend = std::exp(cum[n - 1] - cum[r]), e = std::exp(cum[r]);
          const double dtr = in(a.dt[ix.dt(b, t0 + r, h)]);
          // Per partner step s: C_s·B_r (dX̃), dY_s·X̃_r (dB), dY_r·X̃_s (dC).
          std::vector<double> cb(n), cb_mag(n), vb(n), vb_mag(n), vc(n), vc_mag(n);
          for (int q = 0; q < n; ++q) {
            if (q >= r) cb[q] = dot(Cv(q), Bv(r), s.N, cb_mag[q]);
            if (q >= r) vb[q] = dot(dYv(q), Xt(r), s.P, vb_mag[q]);
            if (q <= r) vc[q] = dot(dYv(r), Xt(q), s.P, vc_mag[q]);
          }
          for (int p = 0; p < s.P; ++p) {  // dX̃
            double mag = 0;
            double sum =
                dend * dot(
                           Bv(r), [&](int m) { return in(dhs[state0 + m * s.P + p]); }, s.N, mag);
            mag *= dend;
            for (int q = r; q < n; ++q) {
              const double m = std::exp(cum[q] - cum[r]), d = dYv(q)(p);
              sum += cb[q] * m * d;
              mag += cb_mag[q] * m * std::abs(d);
            }
            if (!check(dx[ix.x(b, t0 + r, h, p)], dtr * sum, dtr * mag)) return worst;
          }
          const std::size_t row = (std::size_t(b) * s.L + t0 + r) * s.H + h;
          for (int m = 0; m < s.N; ++m) {
            double mag_b = 0, mag_c = 0;
            double sum_b =
                dend * dot(
                           Xt(r), [&](int p) { return in(dhs[state0 + m * s.P + p]); }, s.P, mag_b);
            double sum_c =
                e * dot(
                        dYv(r), [&](int p) { return in(hs[state0 + m * s.P + p]); }, s.P, mag_c);
            mag_b *= dend;
            mag_c *= e;
            for (int q = r; q < n; ++q) {  // dB: the later steps
              const double w = std::exp(cum[q] - cum[r]), c = Cv(q)(m);
              sum_b += vb[q] * w * c;
              mag_b += vb_mag[q] * w * std::abs(c);
            }
            for (int q = 0; q <= r; ++q) {  // dC: the earlier steps
              const double w = std::exp(cum[r] - cum[q]), bq = Bv(q)(m);
              sum_c += vc[q] * w * bq;
              mag_c += vc_mag[q] * w * std::abs(bq);
            }
            if (!check(dB[row * s.N + m], sum_b, mag_b)) return worst;
            if (!check(dC[row * s.N + m], sum_c, mag_c)) return worst;
          }
        }
      }
    }
  }
  return worst;
}

// dX̃, dB and dC for P and N of each size, one group and two, chunks of one
// and of several row blocks, a short last chunk.
TYPED_TEST(Ssd, TensorCoreGradientsAreTheirSums) {
  using T = TypeParam;
  expect_tensor_core_accuracy<T>(
      {{{1, 150, 2, 64, 1, 64}, 64}, {{2, 100, 4, 128, 2, 64}, 48}, {{1, 90, 2, 64, 2, 128}, 256}},
      2900, tensor_core_gradient_error<T>);
}

// The SSD with its chunk products on tensor cores (KernelForm::tensor_cores,
// emulated on a host): forward and backward against the float64
// recurrence, and against the FMA GPU form to rounding (the products sum
// in another order), with H = G (the scores then computed once per head
// here, where the FMA form computes them inside its kernels) and H > G,
// P of one column block and of two; the output kernel's halves against the
// whole.
TYPED_TEST(Ssd, TensorCoreFormMatchesTheRecurrenceAndTheGpuForm) {
  using T = TypeParam;
  const Config configs[] = {{{2, 150, 4, 64, 2, 64}, 64},
                            {{1, 100, 2, 64, 2, 128}, 48},
                            {{1, 90, 2, 128, 1, 64}, 256},
                            {{1, 45, 1, 128, 1, 128}, 32}};
  unsigned seed = 2700;
  for (const Config& c : configs) {
    SCOPED_TRACE(describe(c, kD | kInit));
    const SsdCase a = make_case(c.s, kD | kInit, seed += 10);
    const auto tc = kdnn::KernelForm::tensor_cores;
    const auto ft = run_forward<T>(a, c.chunk, tc);
    const auto fg = run_forward<T>(a, c.chunk, kdnn::KernelForm::gpu);
    const auto bt = run_backward<T>(a, c.chunk, tc);
    const auto bg = run_backward<T>(a, c.chunk, kdnn::KernelForm::gpu);
    expect_recurrence<T>(a, ft, bt);
    const double t = form_tol<T>(c);
    EXPECT_ALLCLOSE(ft.y, fg.y, t, t);
    EXPECT_ALLCLOSE(ft.final_state, fg.final_state, t, t);
    EXPECT_ALLCLOSE(output_in_halves<T>(a, options(c.chunk, tc)), ft.y, t, t);
    expect_same_gradients(bt, bg, t);
  }
}

// The fused backward (ssm::ssd_backward) against the two halves the
// context-parallel backward launches: the same terms in the same order,
// except that a compiler may vectorise a reduction over P in one and not in
// the other (the halves read and write dx in place): agreement to a few
// roundings of a P-term sum, far inside the reference tolerance, for every
// configuration (G < H included, where dB and dC go through per-head
// buffers) and both launch forms.
TYPED_TEST(Ssd, FusedBackwardMatchesTheTwoHalves) {
  using T = TypeParam;
  unsigned seed = 1700;
  for (const Config& c : kConfigs) {
    for (const auto form : {kdnn::KernelForm::host, kdnn::KernelForm::gpu}) {
      SCOPED_TRACE(describe(c, kAll) + (form == kdnn::KernelForm::gpu ? " gpu" : " host"));
      const SsdCase a = make_case(c.s, kAll, seed += 10);
      const auto fused = run_backward<T>(a, c.chunk, form);
      const auto halves = run_backward<T>(a, c.chunk, form, BackwardInHalves());
      const double t = 16.0 * c.s.P * std::numeric_limits<T>::epsilon();
      EXPECT_ALLCLOSE(fused.dx, halves.dx, t, t);
      EXPECT_ALLCLOSE(fused.ddt, halves.ddt, t, t);
      EXPECT_ALLCLOSE(fused.dA, halves.dA, t, t);
      EXPECT_ALLCLOSE(fused.dB, halves.dB, t, t);
      EXPECT_ALLCLOSE(fused.dC, halves.dC, t, t);
      EXPECT_ALLCLOSE(fused.dD, halves.dD, t, t);
      EXPECT_ALLCLOSE(fused.dinit, halves.dinit, t, t);
    }
  }
}

// D per channel ([H·P], mamba's (nheads, headdim)), in every form: y is the
// y without D plus D[h·P + p]·x, dx the dx without D plus D·dy, dD the sums
// Σ_{b,t} dy·x (against double loops), and every other gradient bitwise
// the one without D. Shapes of the host form only and of the GPU forms.
TYPED_TEST(Ssd, PerChannelSkipIsDTimesXOnTop) {
  using T = TypeParam;
  const Config configs[] = {{{2, 37, 3, 5, 1, 4}, 8}, {{1, 150, 2, 64, 2, 64}, 64}};
  unsigned seed = 4100;
  for (const Config& c : configs) {
    const auto& s = c.s;
    const SsdCase a = make_case(s, kInit | kDfinal, seed += 10);
    const SsdViews<T> v(a);
    const std::size_t HP = std::size_t(s.H) * s.P;
    const auto d_host = normal(HP, seed + 1);
    const auto D = to_device<T*>(d_host, HP);
    const auto x = to_host(v.x), dy = to_host(v.dy);
    for (const auto form :
         {kdnn::KernelForm::host, kdnn::KernelForm::gpu, kdnn::KernelForm::tensor_cores}) {
      SCOPED_TRACE(describe(c, kInit | kDfinal) + " form " + std::to_string(int(form)));
      const auto opts = options(c.chunk, form);
      const auto forward = [&](const DeviceView<T*>& skip) {
        DeviceView<T****> y("y", s.B, s.L, s.H, s.P);
        ssm::SsdForward<T, Space> args;
        v.set_inputs(args);
        args.D = skip;
        args.y = y;
        ssm::ssd_forward(Space(), args, opts);
        return to_host(y);
      };
      const auto backward = [&](const DeviceView<T*>& skip, std::size_t d_count) {
        DeviceView<T****> dx("dx", s.B, s.L, s.H, s.P), dB("dB", s.B, s.L, s.G, s.N),
            dC("dC", s.B, s.L, s.G, s.N), dinit("dinit", s.B, s.H, s.P, s.N);
        DeviceView<T***> ddt("ddt", s.B, s.L, s.H);
        DeviceView<T*> dA("dA", s.H), dD("dD", d_count);
        Kokkos::deep_copy(dD, T(99));  // overwritten
        ssm::SsdBackward<T, Space> args;
        v.set_inputs(args);
        args.D = skip;
        args.dy = v.dy, args.dfinal_state = v.dfinal;
        args.dx = dx, args.ddt = ddt, args.dA = dA, args.dB = dB, args.dC = dC, args.dD = dD;
        args.dinitial_state = dinit;
        ssm::ssd_backward(Space(), args, opts);
        return std::vector<std::vector<double>>{to_host(dx), to_host(ddt), to_host(dA),
                                                to_host(dB), to_host(dC),  to_host(dinit),
                                                to_host(dD)};
      };
      const auto y0 = forward(DeviceView<T*>()), y1 = forward(D);
      const auto g0 = backward(DeviceView<T*>(), HP), g1 = backward(D, HP);
      std::vector<double> y_want(y0.size()), dx_want(y0.size()), dD_want(HP, 0.0);
      for (std::size_t e = 0; e < y0.size(); ++e) {
        const std::size_t channel = e % HP;  // [B, L, H, P]: (h, p) = e mod H·P
        y_want[e] = y0[e] + d_host[channel] * x[e];
        dx_want[e] = g0[0][e] + d_host[channel] * dy[e];
        dD_want[channel] += dy[e] * x[e];
      }
      EXPECT_ALLCLOSE(y1, y_want, tol<T>(), tol<T>()) << "y";
      EXPECT_ALLCLOSE(g1[0], dx_want, tol<T>(), tol<T>()) << "dx";
      for (int k = 1; k < 6; ++k) EXPECT_EQ(g1[k], g0[k]) << k;
      EXPECT_ALLCLOSE(g1[6], dD_want, tol<T>(), sum_tol<T>(s.B * s.L)) << "dD";
      // Without D, dD of H·P values is the same sums.
      EXPECT_ALLCLOSE(g0[6], dD_want, tol<T>(), sum_tol<T>(s.B * s.L)) << "dD without D";
    }
  }
}

TYPED_TEST(Ssd, EmptySequenceAndBatch) {
  using T = TypeParam;
  for (SsdShape s : {SsdShape{2, 0, 2, 3, 1, 4}, SsdShape{0, 5, 2, 3, 2, 4}}) {
    SCOPED_TRACE(s.B);
    const SsdCase a = make_case(s, kAll, 3);
    const auto f = run_forward<T>(a, 4);
    const auto b = run_backward<T>(a, 4);
    const auto ef = ssm_ref::ssd_forward(a);
    const auto eb = ssm_ref::ssd_backward(a);
    // L = 0: the final state is the initial state, d(initial) = d(final).
    EXPECT_ALLCLOSE(f.final_state, ef.final_state, tol<T>(), tol<T>());
    EXPECT_ALLCLOSE(b.dinit, eb.dinit, tol<T>(), tol<T>());
    EXPECT_ALLCLOSE(b.dA, Vec(s.H, 0.0), 0, 0);
    EXPECT_ALLCLOSE(b.dD, Vec(s.H, 0.0), 0, 0);
  }
}

/// Σ y·dy + Σ final·dfinal: the scalar whose gradient the backward returns.
double loss(const ssm_ref::SsdForwardResult& r, const SsdCase& a) {
  double l = 0;
  for (std::size_t i = 0; i < r.y.size(); ++i) l += r.y[i] * a.dy[i];
  for (std::size_t i = 0; i < a.dfinal.size(); ++i) l += r.final_state[i] * a.dfinal[i];
  return l;
}

TEST(SsdGradient, KdnnMatchesFiniteDifferencesOfItsForward) {
  for (const Config& c : {Config{{2, 23, 4, 5, 2, 3}, 8}, Config{{1, 12, 2, 4, 1, 4}, 5}}) {
    SCOPED_TRACE(describe(c, kAll));
    const SsdCase a = make_case(c.s, kAll, 900);
    const auto grad = run_backward<double>(a, c.chunk);
    const auto forward = [&](const SsdCase& p) { return run_forward<double>(p, c.chunk); };
    const struct {
      Vec SsdCase::*input;
      const Vec* gradient;
      const char* name;
    } inputs[] = {{&SsdCase::x, &grad.dx, "x"},         {&SsdCase::dt, &grad.ddt, "dt"},
                  {&SsdCase::A, &grad.dA, "A"},         {&SsdCase::Bm, &grad.dB, "B"},
                  {&SsdCase::Cm, &grad.dC, "C"},        {&SsdCase::D, &grad.dD, "D"},
                  {&SsdCase::init, &grad.dinit, "init"}};
    for (const auto& in : inputs) {
      SCOPED_TRACE(in.name);
      const Vec dir = normal((a.*in.input).size(), 4242);
      const double eps = 1e-6;
      SsdCase plus = a, minus = a;
      for (std::size_t i = 0; i < dir.size(); ++i) {
        (plus.*in.input)[i] += eps * dir[i];
        (minus.*in.input)[i] -= eps * dir[i];
      }
      const double fd = (loss(forward(plus), a) - loss(forward(minus), a)) / (2 * eps);
      double exact = 0;
      for (std::size_t i = 0; i < dir.size(); ++i) exact += (*in.gradient)[i] * dir[i];
      EXPECT_NEAR(exact, fd, 1e-6 * (std::abs(fd) + 1));
    }
  }
}

TYPED_TEST(Ssd, DecaysThatUnderflowGiveFiniteResults) {
  using T = TypeParam;
  // dt·A down to −60 per step over 600 steps: exp(cum) underflows in every
  // chunk after the first steps, in float and in double.
  SsdCase a = make_case({1, 600, 2, 4, 1, 4}, kAll, 31, -100, -20);
  const auto expected_f = ssm_ref::ssd_forward(a);
  const auto expected_b = ssm_ref::ssd_backward(a);
  const auto f = run_forward<T>(a, 64);
  const auto b = run_backward<T>(a, 64);
  for (const Vec* v : {&f.y, &f.final_state, &b.dx, &b.ddt, &b.dA, &b.dB, &b.dC, &b.dD, &b.dinit}) {
    for (double e : *v) ASSERT_TRUE(std::isfinite(e));
  }
  EXPECT_ALLCLOSE(f.y, expected_f.y, tol<T>(), sum_tol<T>(16));
  EXPECT_ALLCLOSE(b.dx, expected_b.dx, tol<T>(), sum_tol<T>(16));
  EXPECT_ALLCLOSE(b.ddt, expected_b.ddt, tol<T>(), sum_tol<T>(64));
  EXPECT_ALLCLOSE(b.dA, expected_b.dA, tol<T>(), sum_tol<T>(16 * 600));
}

TYPED_TEST(Ssd, ChunksLongerThanTheSequenceActAsOneChunk) {
  using T = TypeParam;
  // Q far past L (up to INT_MAX, where ceil(L/Q) computed in int wraps)
  // gives the one-chunk result, forward and backward, without sizing
  // anything by Q.
  for (int L : {1, 3, 10}) {
    for (int Q : {1000, INT_MAX - 8, INT_MAX}) {
      SCOPED_TRACE("L=" + std::to_string(L) + " Q=" + std::to_string(Q));
      const SsdCase a = make_case({2, L, 2, 3, 1, 4}, kAll, 70);
      const auto ef = ssm_ref::ssd_forward(a);
      const auto eb = ssm_ref::ssd_backward(a);
      const auto f = run_forward<T>(a, Q);
      const auto b = run_backward<T>(a, Q);
      const double atol = sum_tol<T>(16);
      EXPECT_ALLCLOSE(f.y, ef.y, tol<T>(), atol);
      EXPECT_ALLCLOSE(f.final_state, ef.final_state, tol<T>(), atol);
      EXPECT_ALLCLOSE(b.dx, eb.dx, tol<T>(), atol);
      EXPECT_ALLCLOSE(b.ddt, eb.ddt, tol<T>(), atol);
      EXPECT_ALLCLOSE(b.dA, eb.dA, tol<T>(), atol * L);
      EXPECT_ALLCLOSE(b.dB, eb.dB, tol<T>(), atol);
      EXPECT_ALLCLOSE(b.dC, eb.dC, tol<T>(), atol);
      EXPECT_ALLCLOSE(b.dinit, eb.dinit, tol<T>(), atol);
    }
  }
}

TYPED_TEST(Ssd, DecaysOverTheWholeFiniteRangeGiveTheRecurrence) {
  using T = TypeParam;
  // A at the end of T's finite range: dt·A overflows to −inf in double for
  // dt > 1, and every decay underflows. Heads with moderate A beside them
  // must be unaffected, and no output may be NaN.
  const double huge = -0.3 * double(std::numeric_limits<T>::max());
  for (const int Q : {4, 64}) {
    SCOPED_TRACE(Q);
    SsdCase a = make_case({2, 23, 3, 4, 1, 4}, kAll, 80);
    a.A = {huge, -0.5, huge / 1e3};
    for (double& dt : a.dt) dt *= 8;  // dt in [0.4, 4.8]
    const auto ef = ssm_ref::ssd_forward(a);
    const auto eb = ssm_ref::ssd_backward(a);
    const auto f = run_forward<T>(a, Q);
    const auto b = run_backward<T>(a, Q);
    for (const Vec* v :
         {&f.y, &f.final_state, &b.dx, &b.ddt, &b.dA, &b.dB, &b.dC, &b.dD, &b.dinit}) {
      for (double e : *v) ASSERT_TRUE(std::isfinite(e));
    }
    const double atol = sum_tol<T>(64);
    EXPECT_ALLCLOSE(f.y, ef.y, tol<T>(), atol);
    EXPECT_ALLCLOSE(f.final_state, ef.final_state, tol<T>(), atol);
    EXPECT_ALLCLOSE(b.dx, eb.dx, tol<T>(), atol);
    EXPECT_ALLCLOSE(b.ddt, eb.ddt, tol<T>(), atol);
    EXPECT_ALLCLOSE(b.dA, eb.dA, tol<T>(), atol);
    EXPECT_ALLCLOSE(b.dB, eb.dB, tol<T>(), atol);
    EXPECT_ALLCLOSE(b.dinit, eb.dinit, tol<T>(), atol);
  }
}

/// ‖got − want‖ / ‖want‖.
double rel_norm_error(const Vec& got, const Vec& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

TEST(SsdAccuracy, Float32DaWhenDecaysUnderflowInsideAChunk) {
  // dt ≈ 2 and A in [−13.6, −5]: each step decays by e^−10 … e^−27, so a
  // float decay from the chunk's start underflows within a few steps. dA is a
  // sum of tiny terms; computed as the difference of two large cumulative
  // sums it loses its digits. Float32 must stay close to the float64 truth
  // (float32 PyTorch, by autograd through a masked segment sum, gets ~1e-4).
  for (const Config& c : {Config{{2, 100, 4, 16, 4, 16}, 64}, Config{{1, 200, 2, 8, 1, 8}, 32}}) {
    SCOPED_TRACE(describe(c, kAll));
    SsdCase a = make_case(c.s, kAll, 95, -13.6, -5);
    for (double& dt : a.dt) dt = 1.8 + dt / 3;  // [1.82, 2.0]
    for (auto* v : {&a.x, &a.dt, &a.A, &a.Bm, &a.Cm, &a.D, &a.init, &a.dy, &a.dfinal}) {
      for (double& e : *v) e = double(float(e));  // what a float32 run reads
    }
    const auto expected = ssm_ref::ssd_backward(a);
    const auto actual = run_backward<float>(a, c.chunk);
    EXPECT_LT(rel_norm_error(actual.dA, expected.dA), 2e-5);
    EXPECT_LT(rel_norm_error(actual.ddt, expected.ddt), 2e-5);
  }
}

// check_dt refuses a negative step; a NaN or an infinity is check_finite's
// (without it, it propagates, as in PyTorch).
TEST(SsdErrors, CheckDtRefusesNegativeStepsAndCheckFiniteNonFiniteOnes) {
  using T = double;
  const SsdShape s{2, 10, 4, 3, 2, 2};
  const SsdCase a = make_case(s, kAll, 5);
  SsdViews<T> v(a);
  DeviceView<T****> y("y", s.B, s.L, s.H, s.P);
  ssm::SsdForward<T, Space> f;
  v.set_inputs(f);
  f.y = y;
  ssm::SsdOptions opts;
  opts.check_dt = true;
  EXPECT_NO_THROW(ssm::ssd_forward(Space(), f, opts));
  for (const double bad : {-0.5, double(NAN), double(INFINITY)}) {
    auto dt = a.dt;
    dt[(1 * s.L + 7) * s.H + 2] = bad;  // [1, 7, 2]
    dt[(1 * s.L + 8) * s.H + 0] = -1;   // a later one
    f.dt = to_device<T***>(dt, s.B, s.L, s.H);
    const std::string first = bad < 0 ? "dt[1, 7, 2]=-0.5" : "dt[1, 8, 0]=-1";
    EXPECT_KDNN_ERROR(ssm::ssd_forward(Space(), f, opts), first + ", expected dt >= 0 (check_dt)");
    ssm::SsdOptions finite;
    finite.check_finite = true;
    if (bad < 0) {
      EXPECT_NO_THROW(ssm::ssd_forward(Space(), f, finite));  // finite, if negative
    } else {
      EXPECT_KDNN_ERROR(ssm::ssd_forward(Space(), f, finite),
                        std::string("dt[1, 7, 2]=") + (bad > 0 ? "inf" : "nan") +
                            ", expected finite values (check_finite)");
    }
    EXPECT_NO_THROW(ssm::ssd_forward(Space(), f, ssm::SsdOptions()));  // not checked unless asked
  }
}

TYPED_TEST(Ssd, PiecesMatchTheirDefinitions) {
  using T = TypeParam;
  const SsdShape s{2, 29, 4, 5, 2, 3};
  const int Q = 8, chunks = 4;
  const SsdCase a = make_case(s, kD | kInit, 71);
  SsdViews<T> v(a);

  // Y_diag + D·x: each chunk on its own from a zero state.
  DeviceView<T****> y("y", s.B, s.L, s.H, s.P);
  ssm::SsdForward<T, Space> f;
  v.set_inputs(f);
  f.y = y;
  ssm::ssd_diag(Space(), f, {Q});
  Vec expected(a.x.size());
  for (int c = 0; c < chunks; ++c) {
    const int t0 = c * Q, n = std::min(Q, s.L - t0);
    SsdCase piece = a;
    piece.s.L = n;
    piece.init.clear();
    const ssm_ref::SsdIndex whole{s}, part{piece.s};
    piece.x.assign(std::size_t(s.B) * n * s.H * s.P, 0);
    piece.dt.assign(std::size_t(s.B) * n * s.H, 0);
    piece.Bm.assign(std::size_t(s.B) * n * s.G * s.N, 0);
    piece.Cm = piece.Bm;
    for (int b = 0; b < s.B; ++b)
      for (int t = 0; t < n; ++t)
        for (int h = 0; h < s.H; ++h) {
          piece.dt[part.dt(b, t, h)] = a.dt[whole.dt(b, t0 + t, h)];
          for (int p = 0; p < s.P; ++p) piece.x[part.x(b, t, h, p)] = a.x[whole.x(b, t0 + t, h, p)];
          for (int j = 0; j < s.N; ++j) {
            piece.Bm[part.bc(b, t, h, j)] = a.Bm[whole.bc(b, t0 + t, h, j)];
            piece.Cm[part.bc(b, t, h, j)] = a.Cm[whole.bc(b, t0 + t, h, j)];
          }
        }
    const auto r = ssm_ref::ssd_forward(piece);
    for (int b = 0; b < s.B; ++b)
      for (int t = 0; t < n; ++t)
        for (int h = 0; h < s.H; ++h)
          for (int p = 0; p < s.P; ++p)
            expected[whole.x(b, t0 + t, h, p)] = r.y[part.x(b, t, h, p)];
  }
  EXPECT_ALLCLOSE(to_host(y), expected, tol<T>(), sum_tol<T>(12));

  // The summary: exp(Σ dt·A) and the final state from a zero state.
  DeviceView<T**> decay("decay", s.B, s.H);
  DeviceView<T****> local("local", s.B, s.H, s.P, s.N);
  ssm::SsdSummary<T, Space> sum;
  sum.x = v.x;
  sum.dt = v.dt;
  sum.A = v.A;
  sum.B = v.Bm;
  sum.C = v.Cm;
  sum.decay = decay;
  sum.local_state = local;
  ssm::ssd_summary(Space(), sum, {Q});
  SsdCase zero = a;
  zero.init.clear();
  EXPECT_ALLCLOSE(to_host(local), ssm_ref::ssd_forward(zero).final_state, tol<T>(), sum_tol<T>(12));
  Vec total(std::size_t(s.B) * s.H), cumexp(std::size_t(s.B) * s.H * chunks * Q, 0.0);
  const ssm_ref::SsdIndex ix{s};
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h) {
      double all = 0;
      for (int c = 0; c < chunks; ++c) {
        double cum = 0;
        for (int i = 0; i < Q && c * Q + i < s.L; ++i) {
          cum += a.dt[ix.dt(b, c * Q + i, h)] * a.A[h];
          cumexp[((std::size_t(b) * s.H + h) * chunks + c) * Q + i] = std::exp(cum);
        }
        all += cum;
      }
      total[std::size_t(b) * s.H + h] = std::exp(all);
    }
  EXPECT_ALLCLOSE(to_host(decay), total, tol<T>(), tol<T>());

  DeviceView<T****> ce("cumexp", s.B, s.H, chunks, Q);
  ssm::ssd_decay_cumsum(Space(), kdnn::Tensor3<const T, Space>(v.dt),
                        kdnn::Vector<const T, Space>(v.A), ce, {Q});
  EXPECT_ALLCLOSE(to_host(ce), cumexp, tol<T>(), tol<T>());
}

TEST(SsdErrors, BadArgumentsAreNamed) {
  using T = double;
  const SsdShape s{1, 10, 4, 3, 2, 2};
  const SsdCase a = make_case(s, kAll, 5);
  SsdViews<T> v(a);
  DeviceView<T****> y("y", s.B, s.L, s.H, s.P);
  const auto forward = [&](auto edit, ssm::SsdOptions opts = ssm::SsdOptions()) {
    ssm::SsdForward<T, Space> f;
    v.set_inputs(f);
    f.y = y;
    edit(f);
    ssm::ssd_forward(Space(), f, opts);
  };
  using F = ssm::SsdForward<T, Space>;
  EXPECT_KDNN_ERROR(forward([](F&) {}, ssm::SsdOptions{0}), "chunk=0, expected Q >= 1");
  EXPECT_KDNN_ERROR(forward([](F& f) { f.dt = DeviceView<T***>("dt", 1, 9, 4); }),
                    "dt has extent(1)=9, expected 10");
  DeviceView<T****> b3("b3", 1, 10, 3, 2);
  EXPECT_KDNN_ERROR(forward([&](F& f) { f.B = f.C = b3; }),
                    "B has extent(2)=3, expected a number of groups G >= 1 that divides H=4");
  EXPECT_KDNN_ERROR(forward([&](F& f) { f.C = b3; }), "C has extent(2)=3, expected 2");
  EXPECT_KDNN_ERROR(forward([](F& f) { f.A = DeviceView<T*>("A", 3); }), "A has extent(0)=3");
  EXPECT_KDNN_ERROR(forward([](F& f) { f.D = DeviceView<T*>("D", 8); }),
                    "D has extent(0)=8, expected H=4 (per head) or H·P=12 (per channel)");
  EXPECT_KDNN_ERROR(forward([](F& f) { f.initial_state = DeviceView<T****>("i", 1, 4, 3, 3); }),
                    "initial_state has extent(3)=3, expected 2");
  EXPECT_KDNN_ERROR(forward([&](F& f) { f.y = DeviceView<T****>("y", 1, 10, 4, 2); }),
                    "y has extent(3)=2, expected 3");
  EXPECT_KDNN_ERROR(forward([&](F& f) {
                      f.y = kdnn::Tensor4<T, Space>(const_cast<T*>(v.x.data()), 1, 10, 4, 3);
                    }),
                    "output y overlaps input x");
  // A > 0 is refused only when asked for.
  DeviceView<T*> positive = to_device<T*>({-1, -0.5, 0.25, -2}, 4);
  EXPECT_KDNN_ERROR(forward([&](F& f) { f.A = positive; }, ssm::SsdOptions{8, true}),
                    "A[2]=0.25, expected a finite A <= 0");
  EXPECT_NO_THROW(forward([&](F& f) { f.A = positive; }, ssm::SsdOptions{8, false}));
  // -inf would zero every decay and make dt's gradient NaN.
  DeviceView<T*> minus_inf = to_device<T*>({-1, -std::numeric_limits<T>::infinity(), -0.5, -2}, 4);
  EXPECT_KDNN_ERROR(forward([&](F& f) { f.A = minus_inf; }, ssm::SsdOptions{8, true}),
                    "A[1]=-inf, expected a finite A <= 0");

  ssm::SsdBackward<T, Space> g;
  v.set_inputs(g);
  g.dy = v.dy;
  DeviceView<T****> dx("dx", 1, 10, 4, 3), dB("dB", 1, 10, 2, 2), dC("dC", 1, 10, 2, 2);
  DeviceView<T***> ddt("ddt", 1, 10, 4);
  DeviceView<T*> dA("dA", 4);
  g.dx = dx;
  g.ddt = ddt;
  g.dA = dA;
  g.dB = dB;
  g.dC = dC;
  EXPECT_NO_THROW(ssm::ssd_backward(Space(), g));
  g.dC = DeviceView<T****>("dC", 1, 10, 4, 2);
  EXPECT_KDNN_ERROR(ssm::ssd_backward(Space(), g), "dC has extent(2)=4, expected 2 (same as C)");
  g.dC = dB;
  EXPECT_KDNN_ERROR(ssm::ssd_backward(Space(), g), "outputs dB and dC overlap");
  g.dC = dC;
  g.dD = DeviceView<T*>("dD", 12);  // D has H values
  EXPECT_KDNN_ERROR(ssm::ssd_backward(Space(), g), "dD has extent(0)=12, expected D's 4");
}

}  // namespace
