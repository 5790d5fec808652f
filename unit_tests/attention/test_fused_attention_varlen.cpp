// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Fused attention over packed variable-length sequences (flash-attn's
// varlen layout): every form's outputs and gradients equal, bitwise, the
// dense call on the sequences padded to the longest (the same sums in the
// same order, and the same dropout draws), and, to rounding, the calls on
// each sequence alone; lengths 0, 1, a block − 1, a block, a block + 1 and
// several blocks; gradients against central differences in double; the
// packing's mistakes are kdnn::Errors naming the argument; and the
// multi-head attention layer on packed sequences against the layer on each
// sequence alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "allclose.hpp"
#include "expect_error.hpp"
#include "fused_case.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/fused_attention_varlen.hpp"
#include "mha_layer.hpp"
#include "random.hpp"
#include "varlen_cases.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;

template <class T>
class FusedAttentionVarlen : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(FusedAttentionVarlen, Types);

// Every form and backward schedule: the packed call is the padded dense
// call, to the bit, on every output (dropout draws included).
TYPED_TEST(FusedAttentionVarlen, EqualsThePaddedDenseCallBitwise) {
  using T = TypeParam;
  unsigned seed = 300;
  for (const VarlenCase& c : varlen_cases()) {
    const Packed p = packed_inputs(c, seed += 4);
    const auto mask = mask_of(c);
    for (const auto form : fused_forms()) {
      for (const auto schedule :
           {at::FusedBackwardSchedule::per_head, at::FusedBackwardSchedule::per_key_block}) {
        auto opts = options_of(c, form);
        opts.backward = schedule;
        const auto got = varlen_outputs<T>(c, p, opts, mask);
        const auto want = padded_outputs<T>(c, p, opts, mask);
        for (int x = 0; x < 5; ++x) {
          EXPECT_EQ(got[x], want[x]) << c.name << form_suffix(form) << ", schedule "
                                     << int(schedule) << ": " << kOutputs[x];
        }
      }
    }
  }
}

// Without dropout (whose draws depend on the padded extents), each
// sequence's rows equal the dense call on that sequence alone, to rounding
// (the blocks may differ, so the sums' order may).
TYPED_TEST(FusedAttentionVarlen, EqualsTheCallsOnEachSequenceAlone) {
  using T = TypeParam;
  unsigned seed = 500;
  for (VarlenCase c : varlen_cases()) {
    c.p = 0;
    const Packed p = packed_inputs(c, seed += 4);
    const auto mask = mask_of(c);
    const auto opts = options_of(c, kdnn::KernelForm::host);
    const auto got = varlen_outputs<T>(c, p, opts, mask);
    const std::vector<int> cq = offsets_of(c.len_q), ck = offsets_of(c.len_k);
    for (std::size_t n = 0; n < c.len_q.size(); ++n) {
      const VarlenCase one{c.name,   {c.len_q[n]}, {c.len_k[n]}, c.H,     c.Hkv,     c.D, c.Dv,
                           c.causal, c.band_left,  c.band_right, c.alibi, c.softcap, 0};
      // The sequence's rows of the packed inputs, and its ALiBi row.
      const auto rows = [](const std::vector<double>& x, int from, int count, int width) {
        return std::vector<double>(x.begin() + std::size_t(from) * width,
                                   x.begin() + std::size_t(from + count) * width);
      };
      Packed alone;
      alone.q = rows(p.q, cq[n], c.len_q[n], c.H * c.D);
      alone.g = rows(p.g, cq[n], c.len_q[n], c.H * c.Dv);
      alone.k = rows(p.k, ck[n], c.len_k[n], c.Hkv * c.D);
      alone.v = rows(p.v, ck[n], c.len_k[n], c.Hkv * c.Dv);
      alone.Tq = c.len_q[n], alone.Tk = c.len_k[n];
      alone.seqs.cu_seqlens_q = ints({0, c.len_q[n]});
      alone.seqs.cu_seqlens_k = ints({0, c.len_k[n]});
      at::AttentionMask<Space> one_mask = mask;
      if (c.alibi) {
        std::vector<double> slopes;
        for (int h = 0; h < c.H; ++h) slopes.push_back(0.05 * (h + 1) + 0.01 * double(n));
        one_mask.alibi_slopes = to_device<double**>(slopes, 1, c.H);
      }
      const auto want = padded_outputs<T>(one, alone, opts, one_mask);
      const double tol = sizeof(T) == 8 ? 1e-12 : 2e-5;
      const std::string name = std::string(c.name) + ", sequence " + std::to_string(n);
      EXPECT_ALLCLOSE(rows(got[0], cq[n], c.len_q[n], c.H * c.Dv), want[0], tol, tol) << name;
      EXPECT_ALLCLOSE(rows(got[2], cq[n], c.len_q[n], c.H * c.D), want[2], tol, tol) << name;
      EXPECT_ALLCLOSE(rows(got[3], ck[n], c.len_k[n], c.Hkv * c.D), want[3], tol, tol) << name;
      EXPECT_ALLCLOSE(rows(got[4], ck[n], c.len_k[n], c.Hkv * c.Dv), want[4], tol, tol) << name;
      for (int h = 0; h < c.H; ++h) {
        for (int i = 0; i < c.len_q[n]; ++i) {
          const double a = got[1][std::size_t(h) * p.Tq + cq[n] + i],
                       b = want[1][std::size_t(h) * c.len_q[n] + i];
          if (std::isinf(b)) {
            EXPECT_EQ(a, b) << name << ": lse, head " << h << ", query " << i;
          } else {
            EXPECT_NEAR(a, b, tol * (1 + std::abs(b)))
                << name << ": lse, head " << h << ", query " << i;
          }
        }
      }
    }
  }
}

// dL/dq, dk, dv of L = Σ dO·O against central differences of the forward,
// in double, for a packing with GQA, causal and ALiBi.
TEST(FusedAttentionVarlenGradients, MatchCentralDifferences) {
  const VarlenCase c{"", {3, 0, 9}, {5, 2, 9}, 2, 1, 4, 3, true, -1, -1, true, 0, 0};
  const Packed p = packed_inputs(c, 900);
  const auto mask = mask_of(c);
  const auto opts = options_of(c, kdnn::KernelForm::host);
  const auto grads = varlen_outputs<double>(c, p, opts, mask);
  const auto loss = [&](const Packed& x) {
    const auto q = to_device<double***>(x.q, x.Tq, c.H, c.D),
               k = to_device<double***>(x.k, x.Tk, c.Hkv, c.D),
               v = to_device<double***>(x.v, x.Tk, c.Hkv, c.Dv);
    DeviceView<double***> o("o", x.Tq, c.H, c.Dv);
    DeviceView<double**> lse("lse", c.H, x.Tq);
    at::fused_attention_varlen_forward(Space(), q, k, v, o, lse, x.seqs, opts, mask);
    const auto oh = to_host(o);
    double sum = 0;
    for (std::size_t e = 0; e < oh.size(); ++e) sum += oh[e] * x.g[e];
    return sum;
  };
  const double h = 1e-6;
  for (int which = 0; which < 3; ++which) {
    std::vector<double> Packed::*input = which == 0   ? &Packed::q
                                         : which == 1 ? &Packed::k
                                                      : &Packed::v;
    const std::vector<double>& grad = grads[2 + which];
    for (std::size_t e = 0; e < (p.*input).size(); ++e) {
      Packed plus = p, minus = p;
      (plus.*input)[e] += h;
      (minus.*input)[e] -= h;
      const double fd = (loss(plus) - loss(minus)) / (2 * h);
      EXPECT_NEAR(grad[e], fd, 1e-7 * (1 + std::abs(fd)))
          << kOutputs[2 + which] << " element " << e;
    }
  }
}

// No sequences, only empty ones, and a sequence whose queries see no key:
// zero rows, lse −inf and zero gradients for the queries without keys.
TEST(FusedAttentionVarlenEdges, EmptyPackingsAndQueriesWithoutKeys) {
  for (const auto form : fused_forms()) {
    const VarlenCase none{"", {}, {}, 2, 2, 32, 32, false, -1, -1, false, 0, 0};
    const VarlenCase empty{"", {0, 0}, {0, 0}, 2, 2, 32, 32, false, -1, -1, false, 0, 0};
    for (const VarlenCase& c : {none, empty}) {
      const auto out = varlen_outputs<float>(c, packed_inputs(c, 1), options_of(c, form), {});
      for (const auto& x : out) EXPECT_TRUE(x.empty()) << form_suffix(form);
    }
    const VarlenCase keyless{"", {4, 3}, {0, 6}, 1, 1, 32, 32, false, -1, -1, false, 0, 0};
    const Packed p = packed_inputs(keyless, 7);
    const auto out = varlen_outputs<double>(keyless, p, options_of(keyless, form), {});
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(out[1][i], -std::numeric_limits<double>::infinity()) << form_suffix(form);
      for (int d = 0; d < 32; ++d) {
        EXPECT_EQ(out[0][i * 32 + d], 0.0) << form_suffix(form);
        EXPECT_EQ(out[2][i * 32 + d], 0.0) << form_suffix(form);
      }
    }
    EXPECT_TRUE(std::isfinite(out[1][5])) << form_suffix(form);  // the second sequence's
  }
}

TEST(FusedAttentionVarlenErrors, BadPackingsAreNamed) {
  const VarlenCase c{"", {3, 4}, {2, 5}, 2, 1, 8, 8, false, -1, -1, false, 0, 0};
  const Packed p = packed_inputs(c, 11);
  const auto q = to_device<float***>(p.q, p.Tq, c.H, c.D),
             k = to_device<float***>(p.k, p.Tk, c.Hkv, c.D),
             v = to_device<float***>(p.v, p.Tk, c.Hkv, c.Dv);
  DeviceView<float***> o("o", p.Tq, c.H, c.Dv);
  DeviceView<float**> lse("lse", c.H, p.Tq);
  const auto forward = [&](const std::vector<int>& cq, const std::vector<int>& ck,
                           at::AttentionMask<Space> mask = {}) {
    const at::PackedSequences<Space> seqs{ints(cq), ints(ck)};
    return error_of(
        [&] { at::fused_attention_varlen_forward(Space(), q, k, v, o, lse, seqs, {}, mask); });
  };
  EXPECT_NE(forward({1, 3, 7}, {0, 2, 7}).find("seqs.cu_seqlens_q[0]=1, expected 0"),
            std::string::npos);
  EXPECT_NE(forward({0, 5, 4, 7}, {0, 2, 3, 7}).find("seqs.cu_seqlens_q[2]=4 < "),
            std::string::npos);
  EXPECT_NE(forward({0, 3, 6}, {0, 2, 7}).find("seqs.cu_seqlens_q[2]=6, expected 7 (Tq"),
            std::string::npos);
  EXPECT_NE(forward({0, 3, 7}, {0, 2, 8}).find("seqs.cu_seqlens_k[2]=8, expected 7 (Tk"),
            std::string::npos);
  EXPECT_NE(forward({0, 3, 7}, {0, 7}).find("seqs.cu_seqlens_k has extent(0)=2, expected 3"),
            std::string::npos);
  EXPECT_NE(forward({}, {}).find("seqs.cu_seqlens_q has extent(0)=0"), std::string::npos);
  at::AttentionMask<Space> lengths;
  lengths.seq_q = ints({3, 4});
  EXPECT_NE(
      forward({0, 3, 7}, {0, 2, 7}, lengths).find("mask.seq_q has extent(0)=2, expected none"),
      std::string::npos);
  at::AttentionMask<Space> alibi;
  alibi.alibi_slopes = to_device<double**>(std::vector<double>(3 * c.H, 0.1), 3, c.H);
  EXPECT_NE(forward({0, 3, 7}, {0, 2, 7}, alibi).find("mask.alibi_slopes has extents 3x2"),
            std::string::npos);
  // Shapes, in the packed layout's terms.
  DeviceView<float**> short_lse("lse", c.H, p.Tq - 1);
  const at::PackedSequences<Space> seqs{ints({0, 3, 7}), ints({0, 2, 7})};
  EXPECT_KDNN_ERROR(at::fused_attention_varlen_forward(Space(), q, k, v, o, short_lse, seqs),
                    "lse has extent(1)=6, expected 7 (Tq, q's extent(0))");
  DeviceView<float***> k3("k", p.Tk, 3, c.D);
  EXPECT_KDNN_ERROR(at::fused_attention_varlen_forward(Space(), q, k3, v, o, lse, seqs),
                    "v has extent(1)=1, expected 3 (Hkv, k's extent(1))");
  DeviceView<float***> dq("dq", p.Tq, c.H, c.D + 1), dk("dk", p.Tk, c.Hkv, c.D),
      dv("dv", p.Tk, c.Hkv, c.Dv);
  EXPECT_KDNN_ERROR(
      at::fused_attention_varlen_backward(Space(), q, k, v, o, lse, o, dq, dk, dv, seqs),
      "dq has extent(2)=9, expected 8 (same as q)");
}

// The layer on packed sequences (one batch entry, seqs given) equals the
// layer on each sequence alone: its rows of out, dq, dk, dv and dresidual,
// and the weight gradients summed over the sequences, to rounding; GQA,
// causal, dropout off (its draws follow the packed extents).
TYPED_TEST(FusedAttentionVarlen, TheLayerEqualsTheLayerOnEachSequence) {
  using T = TypeParam;
  const std::vector<int> len_q{4, 0, 9, 1}, len_k{5, 3, 9, 2};
  const std::vector<int> cq = offsets_of(len_q), ck = offsets_of(len_k);
  MhaCase c;
  c.B = 1, c.S = cq.back(), c.Sk = ck.back(), c.H = 4, c.Hkv = 2, c.D = 3, c.Dv = 2;
  c.causal = true, c.residual = true;
  const MhaData d = MhaData::random(c, 41);
  DeviceLayer<T> packed(c, d);
  packed.seqs = {ints(cq), ints(ck)};
  packed.forward();
  packed.backward();
  const auto out = to_host(packed.out);
  const auto grads = packed.gradients();
  std::vector<std::vector<double>> summed(grads.size());  // the weights' gradients
  const double tol = sizeof(T) == 8 ? 1e-12 : 2e-5;
  for (std::size_t n = 0; n < len_q.size(); ++n) {
    MhaCase one = c;
    one.S = len_q[n], one.Sk = len_k[n];
    // Rows [from, from + count) of a [1, rows, width] tensor.
    const auto rows = [](const std::vector<double>& x, int from, int count, int width) {
      return std::vector<double>(x.begin() + std::size_t(from) * width,
                                 x.begin() + std::size_t(from + count) * width);
    };
    MhaData part = d;
    part.q = rows(d.q, cq[n], len_q[n], c.Eq),
    part.residual = rows(d.residual, cq[n], len_q[n], c.Eo);
    part.dout = rows(d.dout, cq[n], len_q[n], c.Eo);
    part.k = rows(d.k, ck[n], len_k[n], c.Ek), part.v = rows(d.v, ck[n], len_k[n], c.Ev);
    DeviceLayer<T> alone(one, part);
    alone.forward();
    alone.backward();
    const std::string name = "sequence " + std::to_string(n);
    EXPECT_ALLCLOSE(rows(out, cq[n], len_q[n], c.Eo), to_host(alone.out), tol, tol) << name;
    const auto each = alone.gradients();
    for (std::size_t g = 0; g < grads.size(); ++g) {
      const auto member = grads[g].first;
      if (member == &MhaData::q || member == &MhaData::residual) {
        const int width = member == &MhaData::q ? c.Eq : c.Eo;
        EXPECT_ALLCLOSE(rows(grads[g].second, cq[n], len_q[n], width), each[g].second, tol, tol)
            << name << ": " << name_of(member);
      } else if (member == &MhaData::k || member == &MhaData::v) {
        const int width = member == &MhaData::k ? c.Ek : c.Ev;
        EXPECT_ALLCLOSE(rows(grads[g].second, ck[n], len_k[n], width), each[g].second, tol, tol)
            << name << ": " << name_of(member);
      } else {
        if (summed[g].empty()) summed[g].assign(each[g].second.size(), 0.0);
        for (std::size_t e = 0; e < summed[g].size(); ++e) summed[g][e] += each[g].second[e];
      }
    }
  }
  for (std::size_t g = 0; g < grads.size(); ++g) {
    if (!summed[g].empty()) {
      EXPECT_ALLCLOSE(grads[g].second, summed[g], tol, tol) << name_of(grads[g].first);
    }
  }
}

TEST(FusedAttentionVarlenErrors, TheLayerPacksOneBatchEntryWithTheFusedAlgorithm) {
  MhaCase c;
  c.B = 2, c.S = 3, c.Sk = 4;
  DeviceLayer<double> two(c, MhaData::random(c, 3));
  two.seqs = {ints({0, 3}), ints({0, 4})};
  EXPECT_KDNN_ERROR(two.forward(), "packed sequences (seqs) with a batch of 2, expected 1");
  c.B = 1;
  DeviceLayer<double> unfused(c, MhaData::random(c, 3), at::AttentionAlgo::unfused);
  unfused.seqs = {ints({0, 3}), ints({0, 4})};
  EXPECT_KDNN_ERROR(unfused.forward(), "expected AttentionAlgo::fused");
  DeviceLayer<double> bad(c, MhaData::random(c, 3));
  bad.seqs = {ints({0, 1, 3}), ints({0, 4})};
  EXPECT_KDNN_ERROR(bad.forward(), "seqs.cu_seqlens_k has extent(0)=2, expected 3");
  bad.seqs = {ints({0, 2, 3}), ints({0, 4, 5})};
  EXPECT_KDNN_ERROR(bad.backward(),
                    "attention::mha_backward_data: seqs.cu_seqlens_k[2]=5, expected 4");
}

}  // namespace
