// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The chunked SSD against the float64 step-by-step recurrence
// (ssd_reference.hpp): forward and backward, chunk sizes that do and do not
// divide L (and Q > L, Q = 1), G ∈ {1, 2, H}, with and without D, the
// initial state and d(final state), P and N that are not multiples of the
// GEMM tile, L = 0, L = 1, B = 0; the fused backward against its halves; D
// per channel; directional finite differences of kdnn's double forward for
// every gradient; decays that underflow; the pieces (Y_diag, the summary,
// exp(cumsum)). The GPU forms: test_ssd_gpu_forms.cpp; the tensor-core
// forms: test_ssd_tensor_cores.cpp; bad arguments: test_ssd_errors.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

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
using ssm_ref::SsdShape;
using ssm_ref::Vec;
namespace ssm = kdnn::ssm;

using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Ssd, Types);

/// Q divides L, does not, Q > L, Q = 1, Q = L; one group, two, one per
/// head; P and N off the GEMM tile.
const Config kConfigs[] = {{{2, 37, 4, 8, 2, 8}, 8},  {{1, 64, 2, 4, 1, 16}, 16},
                           {{2, 20, 3, 5, 3, 3}, 64}, {{1, 9, 2, 3, 1, 2}, 1},
                           {{1, 50, 4, 6, 4, 5}, 50}, {{2, 1, 2, 4, 2, 4}, 4},
                           {{1, 70, 2, 16, 1, 8}, 32}};

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

}  // namespace
