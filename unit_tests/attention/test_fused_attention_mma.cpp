// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The fused attention forward's tensor-core form
// (impl/fused_forward_mma_kernel.hpp; on the CPU its products emulated):
// every mask, window, sequence length and dropout, D != Dv, S and Sk not
// multiples of the blocks. float with 3×TF32 keeps float32 accuracy (within
// 3 times the error of the host form's float32, against float64); one TF32
// pass is coarser and says so; double equals the double host form to
// rounding. lse likewise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fused_case.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/impl/fused_attention_impl.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;
using kdnn::impl::MmaPrecision;

std::vector<FusedCase> mma_cases() {
  return {
      {"D = 64, S and Sk not block multiples", 2, 2, 70, 130, 64, 64, false, {}, {}, {}, {}, 0},
      {"D = 32, causal, several blocks, dropout",
       1,
       2,
       150,
       140,
       32,
       32,
       true,
       {},
       {},
       {},
       {},
       0.2},
      {"D = 128, Dv = 64, lengths, an entry without keys",
       3,
       1,
       40,
       50,
       128,
       64,
       false,
       {},
       {},
       {40, 17, 5},
       {50, 0, 23},
       0},
      {"D = 32, Dv = 128, windows with empty rows",
       1,
       1,
       9,
       40,
       32,
       128,
       false,
       {0, 5, 10, 39, 0, 20, 40, 3, 0},
       {40, 5, 30, 40, 1, 38, 40, 35, 12},
       {},
       {},
       0},
      {"D = 64, one query and one key, dropout", 2, 1, 1, 1, 64, 64, false, {}, {}, {}, {}, 0.5},
      {"D = 128, causal, S > Sk", 1, 1, 70, 33, 128, 128, true, {}, {}, {}, {}, 0},
  };
}

struct Inputs {
  std::vector<double> q, k, v;
};

/// Normal inputs rounded to float, so that every type reads the same values.
Inputs inputs(const FusedCase& c, unsigned seed) {
  const auto rounded = [&](std::size_t n, unsigned s) {
    std::vector<double> x = normal(n, s);
    for (double& e : x) e = double(float(e));
    return x;
  };
  const std::size_t nq = std::size_t(c.B) * c.H * c.S, nk = std::size_t(c.B) * c.H * c.Sk;
  return {rounded(nq * c.D, seed), rounded(nk * c.D, seed + 1), rounded(nk * c.Dv, seed + 2)};
}

struct Forward {
  std::vector<double> o, lse;
};

at::FusedAttentionOptions options(const FusedCase& c) {
  at::FusedAttentionOptions opts;
  opts.scale = 1 / std::sqrt(double(c.D));
  opts.dropout = {c.p, 2024, 7};
  return opts;
}

/// The forward in T: the host form, or the tensor-core form with P.
template <class T>
Forward run(const FusedCase& c, const Inputs& in, bool mma, MmaPrecision P = MmaPrecision::full) {
  const auto q = to_device<T****>(in.q, c.B, c.H, c.S, c.D);
  const auto k = to_device<T****>(in.k, c.B, c.H, c.Sk, c.D);
  const auto v = to_device<T****>(in.v, c.B, c.H, c.Sk, c.Dv);
  DeviceView<T****> o("o", c.B, c.H, c.S, c.Dv);
  DeviceView<T***> lse("lse", c.B, c.H, c.S);
  at::FusedAttentionOptions opts = options(c);
  const at::AttentionMask<Space> mask = mask_of(c);
  if (!mma) {
    opts.launch.form = kdnn::KernelForm::host;
    at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
  } else if (P == MmaPrecision::full) {
    EXPECT_TRUE((at::impl::fused_attention_forward_mma<Space, T, MmaPrecision::full>(
        Space(), q, k, v, o, lse, opts, mask)));
  } else if constexpr (sizeof(T) == 4) {
    EXPECT_TRUE((at::impl::fused_attention_forward_mma<Space, T, MmaPrecision::tf32>(
        Space(), q, k, v, o, lse, opts, mask)));
  } else {
    ADD_FAILURE() << "a single TF32 pass is a float precision";
  }
  return {to_host(o), to_host(lse)};
}

/// The largest |a − b| over finite pairs; a pair where one side is not
/// finite counts as infinite unless both are the same infinity.
double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    m = std::max(m, std::isfinite(a[i] - b[i]) ? std::abs(a[i] - b[i]) : INFINITY);
  }
  return m;
}

TEST(FusedAttentionMma, Float32WithThreeTf32KeepsFloat32Accuracy) {
  unsigned seed = 1;
  for (const FusedCase& c : mma_cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = inputs(c, seed);
    seed += 3;
    const Forward truth = run<double>(c, in, false);
    const Forward host = run<float>(c, in, false);
    const Forward full = run<float>(c, in, true, MmaPrecision::full);
    const Forward tf32 = run<float>(c, in, true, MmaPrecision::tf32);
    const double host_o = max_diff(host.o, truth.o), host_lse = max_diff(host.lse, truth.lse);
    EXPECT_LE(max_diff(full.o, truth.o), 3 * host_o + 1e-7) << "host form's " << host_o;
    EXPECT_LE(max_diff(full.lse, truth.lse), 3 * host_lse + 1e-7) << "host form's " << host_lse;
    // One TF32 pass: about 10 bits per product; coarser than 3×TF32
    // wherever there is a product to round.
    const double tf32_o = max_diff(tf32.o, truth.o);
    EXPECT_LE(tf32_o, 1e-2);
    EXPECT_LE(max_diff(tf32.lse, truth.lse), 1e-2);
    if (c.S * c.Sk > 1) {
      EXPECT_GT(tf32_o, 4 * max_diff(full.o, truth.o));
    }
  }
}

TEST(FusedAttentionMma, Float64EqualsTheHostFormToRounding) {
  unsigned seed = 101;
  for (const FusedCase& c : mma_cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = inputs(c, seed);
    seed += 3;
    const Forward host = run<double>(c, in, false);
    const Forward mma = run<double>(c, in, true);
    EXPECT_LE(max_diff(mma.o, host.o), 1e-13);
    EXPECT_LE(max_diff(mma.lse, host.lse), 1e-13);
  }
}

// Rows with one key far above the rest (a huge scale): O is that key's V
// row and lse its score, however large, on the tensor cores too.
TEST(FusedAttentionMma, HugeScalesGiveOneHotRows) {
  const FusedCase c{"huge scale", 1, 2, 40, 50, 64, 32, false, {}, {}, {}, {}, 0};
  const Inputs in = inputs(c, 77);
  for (const double scale : {1e3, 1e6}) {
    SCOPED_TRACE(scale);
    at::FusedAttentionOptions opts = options(c);
    opts.scale = scale;
    const auto q = to_device<float****>(in.q, c.B, c.H, c.S, c.D);
    const auto k = to_device<float****>(in.k, c.B, c.H, c.Sk, c.D);
    const auto v = to_device<float****>(in.v, c.B, c.H, c.Sk, c.Dv);
    DeviceView<float****> o("o", c.B, c.H, c.S, c.Dv);
    DeviceView<float***> lse("lse", c.B, c.H, c.S);
    ASSERT_TRUE((at::impl::fused_attention_forward_mma<Space, float, MmaPrecision::full>(
        Space(), q, k, v, o, lse, opts, {})));
    const auto ho = to_host(o), hl = to_host(lse);
    int checked = 0;
    for (int bh = 0; bh < c.B * c.H; ++bh) {
      for (int i = 0; i < c.S; ++i) {
        // The key with the largest score (in double), and the runner-up.
        int best = 0;
        double top = -INFINITY, second = -INFINITY;
        for (int j = 0; j < c.Sk; ++j) {
          double s = 0;
          for (int d = 0; d < c.D; ++d) {
            s += in.q[(std::size_t(bh) * c.S + i) * c.D + d] *
                 in.k[(std::size_t(bh) * c.Sk + j) * c.D + d];
          }
          s *= scale;
          if (s > top) {
            second = top, top = s, best = j;
          } else if (s > second) {
            second = s;
          }
        }
        if (top - second < 50) continue;  // the runner-up keeps more than e^-50
        const std::size_t row = std::size_t(bh) * c.S + i;
        ++checked;
        EXPECT_NEAR(hl[row], top, 1e-5 * std::abs(top)) << "row " << i;
        for (int d = 0; d < c.Dv; ++d) {
          EXPECT_NEAR(ho[row * c.Dv + d], in.v[(std::size_t(bh) * c.Sk + best) * c.Dv + d], 1e-6)
              << "row " << i;
        }
      }
    }
    EXPECT_GE(checked, c.B * c.H * c.S / 2);  // most rows have a clear maximum
  }
}

TEST(FusedAttentionMma, RunsOnlyForItsHeadSizes) {
  DeviceView<float****> q("q", 1, 1, 4, 16), k("k", 1, 1, 4, 16), v("v", 1, 1, 4, 16),
      o("o", 1, 1, 4, 16);
  DeviceView<float***> lse("lse", 1, 1, 4);
  EXPECT_FALSE((at::impl::fused_attention_forward_mma<Space, float, MmaPrecision::full>(
      Space(), q, k, v, o, lse, {}, {})));
  EXPECT_EQ(to_host(lse), std::vector<double>(4, 0.0));  // nothing written
}

}  // namespace
