// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The mask's positions (AttentionMask::Positions): a call on a block of the
// queries and a block of the keys, told where they lie, is that block of
// the whole attention. Over every pair of blocks of a split, the blocks'
// (O, lse) merged by their log-sum-exp equal the whole call's rows, and the
// backward on each pair (with the whole call's O and lse) sums to its dq,
// dk and dv, with the causal mask, a band, ALiBi, a softcap, GQA and
// dropout (numbered by position): what context-parallel attention does
// with its blocks. And the checks of the positions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "views.hpp"

namespace {
namespace positions_test {  // one name for this file's helpers (unity builds)

using namespace kdnn_test;
namespace at = kdnn::attention;
using Vec = std::vector<double>;

constexpr int B = 2, H = 4, Hkv = 2, S = 23;  // D per case

/// Rows [first, first + n) of a [B, heads, S, E] tensor, flat.
Vec rows_of(const Vec& v, int heads, int E, int first, int n) {
  Vec out;
  for (int bh = 0; bh < B * heads; ++bh) {
    const auto at = v.begin() + (std::size_t(bh) * S + first) * E;
    out.insert(out.end(), at, at + std::size_t(n) * E);
  }
  return out;
}

/// out's rows [first, first + n) += part ([B, heads, n, E]).
void add_rows(Vec& out, const Vec& part, int heads, int E, int first, int n) {
  for (int bh = 0; bh < B * heads; ++bh) {
    for (std::size_t e = 0; e < std::size_t(n) * E; ++e) {
      out[(std::size_t(bh) * S + first) * E + e] += part[std::size_t(bh) * n * E + e];
    }
  }
}

/// v with −inf (the lse of a row that sees no key) as −1e300, to compare.
Vec finite(Vec v) {
  for (double& x : v) x = x == -std::numeric_limits<double>::infinity() ? -1e300 : x;
  return v;
}

struct Run {
  Vec o, lse, dq, dk, dv;
};

/// The forward (and the backward with the given o, lse) of queries
/// [qb, qb + nq) and keys [kb, kb + nk) of the whole problem, positioned.
/// nq = nk = S, qb = kb = 0 and `positioned` false: the whole call.
Run block(const Vec& q, const Vec& k, const Vec& v, const Vec& dout, const Vec& o_all,
          const Vec& lse_all, int qb, int nq, int kb, int nk, at::AttentionMask<Space> mask,
          const at::FusedAttentionOptions& opts, bool positioned, int D) {
  if (positioned) mask.positions = {qb, S, kb, S};
  const auto qd = to_device<double****>(rows_of(q, H, D, qb, nq), B, H, nq, D);
  const auto kd = to_device<double****>(rows_of(k, Hkv, D, kb, nk), B, Hkv, nk, D);
  const auto vd = to_device<double****>(rows_of(v, Hkv, D, kb, nk), B, Hkv, nk, D);
  DeviceView<double****> o("o", B, H, nq, D);
  DeviceView<double***> lse("lse", B, H, nq);
  at::fused_attention_forward(
      Space(), at::FusedAttentionForward<double, Space>{qd, kd, vd, o, lse, mask}, opts);
  Run r{to_host(o), to_host(lse)};
  if (o_all.empty()) return r;
  DeviceView<double****> dq("dq", B, H, nq, D), dk("dk", B, Hkv, nk, D), dv("dv", B, Hkv, nk, D);
  at::fused_attention_backward(
      Space(),
      at::FusedAttentionBackward<double, Space>{
          qd, kd, vd, to_device<double****>(rows_of(o_all, H, D, qb, nq), B, H, nq, D),
          to_device<double***>(rows_of(lse_all, H, 1, qb, nq), B, H, nq),
          to_device<double****>(rows_of(dout, H, D, qb, nq), B, H, nq, D), dq, dk, dv, mask},
      opts);
  r.dq = to_host(dq), r.dk = to_host(dk), r.dv = to_host(dv);
  return r;
}

/// Query blocks × key blocks of the split `cuts` ([0, c1), [c1, c2), …, S):
/// the merged forward and the summed backward equal the whole call's.
void expect_blocks_equal_whole(const at::AttentionMask<Space>& mask,
                               const at::FusedAttentionOptions& opts, const std::vector<int>& cuts,
                               int D = 8) {
  const Vec q = normal(std::size_t(B) * H * S * D, 1), k = normal(std::size_t(B) * Hkv * S * D, 2),
            v = normal(std::size_t(B) * Hkv * S * D, 3), dout = normal(q.size(), 4);
  const Run whole = block(q, k, v, dout, {}, {}, 0, S, 0, S, mask, opts, false, D);
  const Run grads = block(q, k, v, dout, whole.o, whole.lse, 0, S, 0, S, mask, opts, false, D);
  std::vector<std::pair<int, int>> blocks;
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c)
    blocks.push_back({cuts[c], cuts[c + 1] - cuts[c]});
  Vec dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
  const double inf = std::numeric_limits<double>::infinity();
  for (const auto& [qb, nq] : blocks) {
    Vec o(std::size_t(B) * H * nq * D, 0.0), lse(std::size_t(B) * H * nq, -inf);
    for (const auto& [kb, nk] : blocks) {
      const Run part = block(q, k, v, dout, {}, {}, qb, nq, kb, nk, mask, opts, true, D);
      for (std::size_t r = 0; r < lse.size(); ++r) {  // merge by log-sum-exp
        const double a = lse[r], c = part.lse[r];
        const double m = std::max(a, c);
        if (m == -inf) continue;  // neither sees a key
        const double l = m + std::log(std::exp(a - m) + std::exp(c - m));
        for (int e = 0; e < D; ++e) {
          double& x = o[r * D + std::size_t(e)];
          x = x * std::exp(a - l) + part.o[r * D + std::size_t(e)] * std::exp(c - l);
        }
        lse[r] = l;
      }
      const Run g = block(q, k, v, dout, whole.o, whole.lse, qb, nq, kb, nk, mask, opts, true, D);
      add_rows(dq, g.dq, H, D, qb, nq);
      add_rows(dk, g.dk, Hkv, D, kb, nk);
      add_rows(dv, g.dv, Hkv, D, kb, nk);
    }
    EXPECT_ALLCLOSE(o, rows_of(whole.o, H, D, qb, nq), 1e-12, 1e-12);
    EXPECT_ALLCLOSE(finite(lse), finite(rows_of(whole.lse, H, 1, qb, nq)), 1e-12, 1e-12);
  }
  EXPECT_ALLCLOSE(dq, grads.dq, 1e-11, 1e-11);
  EXPECT_ALLCLOSE(dk, grads.dk, 1e-11, 1e-11);
  EXPECT_ALLCLOSE(dv, grads.dv, 1e-11, 1e-11);
}

at::FusedAttentionOptions scaled(int D = 8) {
  at::FusedAttentionOptions opts;
  opts.scale = 1.0 / std::sqrt(double(D));
  return opts;
}

TEST(FusedAttentionPositions, BlocksOfTheCausalMaskMergeToTheWhole) {
  at::AttentionMask<Space> mask;
  mask.causal = true;
  expect_blocks_equal_whole(mask, scaled(), {0, 9, 23});
  expect_blocks_equal_whole(mask, scaled(), {0, 1, 5, 6, 17, 23});
}

TEST(FusedAttentionPositions, BandsAlibiSoftcapAndDropoutFollowThePositions) {
  at::AttentionMask<Space> band;
  band.band_left = 4, band.band_right = 0;  // a sliding window, bottom-right aligned
  expect_blocks_equal_whole(band, scaled(), {0, 3, 11, 23});
  band.band_left = 2, band.band_right = 3;  // two-sided
  expect_blocks_equal_whole(band, scaled(), {0, 12, 23});
  at::AttentionMask<Space> alibi;
  alibi.causal = true;
  alibi.alibi_slopes = to_device<double**>({0.5, 0.25, 0.125, 0.0625}, 1, H);
  auto capped = scaled();
  capped.softcap = 3.0;
  expect_blocks_equal_whole(alibi, capped, {0, 8, 16, 23});
  auto dropped = scaled();
  dropped.dropout = {0.25, 1234, 5};
  expect_blocks_equal_whole(alibi, dropped, {0, 8, 16, 23});
  at::AttentionMask<Space> padded;  // entry 0's keys end at 15, its queries at 20
  padded.seq_q = to_device<int*>({20, 23}, B);
  padded.seq_k = to_device<int*>({15, 23}, B);
  expect_blocks_equal_whole(padded, scaled(), {0, 9, 16, 23});
}

// The GPU and tensor-core forms (D = 32, emulated on a host) read the same
// rules: their blocks merge to the whole call too.
TEST(FusedAttentionPositions, EveryKernelFormFollowsThePositions) {
  at::AttentionMask<Space> mask;
  mask.causal = true;
  mask.alibi_slopes = to_device<double**>({0.5, 0.25, 0.125, 0.0625}, 1, H);
  for (const auto form : {kdnn::KernelForm::gpu, kdnn::KernelForm::tensor_cores}) {
    SCOPED_TRACE(form == kdnn::KernelForm::gpu ? "gpu form" : "tensor-core form");
    auto opts = scaled(32);
    opts.launch.form = form;
    opts.dropout = {0.1, 9, 1};
    expect_blocks_equal_whole(mask, opts, {0, 7, 16, 23}, 32);
  }
}

/// Heads [first, first + n) of a [B, heads, S, E] tensor, flat.
Vec heads_of(const Vec& v, int heads, int E, int first, int n) {
  Vec out;
  const std::size_t per_head = std::size_t(S) * E;
  for (int b = 0; b < B; ++b) {
    const auto at = v.begin() + std::ptrdiff_t((std::size_t(b) * heads + first) * per_head);
    out.insert(out.end(), at, at + std::ptrdiff_t(n * per_head));
  }
  return out;
}

// A call on query heads 2 and 3 (K/V head 1) placed at head_begin = 2 of
// 4 gives those heads of the whole call: dropout numbers the elements by
// the whole call's heads, in every kernel form.
TEST(FusedAttentionPositions, HeadPositionsNumberDropoutAsTheWholeCall) {
  for (const auto form :
       {kdnn::KernelForm::host, kdnn::KernelForm::gpu, kdnn::KernelForm::tensor_cores}) {
    SCOPED_TRACE("kernel form " + std::to_string(int(form)));
    constexpr int D = 32;
    auto opts = scaled(D);
    opts.launch.form = form;
    opts.dropout = {0.3, 21, 4};
    const Vec q = normal(std::size_t(B) * H * S * D, 5),
              k = normal(std::size_t(B) * Hkv * S * D, 6),
              v = normal(std::size_t(B) * Hkv * S * D, 7), dout = normal(q.size(), 8);
    const auto call = [&](int h0, int n, bool placed) {
      at::AttentionMask<Space> mask;
      mask.causal = true;
      if (placed) mask.positions = {0, S, 0, S, h0, H};
      const int nkv = n / (H / Hkv), k0 = h0 / (H / Hkv);
      const auto qd = to_device<double****>(heads_of(q, H, D, h0, n), B, n, S, D);
      const auto kd = to_device<double****>(heads_of(k, Hkv, D, k0, nkv), B, nkv, S, D);
      const auto vd = to_device<double****>(heads_of(v, Hkv, D, k0, nkv), B, nkv, S, D);
      DeviceView<double****> o("o", B, n, S, D), dq("dq", B, n, S, D), dk("dk", B, nkv, S, D),
          dv("dv", B, nkv, S, D);
      DeviceView<double***> lse("lse", B, n, S);
      at::fused_attention_forward(
          Space(), at::FusedAttentionForward<double, Space>{qd, kd, vd, o, lse, mask}, opts);
      at::fused_attention_backward(
          Space(),
          at::FusedAttentionBackward<double, Space>{
              qd, kd, vd, o, lse, to_device<double****>(heads_of(dout, H, D, h0, n), B, n, S, D),
              dq, dk, dv, mask},
          opts);
      return positions_test::Run{to_host(o), finite(to_host(lse)), to_host(dq), to_host(dk),
                                 to_host(dv)};
    };
    const positions_test::Run whole = call(0, H, false), part = call(2, 2, true),
                              unplaced = call(2, 2, false);
    EXPECT_ALLCLOSE(part.o, heads_of(whole.o, H, D, 2, 2), 1e-12, 1e-12);
    EXPECT_ALLCLOSE(part.lse, heads_of(whole.lse, H, 1, 2, 2), 1e-12, 1e-12);
    EXPECT_ALLCLOSE(part.dq, heads_of(whole.dq, H, D, 2, 2), 1e-11, 1e-11);
    EXPECT_ALLCLOSE(part.dk, heads_of(whole.dk, Hkv, D, 1, 1), 1e-11, 1e-11);
    EXPECT_ALLCLOSE(part.dv, heads_of(whole.dv, Hkv, D, 1, 1), 1e-11, 1e-11);
    // The control: without the heads' positions the mask is another one.
    const Vec expected = heads_of(whole.o, H, D, 2, 2);
    double apart = 0;
    for (std::size_t i = 0; i < expected.size(); ++i) {
      apart = std::max(apart, std::abs(unplaced.o[i] - expected[i]));
    }
    EXPECT_GT(apart, 1e-3);
  }
}

TEST(FusedAttentionPositions, PositionsOutsideTheirLengthsAreRefused) {
  const auto q = DeviceView<double****>("q", 1, 1, 4, 2),
             k = DeviceView<double****>("k", 1, 1, 3, 2);
  DeviceView<double****> o("o", 1, 1, 4, 2);
  DeviceView<double***> lse("lse", 1, 1, 4);
  const auto call = [&](const at::AttentionMask<Space>::Positions& p) {
    at::AttentionMask<Space> mask;
    mask.positions = p;
    return error_of([&] {
      at::fused_attention_forward(Space(),
                                  at::FusedAttentionForward<double, Space>{q, k, k, o, lse, mask});
    });
  };
  EXPECT_EQ(call({6, 10, 7, 10}), "");
  EXPECT_EQ(call({7, 10, 0, 3}),
            "attention::fused_attention_forward: mask.positions.query_begin=7 with 4 queries (S), "
            "expected 0 <= query_begin and query_begin + 4 <= query_length=10");
  EXPECT_EQ(call({0, 4, -1, 3}),
            "attention::fused_attention_forward: mask.positions.key_begin=-1 with 3 keys (Sk), "
            "expected 0 <= key_begin and key_begin + 3 <= key_length=3");
  EXPECT_EQ(call({2, -1, 0, -1}),
            "attention::fused_attention_forward: mask.positions.query_begin=2 with "
            "query_length=-1, expected 0 (the call's own positions)");
  EXPECT_EQ(call({0, -1, 0, -1, 1, 1}),
            "attention::fused_attention_forward: mask.positions.head_begin=1 with 1 heads (H), "
            "expected 0 <= head_begin and head_begin + 1 <= head_count=1");
  EXPECT_EQ(call({0, -2, 0, -1}),
            "attention::fused_attention_forward: mask.positions.query_length=-2, expected -1 (the "
            "call's own) or a length >= 0");
}

}  // namespace positions_test
}  // namespace
