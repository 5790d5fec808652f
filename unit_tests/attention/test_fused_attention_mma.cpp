// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The fused attention's tensor-core forms (KernelForm::tensor_cores:
// impl/fused_forward_mma_kernel.hpp, impl/fused_backward_mma_kernels.hpp;
// on the CPU their products emulated): every mask, window, sequence length
// and dropout, D != Dv, S and Sk not multiples of the blocks. float with
// 3×TF32 keeps float32 accuracy (within 3 times the error of the host
// form's float32, against float64) in O, lse, dQ, dK and dV; one TF32 pass
// (allow_tf32) is coarser and says so; double equals the double host form
// to rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "all_sizes.hpp"
#include "fused_case.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/impl/fused_attention_impl.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;

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
      // Key blocks between the rows' keys see none of the tile's queries
      // but lie in the hull whose blocks add to dQ in turn.
      {"D = 64, windows with a gap between the rows' keys",
       1,
       2,
       4,
       200,
       64,
       64,
       false,
       {0, 190, 0, 5},
       {5, 200, 3, 5},
       {},
       {},
       0},
      {"D = 128, causal, S > Sk", 1, 1, 70, 33, 128, 128, true, {}, {}, {}, {}, 0},
  };
}

struct Inputs {
  std::vector<double> q, k, v, g;  // g: dO
};

/// Normal inputs rounded to float, so that every type reads the same values.
Inputs inputs(const FusedCase& c, unsigned seed) {
  const auto rounded = [&](std::size_t n, unsigned s) {
    std::vector<double> x = normal(n, s);
    for (double& e : x) e = double(float(e));
    return x;
  };
  const std::size_t nq = std::size_t(c.B) * c.H * c.S, nk = std::size_t(c.B) * c.H * c.Sk;
  return {rounded(nq * c.D, seed), rounded(nk * c.D, seed + 1), rounded(nk * c.Dv, seed + 2),
          rounded(nq * c.Dv, seed + 3)};
}

struct Result {
  std::vector<double> o, lse, dq, dk, dv;
};

at::FusedAttentionOptions options(const FusedCase& c) { return case_options(c, 2024, 7); }

/// The forward and the backward in T by the host forms, or the tensor-core
/// forms (one TF32 pass where `tf32`).
template <class T>
Result run(const FusedCase& c, const Inputs& in, bool mma, bool tf32 = false, double scale = 0) {
  const auto q = to_device<T****>(in.q, c.B, c.H, c.S, c.D);
  const auto k = to_device<T****>(in.k, c.B, c.H, c.Sk, c.D);
  const auto v = to_device<T****>(in.v, c.B, c.H, c.Sk, c.Dv);
  const auto g = to_device<T****>(in.g, c.B, c.H, c.S, c.Dv);
  DeviceView<T****> o("o", c.B, c.H, c.S, c.Dv), dq("dq", c.B, c.H, c.S, c.D),
      dk("dk", c.B, c.H, c.Sk, c.D), dv("dv", c.B, c.H, c.Sk, c.Dv);
  DeviceView<T***> lse("lse", c.B, c.H, c.S);
  at::FusedAttentionOptions opts = options(c);
  if (scale != 0) opts.scale = scale;
  opts.launch.form = mma ? kdnn::KernelForm::tensor_cores : kdnn::KernelForm::host;
  opts.launch.allow_tf32 = tf32;
  const at::AttentionMask<Space> mask = mask_of(c);
  at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
  at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, opts, mask);
  return {to_host(o), to_host(lse), to_host(dq), to_host(dk), to_host(dv)};
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
  KDNN_TEST_NEEDS_ALL_SIZES();
  unsigned seed = 1;
  for (const FusedCase& c : mma_cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = inputs(c, seed);
    seed += 3;
    const Result truth = run<double>(c, in, false);
    const Result host = run<float>(c, in, false);
    const Result full = run<float>(c, in, true);
    const Result tf32 = run<float>(c, in, true, true);
    for (const auto& [name, got, float32, exact] :
         {std::tuple{"o", &full.o, &host.o, &truth.o},
          std::tuple{"lse", &full.lse, &host.lse, &truth.lse},
          std::tuple{"dq", &full.dq, &host.dq, &truth.dq},
          std::tuple{"dk", &full.dk, &host.dk, &truth.dk},
          std::tuple{"dv", &full.dv, &host.dv, &truth.dv}}) {
      const double host_error = max_diff(*float32, *exact);
      EXPECT_LE(max_diff(*got, *exact), 3 * host_error + 1e-7)
          << name << "; the host form's " << host_error;
    }
    // One TF32 pass: about 10 bits per product; coarser than 3×TF32
    // wherever there is a product to round.
    const double tf32_o = max_diff(tf32.o, truth.o);
    EXPECT_LE(tf32_o, 1e-2);
    EXPECT_LE(max_diff(tf32.lse, truth.lse), 1e-2);
    EXPECT_LE(max_diff(tf32.dk, truth.dk), 1e-2);
    EXPECT_LE(max_diff(tf32.dv, truth.dv), 1e-2);
    if (c.S * c.Sk > 1) {
      EXPECT_GT(tf32_o, 4 * max_diff(full.o, truth.o));
      EXPECT_GT(max_diff(tf32.dk, truth.dk), 4 * max_diff(full.dk, truth.dk));
    }
  }
}

TEST(FusedAttentionMma, Float64EqualsTheHostFormToRounding) {
  unsigned seed = 101;
  for (const FusedCase& c : mma_cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = inputs(c, seed);
    seed += 3;
    const Result host = run<double>(c, in, false);
    const Result mma = run<double>(c, in, true);
    EXPECT_LE(max_diff(mma.o, host.o), 1e-13);
    EXPECT_LE(max_diff(mma.lse, host.lse), 1e-13);
    EXPECT_LE(max_diff(mma.dq, host.dq), 1e-12);
    EXPECT_LE(max_diff(mma.dk, host.dk), 1e-12);
    EXPECT_LE(max_diff(mma.dv, host.dv), 1e-12);
  }
}

// Rows with one key far above the rest (a huge scale): O is that key's V
// row and lse its score, however large, on the tensor cores too.
TEST(FusedAttentionMma, HugeScalesGiveOneHotRows) {
  const FusedCase c{"huge scale", 1, 2, 40, 50, 64, 32, false, {}, {}, {}, {}, 0};
  const Inputs in = inputs(c, 77);
  for (const double scale : {1e3, 1e6}) {
    SCOPED_TRACE(scale);
    const Result r = run<float>(c, in, true, false, scale);
    const auto& ho = r.o;
    const auto& hl = r.lse;
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

// Both kernels of the backward recompute the forward's scores bitwise (dQ's
// as S, dK and dV's as Sᵀ = K·Qᵀ in the transposed order): where a huge
// scale makes a row one-hot, P is exactly 1 at its key and 0 elsewhere, so
// the row's dQ is exactly 0 and it adds nothing to dK (a score one rounding
// off would give P = e^{±scale·ulp} and gradients of order scale).
TEST(FusedAttentionMma, HugeScalesGiveZeroGradientsOnOneHotRows) {
  const FusedCase c{"huge scale", 2, 1, 40, 50, 32, 32, true, {}, {}, {}, {}, 0};
  const Inputs in = inputs(c, 91);
  for (const bool tf32 : {false, true}) {
    for (const double scale : {1e4, 1e8}) {
      SCOPED_TRACE(std::to_string(scale) + (tf32 ? ", one TF32 pass" : ", 3xTF32"));
      const Result f = run<float>(c, in, true, tf32, scale);
      // Rows (of q) and keys (of k) whose gradient is not all zero.
      const auto nonzero_rows = [](const std::vector<double>& x, int rows, int D) {
        int n = 0;
        for (int r = 0; r < rows; ++r) {
          n += std::any_of(x.begin() + std::size_t(r) * D, x.begin() + std::size_t(r + 1) * D,
                           [](double y) { return y != 0; });
        }
        return n;
      };
      // Row 0 of each head sees one key only: dQ = 0 anyway.
      const int live_rows = nonzero_rows(f.dq, c.B * c.H * c.S, c.D);
      // Every row but those whose top two scores are within e^-88 of a tie
      // (at most two here), and each of those reaches two keys.
      EXPECT_LE(live_rows, 2);
      EXPECT_LE(nonzero_rows(f.dk, c.B * c.H * c.Sk, c.D), 2 * live_rows);
    }
  }
}

/// each_accumulator's places are accumulator_place's (the rolled map that
/// dropout's keep bits use), for every thread and register.
template <class T, int Tiles>
void expect_one_accumulator_map() {
  using Team = at::impl::FlashMmaTeam<void, Kokkos::DefaultHostExecutionSpace, T, 64, 64,
                                      kdnn::impl::MmaPrecision::full>;
  for (int t = 0; t < Team::NT; ++t) {
    int count = 0;
    Team::template each_accumulator<Tiles>(t, [&](int e, int slot, int row, int col) {
      const auto a = Team::template accumulator_place<Tiles>(t, e);
      EXPECT_EQ(e, count++);
      EXPECT_EQ(slot, a.slot) << "t=" << t << " e=" << e;
      EXPECT_EQ(row, a.row) << "t=" << t << " e=" << e;
      EXPECT_EQ(col, a.col) << "t=" << t << " e=" << e;
    });
    EXPECT_EQ(count, Team::MT * Tiles * Team::CR);
  }
}

TEST(FusedAttentionMma, OneMapOfAccumulatorsToRowsAndColumns) {
  expect_one_accumulator_map<float, 1>();
  expect_one_accumulator_map<float, 8>();
  expect_one_accumulator_map<double, 1>();
  expect_one_accumulator_map<double, 4>();
}

// Head sizes past the tensor-core forms' largest (128) run the GPU form
// (smaller ones round up: test_fused_attention.cpp).
TEST(FusedAttentionMma, LargerHeadSizesRunTheGpuForm) {
  const FusedCase c{"D = 160", 1, 2, 20, 30, 160, 160, false, {}, {}, {}, {}, 0};
  const Inputs in = inputs(c, 5);
  const auto run_form = [&](kdnn::KernelForm form) {
    const auto q = to_device<float****>(in.q, c.B, c.H, c.S, c.D);
    const auto k = to_device<float****>(in.k, c.B, c.H, c.Sk, c.D);
    const auto v = to_device<float****>(in.v, c.B, c.H, c.Sk, c.Dv);
    DeviceView<float****> o("o", c.B, c.H, c.S, c.Dv);
    DeviceView<float***> lse("lse", c.B, c.H, c.S);
    at::FusedAttentionOptions opts = options(c);
    opts.launch.form = form;
    at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask_of(c));
    return to_host(o);
  };
  EXPECT_EQ(run_form(kdnn::KernelForm::tensor_cores), run_form(kdnn::KernelForm::gpu));
}

}  // namespace
