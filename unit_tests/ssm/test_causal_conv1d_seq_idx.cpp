// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The causal conv1d over packed sequences (seq_idx): each call equals the
// calls per sequence, in both forms (the host's tiles, the GPU's register
// windows) and for a width only the tiles take, float and double, forward
// and backward: y, dx and the states bitwise (to contraction rounding where
// the host fuses multiply-adds), dw and dbias (summed in another order) to
// rounding. Sequences of lengths 0, 1, K − 2, K − 1, K and long; the initial
// state belongs to step 0's sequence, the final state to the last step's.
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <limits>
#include <vector>

#include "allclose.hpp"
#include "contraction.hpp"
#include "expect_error.hpp"
#include "kdnn/ssm/causal_conv1d.hpp"
#include "random.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace ssm = kdnn::ssm;

/// Forward and backward outputs: y, final, dx, dinit ([B, ·, C] order), dw, dbias.
using Outputs = std::array<std::vector<double>, 6>;

/// One call of the forward and the backward on contiguous [B, L, C] data.
template <class T>
Outputs conv_call(std::size_t B, std::size_t L, std::size_t C, std::size_t K,
                  const std::vector<double>& x, const std::vector<double>& w,
                  const std::vector<double>& bias, const std::vector<double>* init,
                  const std::vector<double>& dy, const std::vector<double>* dfinal,
                  const std::vector<double>* seq_idx, const ssm::CausalConv1dOptions& opts) {
  const std::size_t K1 = K - 1;
  const auto xv = to_device<T***>(x, B, L, C), gv = to_device<T***>(dy, B, L, C);
  const auto wv = to_device<T**>(w, C, K);
  const auto bv = to_device<T*>(bias, C);
  DeviceView<T***> iv, fv;
  if (init) iv = to_device<T***>(*init, B, K1, C);
  if (dfinal) fv = to_device<T***>(*dfinal, B, K1, C);
  DeviceView<int**> sv;
  if (seq_idx) sv = to_device<int**>(*seq_idx, B, L);
  DeviceView<T***> y("y", B, L, C), fin("final", B, K1, C), dx("dx", B, L, C),
      dinit("dinit", B, K1, C);
  DeviceView<T**> dw("dw", C, K);
  DeviceView<T*> dbias("dbias", C);
  ssm::causal_conv1d_forward(Space(), ssm::ConvForward<T, Space>{xv, wv, bv, iv, y, fin, sv}, opts);
  ssm::causal_conv1d_backward(
      Space(), ssm::ConvBackward<T, Space>{xv, wv, bv, iv, gv, fv, dx, dw, dbias, dinit, sv}, opts);
  return {to_host(y), to_host(fin), to_host(dx), to_host(dinit), to_host(dw), to_host(dbias)};
}

/// Rows [s0, s0 + n) of a [B, L, C] array's batch entry b, as [1, n, C].
std::vector<double> rows(const std::vector<double>& v, std::size_t L, std::size_t C, std::size_t b,
                         std::size_t s0, std::size_t n) {
  const auto first = v.begin() + std::ptrdiff_t((b * L + s0) * C);
  return {first, first + std::ptrdiff_t(n * C)};
}

template <class T>
class CausalConv1dSeqIdx : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CausalConv1dSeqIdx, Types);

TYPED_TEST(CausalConv1dSeqIdx, PackedCallEqualsTheCallsPerSequence) {
  using T = TypeParam;
  const double exact = host_contracts() ? 8 * std::numeric_limits<T>::epsilon() : 0;
  const double sums = 64 * std::numeric_limits<T>::epsilon();
  unsigned seed = 500;
  for (const std::size_t K : {2, 4, 7}) {
    // Per batch entry, the lengths of its sequences (a 0 is a skipped id).
    const std::vector<std::vector<std::size_t>> lengths = {
        {1, K - 1, 0, K, 150, K > 2 ? K - 2 : 1, 3}, {70, 1, 1, K + 1, 60, 1}};
    std::size_t L = 0;
    for (const std::size_t n : lengths[0]) L += n;
    std::size_t L1 = 0;
    for (const std::size_t n : lengths[1]) L1 += n;
    const std::size_t B = 2, C = 37, K1 = K - 1;
    // Entry 1 pads its sequences with a last one to L steps.
    std::vector<std::vector<std::size_t>> runs = lengths;
    if (L1 < L) runs[1].push_back(L - L1);
    ASSERT_LE(L1, L) << "the test's lengths: entry 1 longer than entry 0";
    std::vector<double> seq(B * L);
    for (std::size_t b = 0; b < B; ++b) {
      std::size_t t = 0;
      int id = 10 * int(b);
      for (const std::size_t n : runs[b]) {
        for (std::size_t i = 0; i < n; ++i) seq[b * L + t++] = id;
        ++id;
      }
    }
    const std::vector<double> x = normal(B * L * C, seed), w = normal(C * K, seed + 1),
                              bias = normal(C, seed + 2), init = normal(B * K1 * C, seed + 3),
                              dy = normal(B * L * C, seed + 4), dfin = normal(B * K1 * C, seed + 5);
    seed += 10;
    for (const auto form : {kdnn::KernelForm::host, kdnn::KernelForm::gpu}) {
      for (const bool silu : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << "K=" << K << " form " << int(form) << " silu=" << silu);
        ssm::CausalConv1dOptions opts;
        opts.silu = silu;
        opts.launch.form = form;
        const Outputs got = conv_call<T>(B, L, C, K, x, w, bias, &init, dy, &dfin, &seq, opts);

        // The calls per sequence: the initial state to each entry's first
        // sequence, d(final state) to its last.
        Outputs want;
        want[4].assign(C * K, 0.0);
        want[5].assign(C, 0.0);
        want[0].resize(B * L * C);
        want[2].resize(B * L * C);
        for (std::size_t b = 0; b < B; ++b) {
          const std::vector<double> init_b = rows(init, K1, C, b, 0, K1),
                                    dfin_b = rows(dfin, K1, C, b, 0, K1);
          std::size_t t = 0;
          std::vector<std::size_t> live;  // the entry's sequences with steps
          for (const std::size_t n : runs[b])
            if (n > 0) live.push_back(n);
          for (std::size_t i = 0; i < live.size(); ++i) {
            const std::size_t n = live[i];
            const bool first = i == 0, last = i + 1 == live.size();
            const Outputs one =
                conv_call<T>(1, n, C, K, rows(x, L, C, b, t, n), w, bias, first ? &init_b : nullptr,
                             rows(dy, L, C, b, t, n), last ? &dfin_b : nullptr, nullptr, opts);
            std::copy(one[0].begin(), one[0].end(),
                      want[0].begin() + std::ptrdiff_t((b * L + t) * C));
            std::copy(one[2].begin(), one[2].end(),
                      want[2].begin() + std::ptrdiff_t((b * L + t) * C));
            if (last) want[1].insert(want[1].end(), one[1].begin(), one[1].end());
            if (first) {
              // The first sequence's d(initial state); the entry's final
              // state is the last one's.
              want[3].insert(want[3].end(), one[3].begin(), one[3].end());
            }
            for (std::size_t j = 0; j < C * K; ++j) want[4][j] += one[4][j];
            for (std::size_t j = 0; j < C; ++j) want[5][j] += one[5][j];
            t += n;
          }
        }
        const char* names[] = {"y", "final_state", "dx", "dinitial_state", "dw", "dbias"};
        for (int i = 0; i < 6; ++i) {
          const double tol = i < 4 ? exact : sums;
          EXPECT_ALLCLOSE(got[i], want[i], tol, tol) << names[i];
        }
      }
    }
  }
}

// The ids are compared, not ordered: any int32 values, a batch entry of one
// sequence equal to the call without seq_idx.
TEST(CausalConv1dSeqIdx, OneSequencePerEntryEqualsTheCallWithout) {
  using T = double;
  const std::size_t B = 2, L = 50, C = 5, K = 4;
  const std::vector<double> x = normal(B * L * C, 1), w = normal(C * K, 2), bias = normal(C, 3),
                            init = normal(B * (K - 1) * C, 4), dy = normal(B * L * C, 5),
                            dfin = normal(B * (K - 1) * C, 6);
  std::vector<double> seq(B * L, -2147483648.0);
  for (std::size_t t = 0; t < L; ++t) seq[L + t] = 2147483647.0;
  for (const auto form : {kdnn::KernelForm::host, kdnn::KernelForm::gpu}) {
    ssm::CausalConv1dOptions opts;
    opts.launch.form = form;
    const Outputs with = conv_call<T>(B, L, C, K, x, w, bias, &init, dy, &dfin, &seq, opts);
    const Outputs without = conv_call<T>(B, L, C, K, x, w, bias, &init, dy, &dfin, nullptr, opts);
    for (int i = 0; i < 6; ++i) EXPECT_ALLCLOSE(with[i], without[i], 0, 0) << i;
  }
}

// A seq_idx of the wrong shape is a kdnn::Error naming it.
TEST(CausalConv1dSeqIdxErrors, ShapeIsChecked) {
  using T = double;
  const std::size_t B = 2, L = 6, C = 3, K = 3;
  DeviceView<T***> x("x", B, L, C), y("y", B, L, C), dy("dy", B, L, C), dx("dx", B, L, C);
  DeviceView<T**> w("w", C, K), dw("dw", C, K);
  DeviceView<int**> short_rows("seq_idx", B, L - 1), one_entry("seq_idx", 1, L);
  EXPECT_KDNN_ERROR(ssm::causal_conv1d_forward(
                        Space(), ssm::ConvForward<T, Space>{x, w, {}, {}, y, {}, short_rows}),
                    "seq_idx has extent(1)=5, expected 6 (L, x's extent(1))");
  EXPECT_KDNN_ERROR(
      ssm::causal_conv1d_backward(
          Space(), ssm::ConvBackward<T, Space>{x, w, {}, {}, dy, {}, dx, dw, {}, {}, one_entry}),
      "seq_idx has extent(0)=1, expected 2 (B, x's extent(0))");
}

}  // namespace
