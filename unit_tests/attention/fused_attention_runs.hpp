// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The fused attention tests' cases and runs: the cases (every mask, sizes
// not multiples of the blocks, D from 4 to 256, D != Dv, dropout), random
// inputs, one fused forward and backward, and the unfused chain's gradients.
#pragma once
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
#include "fused_case.hpp"
#include "kdnn/attention/batched_gemm.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/impl/fused_attention_impl.hpp"
#include "mha_reference.hpp"
#include "views.hpp"

namespace kdnn_test {

namespace at = kdnn::attention;

inline std::vector<FusedCase> fused_cases() {
  return {
      {"plain, S and Sk not block multiples", 2, 2, 37, 70, 16, 16, false, {}, {}, {}, {}, 0},
      {"D != Dv, causal", 1, 3, 65, 65, 16, 8, true, {}, {}, {}, {}, 0},
      {"lengths: padded queries, an entry without keys",
       3,
       1,
       20,
       33,
       8,
       8,
       false,
       {},
       {},
       {20, 7, 13},
       {33, 0, 9},
       0},
      {"windows with empty rows",
       1,
       2,
       5,
       9,
       4,
       4,
       false,
       {0, 3, 3, 8, 0},
       {9, 3, 7, 9, 1},
       {},
       {},
       0},
      {"dropout 0.2, causal, S > Sk", 2, 2, 40, 24, 16, 12, true, {}, {}, {}, {}, 0.2},
      {"D = 64", 1, 2, 70, 130, 64, 64, false, {}, {}, {}, {}, 0},
      {"D = 128, dropout", 1, 1, 40, 50, 128, 128, false, {}, {}, {}, {}, 0.1},
      {"D = 256, Dv = 128, causal", 1, 1, 33, 40, 256, 128, true, {}, {}, {}, {}, 0},
      // Several blocks each way, so that tiles every query of a block sees
      // whole (no mask applied) mix with masked ones in one head.
      {"causal, several blocks", 1, 2, 150, 150, 16, 16, true, {}, {}, {}, {}, 0},
      {"key lengths, several blocks", 2, 1, 140, 140, 16, 16, false, {}, {}, {}, {140, 100}, 0},
      // Head sizes of the GPU forms (D and Dv each in {32, 64, 128, 256}).
      {"D = 32, causal, several blocks", 1, 2, 150, 140, 32, 32, true, {}, {}, {}, {}, 0},
      {"D = 64, lengths, an entry without keys",
       3,
       1,
       70,
       90,
       64,
       64,
       false,
       {},
       {},
       {70, 5, 33},
       {90, 0, 41},
       0},
      {"D = 128, windows with empty rows, dropout",
       1,
       2,
       9,
       40,
       128,
       128,
       false,
       {0, 5, 10, 39, 0, 20, 40, 3, 0},
       {40, 5, 30, 40, 1, 38, 40, 35, 12},
       {},
       {},
       0.3},
      {"D = 256, causal, S > Sk", 1, 1, 40, 20, 256, 256, true, {}, {}, {}, {}, 0},
      {"D = 32, one query and one key, dropout", 2, 1, 1, 1, 32, 32, false, {}, {}, {}, {}, 0.5},
      // GPU forms with D != Dv: values wider and narrower than the keys.
      {"D = 32, Dv = 128, causal, S > Sk", 1, 2, 70, 45, 32, 128, true, {}, {}, {}, {}, 0},
      {"D = 128, Dv = 64, lengths, dropout",
       2,
       1,
       40,
       50,
       128,
       64,
       false,
       {},
       {},
       {40, 17},
       {50, 23},
       0.2},
      {"D = 64, Dv = 256, several blocks", 1, 1, 100, 70, 64, 256, false, {}, {}, {}, {}, 0},
  };
}

/// Random q, k, v and dO (g) of a case on the device, from seeds seed,
/// seed + 1, seed + 2, seed + 3 (seed advances by 4); k and v with
/// `kv_heads` heads (0: the case's H).
template <class T>
std::array<DeviceView<T****>, 4> random_inputs(const FusedCase& c, unsigned& seed,
                                               int kv_heads = 0) {
  const int Hkv = kv_heads > 0 ? kv_heads : c.H;
  const std::size_t nq = std::size_t(c.B) * c.H * c.S, nk = std::size_t(c.B) * Hkv * c.Sk;
  const auto q = to_device<T****>(normal(nq * c.D, seed), c.B, c.H, c.S, c.D);
  const auto k = to_device<T****>(normal(nk * c.D, seed + 1), c.B, Hkv, c.Sk, c.D);
  const auto v = to_device<T****>(normal(nk * c.Dv, seed + 2), c.B, Hkv, c.Sk, c.Dv);
  const auto g = to_device<T****>(normal(nq * c.Dv, seed + 3), c.B, c.H, c.S, c.Dv);
  seed += 4;
  return {q, k, v, g};
}

/// o, lse, dq, dk and dv of one fused forward and backward.
template <class T>
std::vector<std::vector<double>> fused_outputs(const DeviceView<T****>& q,
                                               const DeviceView<T****>& k,
                                               const DeviceView<T****>& v,
                                               const DeviceView<T****>& g,
                                               const at::FusedAttentionOptions& opts,
                                               const at::AttentionMask<Space>& mask) {
  const int B = int(q.extent(0)), H = int(q.extent(1)), S = int(q.extent(2)), D = int(q.extent(3)),
            Sk = int(k.extent(2)), Dv = int(v.extent(3));
  DeviceView<T****> o("o", B, H, S, Dv), dq("dq", B, H, S, D), dk("dk", B, H, Sk, D),
      dv("dv", B, H, Sk, Dv);
  DeviceView<T***> lse("lse", B, H, S);
  at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
  at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, opts, mask);
  return {to_host(o), to_host(lse), to_host(dq), to_host(dk), to_host(dv)};
}

/// The unfused chain's gradients: P, dropout, dV = Pdᵀ·dO, dPd = dO·Vᵀ, dP,
/// dS, dQ, dK.
template <class T>
void unfused_backward(const DeviceView<T****>& q, const DeviceView<T****>& k,
                      const DeviceView<T****>& v, const DeviceView<T****>& g,
                      const at::FusedAttentionOptions& opts, const at::AttentionMask<Space>& mask,
                      const DeviceView<T****>& dq2, const DeviceView<T****>& dk2,
                      const DeviceView<T****>& dv2) {
  const int B = int(q.extent(0)), H = int(q.extent(1)), S = int(q.extent(2)), Sk = int(k.extent(2));
  const auto shape4 = [&](const char* name) {
    return DeviceView<T****>(std::string(name), B, H, S, Sk);
  };
  auto scores = shape4("scores"), P = shape4("P"), Pd = shape4("Pd"), dPd = shape4("dPd"),
       dP = shape4("dP"), dS = shape4("dS");
  const auto none = at::Op::none, tr = at::Op::transpose;
  at::batched_gemm(Space(), none, tr, none, T(1), q, k, T(0), scores);
  at::softmax_forward(Space(), scores, P, {at::SoftmaxMode::accurate, opts.scale}, mask);
  at::dropout_forward(Space(), P, Pd, opts.dropout);
  at::batched_gemm(Space(), tr, none, none, T(1), Pd, g, T(0), dv2);
  at::batched_gemm(Space(), none, tr, none, T(1), g, v, T(0), dPd);
  at::dropout_backward(Space(), dPd, dP, opts.dropout);
  at::softmax_backward(Space(), P, dP, dS, {at::SoftmaxMode::accurate, opts.scale}, mask);
  at::batched_gemm(Space(), none, none, none, T(1), dS, k, T(0), dq2);
  at::batched_gemm(Space(), tr, none, none, T(1), dS, q, T(0), dk2);
}

/// The typed tests' fixture, one class for every file that adds to the
/// suite (gtest refuses a suite whose tests come from two fixture classes).
template <class T>
class FusedAttention : public ::testing::Test {};
using Types = ::testing::Types<float, double>;

}  // namespace kdnn_test
