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
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;

/// A packing: each sequence's query and key lengths, heads, head sizes.
struct VarlenCase {
  const char* name;
  std::vector<int> len_q, len_k;
  int H, Hkv, D, Dv;
  bool causal;
  int band_left, band_right;
  bool alibi;
  double softcap, p;
};

std::vector<VarlenCase> varlen_cases() {
  // Lengths around the blocks of every form: 16 and 32 (GPU forms), 64
  // (tensor cores, host), 128 (host, long sequences).
  return {
      {"lengths 0, 1, 31, 32, 33, 70",
       {0, 1, 31, 32, 33, 70},
       {0, 1, 31, 32, 33, 70},
       2,
       2,
       32,
       32,
       false,
       -1,
       -1,
       false,
       0,
       0},
      {"causal, Sq != Sk, an entry without keys",
       {5, 63, 64, 65, 1},
       {9, 40, 0, 130, 3},
       2,
       2,
       32,
       32,
       true,
       -1,
       -1,
       false,
       0,
       0},
      {"GQA, band, ALiBi, softcap, dropout",
       {17, 0, 129, 48},
       {20, 4, 100, 48},
       4,
       2,
       32,
       32,
       false,
       8,
       0,
       true,
       5.0,
       0.2},
      {"D = 16, Dv = 8 (host form), dropout",
       {3, 140, 0, 64},
       {64, 2, 7, 65},
       1,
       1,
       16,
       8,
       false,
       -1,
       0,
       false,
       0,
       0.3},
      {"D = 64, Dv = 128, causal, ALiBi",
       {33, 90},
       {40, 90},
       2,
       1,
       64,
       128,
       true,
       -1,
       -1,
       true,
       0,
       0},
  };
}

std::vector<int> offsets_of(const std::vector<int>& lengths) {
  std::vector<int> cu{0};
  for (const int n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

int longest(const std::vector<int>& lengths) {
  return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
}

/// Packed rows [T, H, D] of per-sequence lengths as padded [N, H, L, D]
/// (zero past each length), and back.
std::vector<double> padded(const std::vector<double>& packed, const std::vector<int>& lengths,
                           int H, int D) {
  const int N = int(lengths.size()), L = longest(lengths);
  const std::vector<int> cu = offsets_of(lengths);
  std::vector<double> out(std::size_t(N) * H * L * D, 0.0);
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < lengths[n]; ++i)
        for (int d = 0; d < D; ++d)
          out[((std::size_t(n) * H + h) * L + i) * D + d] =
              packed[(std::size_t(cu[n] + i) * H + h) * D + d];
  return out;
}
std::vector<double> packed_rows(const std::vector<double>& pad, const std::vector<int>& lengths,
                                int H, int D) {
  const int N = int(lengths.size()), L = longest(lengths);
  const std::vector<int> cu = offsets_of(lengths);
  std::vector<double> out(std::size_t(cu.back()) * H * D);
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < lengths[n]; ++i)
        for (int d = 0; d < D; ++d)
          out[(std::size_t(cu[n] + i) * H + h) * D + d] =
              pad[((std::size_t(n) * H + h) * L + i) * D + d];
  return out;
}

/// The packed inputs of a case (q, k, v, dO as host vectors) and its device
/// offsets.
struct Packed {
  std::vector<double> q, k, v, g;
  int Tq, Tk;
  at::PackedSequences<Space> seqs;
};

Packed packed_inputs(const VarlenCase& c, unsigned seed) {
  Packed p;
  const std::vector<int> cq = offsets_of(c.len_q), ck = offsets_of(c.len_k);
  p.Tq = cq.back(), p.Tk = ck.back();
  p.q = normal(std::size_t(p.Tq) * c.H * c.D, seed);
  p.k = normal(std::size_t(p.Tk) * c.Hkv * c.D, seed + 1);
  p.v = normal(std::size_t(p.Tk) * c.Hkv * c.Dv, seed + 2);
  p.g = normal(std::size_t(p.Tq) * c.H * c.Dv, seed + 3);
  p.seqs.cu_seqlens_q = ints(cq);
  p.seqs.cu_seqlens_k = ints(ck);
  return p;
}

at::FusedAttentionOptions options_of(const VarlenCase& c, kdnn::KernelForm form) {
  at::FusedAttentionOptions opts;
  opts.scale = 1 / std::sqrt(double(c.D));
  opts.softcap = c.softcap;
  opts.dropout = {c.p, 77, 5};
  opts.launch.form = form;
  return opts;
}

/// The case's mask without lengths; ALiBi slopes one row per sequence.
at::AttentionMask<Space> mask_of(const VarlenCase& c) {
  at::AttentionMask<Space> mask;
  mask.causal = c.causal;
  mask.band_left = c.band_left, mask.band_right = c.band_right;
  if (c.alibi) {
    std::vector<double> slopes;
    for (std::size_t n = 0; n < c.len_q.size(); ++n)
      for (int h = 0; h < c.H; ++h) slopes.push_back(0.05 * (h + 1) + 0.01 * double(n));
    mask.alibi_slopes = to_device<double**>(slopes, c.len_q.size(), c.H);
  }
  return mask;
}

/// o, lse, dq, dk, dv of the varlen calls, packed.
template <class T>
std::vector<std::vector<double>> varlen_outputs(const VarlenCase& c, const Packed& p,
                                                const at::FusedAttentionOptions& opts,
                                                const at::AttentionMask<Space>& mask) {
  const auto q = to_device<T***>(p.q, p.Tq, c.H, c.D), k = to_device<T***>(p.k, p.Tk, c.Hkv, c.D),
             v = to_device<T***>(p.v, p.Tk, c.Hkv, c.Dv), g = to_device<T***>(p.g, p.Tq, c.H, c.Dv);
  DeviceView<T***> o("o", p.Tq, c.H, c.Dv), dq("dq", p.Tq, c.H, c.D), dk("dk", p.Tk, c.Hkv, c.D),
      dv("dv", p.Tk, c.Hkv, c.Dv);
  DeviceView<T**> lse("lse", c.H, p.Tq);
  at::fused_attention_varlen_forward(Space(), q, k, v, o, lse, p.seqs, opts, mask);
  at::fused_attention_varlen_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, p.seqs, opts, mask);
  return {to_host(o), to_host(lse), to_host(dq), to_host(dk), to_host(dv)};
}

/// The same from the dense call on the sequences padded to the longest
/// (mask.seq_q, seq_k: their lengths), packed back.
template <class T>
std::vector<std::vector<double>> padded_outputs(const VarlenCase& c, const Packed& p,
                                                const at::FusedAttentionOptions& opts,
                                                at::AttentionMask<Space> mask) {
  const int N = int(c.len_q.size()), L = longest(c.len_q), Lk = longest(c.len_k);
  mask.seq_q = ints(c.len_q), mask.seq_k = ints(c.len_k);
  // [N, L, H, D] storage read as [N, H, L, D]: rows of heads, as packed.
  const auto dense = [&](const std::vector<double>& x, const std::vector<int>& lengths, int heads,
                         int d) {
    return to_device<T****>(padded(x, lengths, heads, d), N, heads, longest(lengths), d);
  };
  const auto q = dense(p.q, c.len_q, c.H, c.D), k = dense(p.k, c.len_k, c.Hkv, c.D),
             v = dense(p.v, c.len_k, c.Hkv, c.Dv), g = dense(p.g, c.len_q, c.H, c.Dv);
  DeviceView<T****> o("o", N, c.H, L, c.Dv), dq("dq", N, c.H, L, c.D), dk("dk", N, c.Hkv, Lk, c.D),
      dv("dv", N, c.Hkv, Lk, c.Dv);
  DeviceView<T***> lse("lse", N, c.H, L);
  at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
  at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, opts, mask);
  // lse [N, H, L] as [H, Tq].
  const std::vector<double> l = to_host(lse);
  const std::vector<int> cu = offsets_of(c.len_q);
  std::vector<double> lse_packed(std::size_t(c.H) * p.Tq);
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < c.H; ++h)
      for (int i = 0; i < c.len_q[n]; ++i)
        lse_packed[std::size_t(h) * p.Tq + cu[n] + i] = l[(std::size_t(n) * c.H + h) * L + i];
  return {packed_rows(to_host(o), c.len_q, c.H, c.Dv), lse_packed,
          packed_rows(to_host(dq), c.len_q, c.H, c.D),
          packed_rows(to_host(dk), c.len_k, c.Hkv, c.D),
          packed_rows(to_host(dv), c.len_k, c.Hkv, c.Dv)};
}

const char* const kOutputs[] = {"o", "lse", "dq", "dk", "dv"};

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
