// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Fused attention forward and backward against the unfused path (masked
// softmax, dropout, batched GEMM), lse against a double-precision
// log-sum-exp, in every form; grouped-query heads; the backward run to run
// and with scales so large that every row is one-hot.
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

// Each form of the forward (KernelForm::host; ::gpu: the GPU form for D and
// Dv in {32, 64, 128, 256}, the host kernel under a GPU launch for other
// sizes; ::tensor_cores: its form for D and Dv in {32, 64, 128}, the GPU
// form's choice for others) against the unfused path.
TYPED_TEST(FusedAttention, ForwardMatchesTheUnfusedPath) {
  using T = TypeParam;
  unsigned seed = 1;
  for (const FusedCase& c : fused_cases()) {
    const auto q =
        to_device<T****>(normal(std::size_t(c.B) * c.H * c.S * c.D, seed++), c.B, c.H, c.S, c.D);
    const auto k =
        to_device<T****>(normal(std::size_t(c.B) * c.H * c.Sk * c.D, seed++), c.B, c.H, c.Sk, c.D);
    const auto v = to_device<T****>(normal(std::size_t(c.B) * c.H * c.Sk * c.Dv, seed++), c.B, c.H,
                                    c.Sk, c.Dv);
    for (const auto form : fused_forms()) {
      SCOPED_TRACE(std::string(c.name) + form_suffix(form));
      const at::AttentionMask<Space> mask = mask_of(c);
      const at::FusedAttentionOptions opts = case_options(c, 77, 5, form);
      DeviceView<T****> o("o", c.B, c.H, c.S, c.Dv);
      DeviceView<T***> lse("lse", c.B, c.H, c.S);
      at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);

      // The unfused path: scores, masked softmax, dropout, P·V.
      DeviceView<T****> scores("scores", c.B, c.H, c.S, c.Sk), P("P", c.B, c.H, c.S, c.Sk),
          Pd("Pd", c.B, c.H, c.S, c.Sk), o2("o2", c.B, c.H, c.S, c.Dv);
      at::batched_gemm(Space(), at::Op::none, at::Op::transpose, at::Op::none, T(1), q, k, T(0),
                       scores);
      at::softmax_forward(Space(), scores, P, {at::SoftmaxMode::accurate, opts.scale}, mask);
      at::dropout_forward(Space(), P, Pd, opts.dropout);
      at::batched_gemm(Space(), at::Op::none, at::Op::none, at::Op::none, T(1), Pd, v, T(0), o2);
      const double tol = sizeof(T) == 8 ? 1e-13 : 1e-5;
      EXPECT_ALLCLOSE(to_host(o), to_host(o2), tol, tol) << c.name;

      // lse: log Σ exp over the visible scaled scores, in double.
      const auto s = to_host(scores);
      const auto l = to_host(lse);
      MhaCase mc;
      mc.causal = c.causal, mc.lo = c.lo, mc.hi = c.hi, mc.seq_q = c.seq_q, mc.seq_k = c.seq_k;
      for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.H; ++h)
          for (int i = 0; i < c.S; ++i) {
            double m = -INFINITY, sum = 0;
            const std::size_t row = ((std::size_t(b) * c.H + h) * c.S + i) * c.Sk;
            for (int j = 0; j < c.Sk; ++j)
              if (reference_visible(mc, b, i, j)) m = std::max(m, opts.scale * s[row + j]);
            for (int j = 0; j < c.Sk; ++j)
              if (reference_visible(mc, b, i, j)) sum += std::exp(opts.scale * s[row + j] - m);
            const double got = l[(std::size_t(b) * c.H + h) * c.S + i];
            if (sum == 0) {
              EXPECT_EQ(got, -INFINITY) << c.name << " row " << i;
            } else {
              EXPECT_NEAR(got, m + std::log(sum), 10 * tol * (1 + std::abs(m))) << c.name;
            }
          }
    }
  }
}

// Grouped-query attention (Hkv < H key/value heads, query head h reading
// head h / (H / Hkv)), in every form: o, lse and dq equal, bitwise, those of
// multi-head attention on k and v with each head repeated for its group, and
// dk and dv the sums of the repeated heads' gradients in head order.
TYPED_TEST(FusedAttention, GroupedKeyValueHeadsAreTheirHeadsRepeated) {
  using T = TypeParam;
  struct Grouped {
    FusedCase c;
    int Hkv;
  };
  const std::vector<Grouped> cases = {
      {{"GQA 4:2, causal, dropout", 2, 4, 37, 50, 16, 16, true, {}, {}, {}, {}, 0.2}, 2},
      {{"MQA 3:1, key lengths", 2, 3, 40, 33, 32, 32, false, {}, {}, {}, {33, 9}, 0}, 1},
      {{"GQA 6:3, D = 64, windows",
        1,
        6,
        5,
        9,
        64,
        64,
        false,
        {0, 3, 3, 8, 0},
        {9, 3, 7, 9, 1},
        {},
        {},
        0},
       3},
      {{"GQA 4:1, D = 128, Dv = 64, several blocks",
        1,
        4,
        100,
        90,
        128,
        64,
        true,
        {},
        {},
        {},
        {},
        0.1},
       1},
  };
  unsigned seed = 11;
  for (const Grouped& g : cases) {
    const FusedCase& c = g.c;
    const int G = c.H / g.Hkv;
    const auto inputs = random_inputs<T>(c, seed, g.Hkv);  // lambdas below take them
    const DeviceView<T****>&q = inputs[0], &k = inputs[1], &v = inputs[2], &dout = inputs[3];
    // k and v with head h / G copied to head h.
    const auto repeated = [&](const DeviceView<T****>& x) {
      DeviceView<T****> r("repeated", c.B, c.H, x.extent(2), x.extent(3));
      for (int h = 0; h < c.H; ++h) {
        Kokkos::deep_copy(Kokkos::subview(r, Kokkos::ALL, h, Kokkos::ALL, Kokkos::ALL),
                          Kokkos::subview(x, Kokkos::ALL, h / G, Kokkos::ALL, Kokkos::ALL));
      }
      return r;
    };
    const auto k_rep = repeated(k), v_rep = repeated(v);
    for (const auto form : fused_forms()) {
      SCOPED_TRACE(std::string(c.name) + form_suffix(form));
      const at::AttentionMask<Space> mask = mask_of(c);
      const at::FusedAttentionOptions opts = case_options(c, 19, 3, form);
      const auto run = [&](const DeviceView<T****>& kk, const DeviceView<T****>& vv) {
        std::array<DeviceView<T****>, 4> out = {
            DeviceView<T****>("o", c.B, c.H, c.S, c.Dv),
            DeviceView<T****>("dq", c.B, c.H, c.S, c.D),
            DeviceView<T****>("dk", kk.extent(0), kk.extent(1), c.Sk, c.D),
            DeviceView<T****>("dv", vv.extent(0), vv.extent(1), c.Sk, c.Dv)};
        DeviceView<T***> lse("lse", c.B, c.H, c.S);
        at::fused_attention_forward(Space(), q, kk, vv, out[0], lse, opts, mask);
        at::fused_attention_backward(Space(), q, kk, vv, out[0], lse, dout, out[1], out[2], out[3],
                                     opts, mask);
        return std::pair(out, to_host(lse));
      };
      const auto [grouped, lse] = run(k, v);
      const auto [heads, lse_heads] = run(k_rep, v_rep);
      EXPECT_EQ(to_host(grouped[0]), to_host(heads[0])) << "o";
      EXPECT_EQ(lse, lse_heads) << "lse";
      EXPECT_EQ(to_host(grouped[1]), to_host(heads[1])) << "dq";
      for (int x : {2, 3}) {
        const auto per_head = to_host(heads[x]);  // [B, H, Sk, ·]
        const std::size_t row = c.Sk * heads[x].extent(3);
        std::vector<double> sums(per_head.size() / G);
        for (std::size_t e = 0; e < sums.size(); ++e) {
          const std::size_t first = e / row * G * row + e % row;
          T sum = T(per_head[first]);
          for (int r = 1; r < G; ++r) sum += T(per_head[first + r * row]);
          sums[e] = sum;
        }
        EXPECT_EQ(to_host(grouped[x]), sums) << (x == 2 ? "dk" : "dv");
      }
    }
  }
}

// Each form (KernelForm::host, ::gpu and ::tensor_cores, each for the head
// sizes it has, the next form down for others), each schedule, against the
// unfused chain and bitwise run to run.
TYPED_TEST(FusedAttention, BackwardMatchesTheUnfusedPathAndIsReproducible) {
  using T = TypeParam;
  unsigned seed = 100;
  for (const FusedCase& c : fused_cases()) {
    const auto [q, k, v, g] = random_inputs<T>(c, seed);
    const at::AttentionMask<Space> mask = mask_of(c);
    at::FusedAttentionOptions opts;
    opts.scale = 0.7 / std::sqrt(double(c.D));
    opts.dropout = {c.p, 1234, 9};
    DeviceView<T****> dq2("dq2", c.B, c.H, c.S, c.D), dk2("dk2", c.B, c.H, c.Sk, c.D),
        dv2("dv2", c.B, c.H, c.Sk, c.Dv);
    unfused_backward(q, k, v, g, opts, mask, dq2, dk2, dv2);
    const double tol = sizeof(T) == 8 ? 1e-12 : 2e-5;
    for (const auto form : fused_forms()) {
      opts.launch.form = form;
      DeviceView<T****> o("o", c.B, c.H, c.S, c.Dv);
      DeviceView<T***> lse("lse", c.B, c.H, c.S);
      at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
      for (const auto schedule :
           {at::FusedBackwardSchedule::automatic, at::FusedBackwardSchedule::per_head,
            at::FusedBackwardSchedule::per_key_block}) {
        const std::string name =
            std::string(c.name) + form_suffix(form) + ", schedule " + std::to_string(int(schedule));
        at::FusedAttentionOptions forced = opts;
        forced.backward = schedule;
        DeviceView<T****> dq("dq", c.B, c.H, c.S, c.D), dk("dk", c.B, c.H, c.Sk, c.D),
            dv("dv", c.B, c.H, c.Sk, c.Dv), dq4("dq4", c.B, c.H, c.S, c.D),
            dk4("dk4", c.B, c.H, c.Sk, c.D), dv4("dv4", c.B, c.H, c.Sk, c.Dv);
        at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, forced, mask);
        at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq4, dk4, dv4, forced, mask);
        EXPECT_ALLCLOSE(to_host(dq), to_host(dq2), tol, tol) << name;
        EXPECT_ALLCLOSE(to_host(dk), to_host(dk2), tol, tol) << name;
        EXPECT_ALLCLOSE(to_host(dv), to_host(dv2), tol, tol) << name;
        EXPECT_EQ(to_host(dq), to_host(dq4)) << name;
        EXPECT_EQ(to_host(dk), to_host(dk4)) << name;
        EXPECT_EQ(to_host(dv), to_host(dv4)) << name;
      }
    }
  }
}

// Scales so large that every softmax row is one-hot (P exactly 1 at the
// row's largest score, 0 elsewhere): the unfused chain's dS is then exactly
// 0 (Σ_j P_ij dP_ij = dP_i,argmax), and the fused backward must agree. It
// did not while it recomputed the scores as scale·(q·k) instead of the
// forward's (scale·q)·k: the two differ by ~eps·|s|, a huge error in the
// exponent (dq, dk off by 140% at 1e15, NaN from 1e18), nor on a GPU,
// whose compiler contracted the forward's and the backward's products into
// FMAs differently (NaN at 1e18; also on a host built with -mfma) until
// both took multiply_add. With dropout too: a one-hot row's dS' is 0 by
// construction (p = 1), not through δ = dO·O, which equals dPd·keep_scale
// only to rounding. q and k are moderate, so scale·q stays finite (also at
// −1e300).
TEST(FusedAttentionHugeScale, BackwardMatchesTheUnfusedPathInDouble) {
  using T = double;
  unsigned seed = 300;
  for (const FusedCase& c : fused_cases()) {
    const auto [q, k, v, g] = random_inputs<T>(c, seed);
    const at::AttentionMask<Space> mask = mask_of(c);
    for (const double scale : {1e12, 1e15, 1e18, -1e300}) {
      at::FusedAttentionOptions opts;
      opts.scale = scale;
      DeviceView<T****> o("o", c.B, c.H, c.S, c.Dv), dq2("dq2", c.B, c.H, c.S, c.D),
          dk2("dk2", c.B, c.H, c.Sk, c.D), dv2("dv2", c.B, c.H, c.Sk, c.Dv);
      DeviceView<T***> lse("lse", c.B, c.H, c.S);
      unfused_backward(q, k, v, g, opts, mask, dq2, dk2, dv2);
      // Every form of the forward: the GPU form's scores are team_gemm's
      // sums (blocks of 16, in order), the tensor-core form's its
      // fragments' (which its backward recomputes as S and as Sᵀ), so the
      // backward's recomputed scores equal them bitwise and one-hot rows
      // have P = 1 exactly.
      for (const auto form : fused_forms()) {
        opts.launch.form = form;
        at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
        for (const auto schedule :
             {at::FusedBackwardSchedule::per_head, at::FusedBackwardSchedule::per_key_block}) {
          std::ostringstream scale_text;
          scale_text << scale;
          const std::string name =
              std::string(c.name) + ", scale " + scale_text.str() + form_suffix(form) +
              (schedule == at::FusedBackwardSchedule::per_head ? ", per_head" : ", per_key_block");
          at::FusedAttentionOptions forced = opts;
          forced.backward = schedule;
          DeviceView<T****> dq("dq", c.B, c.H, c.S, c.D), dk("dk", c.B, c.H, c.Sk, c.D),
              dv("dv", c.B, c.H, c.Sk, c.Dv);
          at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, forced, mask);
          for (const auto& x : {to_host(dq), to_host(dk), to_host(dv)}) {
            EXPECT_TRUE(std::all_of(x.begin(), x.end(), [](double y) { return std::isfinite(y); }))
                << name;
          }
          EXPECT_ALLCLOSE(to_host(dq), to_host(dq2), 1e-12, 1e-12) << name;
          EXPECT_ALLCLOSE(to_host(dk), to_host(dk2), 1e-12, 1e-12) << name;
          EXPECT_ALLCLOSE(to_host(dv), to_host(dv2), 1e-12, 1e-12) << name;
        }
      }
    }
  }
}

}  // namespace
