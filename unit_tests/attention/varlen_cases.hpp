// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The packed (varlen) fused attention tests' packings and runs: the cases
// (lengths 0, 1, around a block, several blocks), the packing's offsets,
// padding to the longest and back, the packed inputs, and one packed and one
// padded dense forward and backward.
#pragma once
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

namespace kdnn_test {

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

inline std::vector<VarlenCase> varlen_cases() {
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

inline std::vector<int> offsets_of(const std::vector<int>& lengths) {
  std::vector<int> cu{0};
  for (const int n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

inline int longest(const std::vector<int>& lengths) {
  return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
}

/// Packed rows [T, H, D] of per-sequence lengths as padded [N, H, L, D]
/// (zero past each length), and back.
inline std::vector<double> padded(const std::vector<double>& packed,
                                  const std::vector<int>& lengths, int H, int D) {
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
inline std::vector<double> packed_rows(const std::vector<double>& pad,
                                       const std::vector<int>& lengths, int H, int D) {
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

inline Packed packed_inputs(const VarlenCase& c, unsigned seed) {
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

inline at::FusedAttentionOptions options_of(const VarlenCase& c, kdnn::KernelForm form) {
  at::FusedAttentionOptions opts;
  opts.scale = 1 / std::sqrt(double(c.D));
  opts.softcap = c.softcap;
  opts.dropout = {c.p, 77, 5};
  opts.launch.form = form;
  return opts;
}

/// The case's mask without lengths; ALiBi slopes one row per sequence.
inline at::AttentionMask<Space> mask_of(const VarlenCase& c) {
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

inline const char* const kOutputs[] = {"o", "lse", "dq", "dk", "dv"};

}  // namespace kdnn_test
