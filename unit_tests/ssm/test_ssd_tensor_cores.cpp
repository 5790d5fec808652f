// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The chunked SSD's products on tensor cores (KernelForm::tensor_cores,
// emulated on a host): the scores C·Bᵀ, the chunk states and the backward's
// gradients against float64 sums of the same terms (3×TF32 and FP64 to a
// few ulps, one TF32 pass measurably worse); the whole forward and backward
// against the float64 recurrence and the FMA GPU form.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "all_sizes.hpp"
#include "allclose.hpp"
#include "kdnn/ssm/ssd.hpp"
#include "ssd_reference.hpp"
#include "ssd_runs.hpp"
#include "ssd_test_problems.hpp"
#include "ssd_views.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
using ssm_ref::SsdCase;
using ssm_ref::Vec;
namespace ssm = kdnn::ssm;

/// options() of the tensor-core form, with one TF32 pass where allow_tf32.
ssm::SsdOptions tensor_core_options(int chunk, bool allow_tf32) {
  ssm::SsdOptions o = options(chunk, kdnn::KernelForm::tensor_cores);
  o.launch.allow_tf32 = allow_tf32;
  return o;
}

using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Ssd, Types);

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
  if (stored.extent(0) != std::size_t(s.B) * chunks * s.G || stored.extent(1) != ld * ld) {
    return std::numeric_limits<double>::infinity();  // fails the caller's bound, reads nothing
  }
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
  KDNN_TEST_NEEDS_ALL_SIZES();
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
  KDNN_TEST_NEEDS_ALL_SIZES();
  using T = TypeParam;
  expect_tensor_core_accuracy<T>(
      {{{1, 150, 2, 64, 1, 64}, 64}, {{2, 100, 2, 128, 2, 128}, 48}, {{1, 90, 2, 64, 1, 128}, 256}},
      2800, tensor_core_state_error<T>);
}

/// The states H_c and their gradients dH_{c+1} drawn at random, and the
/// gradients mma_gradients computes from them: dx (no D), and dB and dC
/// per head.
struct MmaGradients {
  Vec hs, dhs, dx, dB, dC;
};

template <class T>
MmaGradients run_mma_gradients(const SsdCase& a, const ssm::SsdOptions& opts, int chunks) {
  namespace impl = ssm::impl;
  const auto& s = a.s;
  const std::size_t state_values = std::size_t(s.B) * s.H * chunks * s.N * s.P;
  MmaGradients r;
  r.hs = normal(state_values, 4141), r.dhs = normal(state_values, 4242);
  SsdViews<T> v(a);
  ssm::SsdBackward<T, Space> args;
  v.set_inputs(args);
  args.dy = v.dy;
  const auto states = to_device<T****>(r.hs, s.B, s.H, chunks, std::size_t(s.N) * s.P);
  const auto dstates = to_device<T****>(r.dhs, s.B, s.H, chunks, std::size_t(s.N) * s.P);
  impl::SsdGradients<Space, T> g;
  g.dx = DeviceView<T****>("dx", s.B, s.L, s.H, s.P);
  g.dBh = DeviceView<T****>("dBh", s.B, s.L, s.H, s.N);
  g.dCh = DeviceView<T****>("dCh", s.B, s.L, s.H, s.N);
  const auto steps = [&] {
    return typename impl::SsdStepSums<Space>::Steps("sums", s.B, s.H, s.L);
  };
  const impl::SsdStepSums<Space> sums{steps(), steps(), steps(), steps()};
  EXPECT_TRUE(impl::mma_gradients("test", Space(), args, opts, states, dstates, g, sums));
  r.dx = to_host(g.dx), r.dB = to_host(g.dBh), r.dC = to_host(g.dCh);
  return r;
}

/// The worst |got − sum| / magnitude of the values checked; a value whose
/// error is not finite ends the checks, the error then the worst.
struct WorstError {
  double worst = 0;
  bool check(double got, double sum, double magnitude) {
    const double err = std::abs(got - sum) / magnitude;
    worst = std::isfinite(err) ? std::max(worst, err) : err;
    return std::isfinite(err);
  }
};

/// u·w of two rows of `count` values, and Σ|u·w|.
template <class U, class W>
double dot(const U& u, const W& w, int count, double& magnitude) {
  double sum = 0;
  magnitude = 0;
  for (int q = 0; q < count; ++q) {
    sum += u(q) * w(q);
    magnitude += std::abs(u(q) * w(q));
  }
  return sum;
}

/// One chunk (steps t0 … t0 + n − 1) of head h of batch entry b: its rows
/// of B, C, dY and X̃ = dt·x as T holds them, the running sums cum of its
/// decays, and its offset state0 in the states.
template <class T>
struct GradientChunk {
  const SsdCase& a;
  ssm_ref::SsdIndex ix;
  int b, h, t0, n;
  std::vector<double> cum;
  std::size_t state0;

  static double in(double value) { return double(T(value)); }
  auto Bv(int j) const {
    return [this, j](int m) { return in(a.Bm[ix.bc(b, t0 + j, h, m)]); };
  }
  auto Cv(int i) const {
    return [this, i](int m) { return in(a.Cm[ix.bc(b, t0 + i, h, m)]); };
  }
  auto dYv(int i) const {
    return [this, i](int p) { return in(a.dy[ix.x(b, t0 + i, h, p)]); };
  }
  auto Xt(int j) const {
    return
        [this, j](int p) { return in(a.dt[ix.dt(b, t0 + j, h)]) * in(a.x[ix.x(b, t0 + j, h, p)]); };
  }
};

/// Step r's dX̃ (through dx = dt·dX̃), dB and dC in chunk k against their
/// sums; false when an error is not finite.
template <class T>
bool check_gradient_step(const GradientChunk<T>& k, const MmaGradients& got, int r,
                         WorstError& worst) {
  const auto& s = k.a.s;
  const int n = k.n;
  const auto& cum = k.cum;
  const auto in = GradientChunk<T>::in;
  const double dend = std::exp(cum[n - 1] - cum[r]), e = std::exp(cum[r]);
  const double dtr = in(k.a.dt[k.ix.dt(k.b, k.t0 + r, k.h)]);
  // Per partner step s: C_s·B_r (dX̃), dY_s·X̃_r (dB), dY_r·X̃_s (dC).
  std::vector<double> cb(n), cb_mag(n), vb(n), vb_mag(n), vc(n), vc_mag(n);
  for (int q = 0; q < n; ++q) {
    if (q >= r) cb[q] = dot(k.Cv(q), k.Bv(r), s.N, cb_mag[q]);
    if (q >= r) vb[q] = dot(k.dYv(q), k.Xt(r), s.P, vb_mag[q]);
    if (q <= r) vc[q] = dot(k.dYv(r), k.Xt(q), s.P, vc_mag[q]);
  }
  for (int p = 0; p < s.P; ++p) {  // dX̃
    double mag = 0;
    double sum =
        dend * dot(
                   k.Bv(r), [&](int m) { return in(got.dhs[k.state0 + m * s.P + p]); }, s.N, mag);
    mag *= dend;
    for (int q = r; q < n; ++q) {
      const double m = std::exp(cum[q] - cum[r]), d = k.dYv(q)(p);
      sum += cb[q] * m * d;
      mag += cb_mag[q] * m * std::abs(d);
    }
    if (!worst.check(got.dx[k.ix.x(k.b, k.t0 + r, k.h, p)], dtr * sum, dtr * mag)) return false;
  }
  const std::size_t row = (std::size_t(k.b) * s.L + k.t0 + r) * s.H + k.h;
  for (int m = 0; m < s.N; ++m) {
    double mag_b = 0, mag_c = 0;
    double sum_b =
        dend * dot(
                   k.Xt(r), [&](int p) { return in(got.dhs[k.state0 + m * s.P + p]); }, s.P, mag_b);
    double sum_c =
        e * dot(
                k.dYv(r), [&](int p) { return in(got.hs[k.state0 + m * s.P + p]); }, s.P, mag_c);
    mag_b *= dend;
    mag_c *= e;
    for (int q = r; q < n; ++q) {  // dB: the later steps
      const double w = std::exp(cum[q] - cum[r]), c = k.Cv(q)(m);
      sum_b += vb[q] * w * c;
      mag_b += vb_mag[q] * w * std::abs(c);
    }
    for (int q = 0; q <= r; ++q) {  // dC: the earlier steps
      const double w = std::exp(cum[r] - cum[q]), bq = k.Bv(q)(m);
      sum_c += vc[q] * w * bq;
      mag_c += vc_mag[q] * w * std::abs(bq);
    }
    if (!worst.check(got.dB[row * s.N + m], sum_b, mag_b)) return false;
    if (!worst.check(got.dC[row * s.N + m], sum_c, mag_c)) return false;
  }
  return true;
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
  const auto& s = a.s;
  const ssm_ref::SsdIndex ix{s};
  const int Q = std::min(opts.chunk, s.L), chunks = (s.L + Q - 1) / Q;
  const MmaGradients got = run_mma_gradients<T>(a, opts, chunks);
  WorstError worst;
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
        const GradientChunk<T> k{a, ix, b, h, t0, n, std::move(cum), state0};
        for (int r = 0; r < n; ++r) {
          if (!check_gradient_step(k, got, r, worst)) return worst.worst;
        }
      }
    }
  }
  return worst.worst;
}

// dX̃, dB and dC for P and N of each size, one group and two, chunks of one
// and of several row blocks, a short last chunk.
TYPED_TEST(Ssd, TensorCoreGradientsAreTheirSums) {
  KDNN_TEST_NEEDS_ALL_SIZES();
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

}  // namespace
