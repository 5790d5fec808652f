// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Head sizes past every GPU form (the largest D or Dv that a GPU or
// tensor-core form of the fused attention is compiled for): refused where a
// GPU form would have to run them (a GPU backend, or a launch that pins the
// GPU or tensor-core form), naming the size and the largest, by the dense
// and the packed calls, forward and backward; the host form on a host
// backend takes them, and agrees with a reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "allclose.hpp"
#include "central_differences.hpp"
#include "expect_error.hpp"
#include "fused_case.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/fused_attention_varlen.hpp"
#include "kdnn/attention/impl/fused_attention_forms.hpp"
#include "kdnn/core/impl/backend_traits.hpp"
#include "random.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;
using kdnn::KernelForm;
using T = double;

constexpr int kLargestD = at::impl::largest_gpu_head_size<Space, T>(0);
constexpr int kLargestDv = at::impl::largest_gpu_head_size<Space, T>(1);

/// One head of S queries and Sk keys: q, k [·, D], v [Sk, Dv], and dO
/// [S, Dv] (g), row-major.
struct Head {
  int S, Sk, D, Dv;
  std::vector<double> q, k, v, g;
};

Head random_head(int D, int Dv) {
  const int S = 5, Sk = 7;
  return {S,
          Sk,
          D,
          Dv,
          normal(std::size_t(S) * D, 1),
          normal(std::size_t(Sk) * D, 2),
          normal(std::size_t(Sk) * Dv, 3),
          normal(std::size_t(S) * Dv, 4)};
}

at::FusedAttentionOptions options(const Head& h, KernelForm form) {
  at::FusedAttentionOptions opts;
  opts.scale = 1 / std::sqrt(double(h.D));
  opts.launch.form = form;
  return opts;
}

/// The message's fragment for a head size past the largest.
std::string refusal(const Head& h) {
  return h.D > kLargestD ? "q's head size D=" + std::to_string(h.D) + ", expected at most " +
                               std::to_string(kLargestD)
                         : "v's head size Dv=" + std::to_string(h.Dv) + ", expected at most " +
                               std::to_string(kLargestDv);
}

/// o = softmax(scale·q·kᵀ)·v, in double on the host.
std::vector<double> reference_forward(const Head& h, double scale) {
  const auto at = [](int row, int width, int col) { return std::size_t(row) * width + col; };
  std::vector<double> o(std::size_t(h.S) * h.Dv, 0.0), p(h.Sk);
  for (int i = 0; i < h.S; ++i) {
    for (int j = 0; j < h.Sk; ++j) {
      double s = 0;
      for (int d = 0; d < h.D; ++d) s += h.q[at(i, h.D, d)] * h.k[at(j, h.D, d)];
      p[j] = scale * s;
    }
    const double most = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (double& x : p) sum += (x = std::exp(x - most));
    for (int j = 0; j < h.Sk; ++j) {
      for (int c = 0; c < h.Dv; ++c) o[at(i, h.Dv, c)] += p[j] / sum * h.v[at(j, h.Dv, c)];
    }
  }
  return o;
}

/// The dense forward's o; `o` and `lse` are written.
std::vector<double> forward(const Head& h, const at::FusedAttentionOptions& opts,
                            const DeviceView<T****>& o, const DeviceView<T***>& lse) {
  at::fused_attention_forward(Space(), to_device<T****>(h.q, 1, 1, h.S, h.D),
                              to_device<T****>(h.k, 1, 1, h.Sk, h.D),
                              to_device<T****>(h.v, 1, 1, h.Sk, h.Dv), o, lse, opts);
  return to_host(o);
}

/// dq, dk and dv of the dense backward after the forward.
std::vector<std::vector<double>> gradients(const Head& h, const at::FusedAttentionOptions& opts) {
  DeviceView<T****> o("o", 1, 1, h.S, h.Dv), dq("dq", 1, 1, h.S, h.D), dk("dk", 1, 1, h.Sk, h.D),
      dv("dv", 1, 1, h.Sk, h.Dv);
  DeviceView<T***> lse("lse", 1, 1, h.S);
  forward(h, opts, o, lse);
  at::fused_attention_backward(Space(), to_device<T****>(h.q, 1, 1, h.S, h.D),
                               to_device<T****>(h.k, 1, 1, h.Sk, h.D),
                               to_device<T****>(h.v, 1, 1, h.Sk, h.Dv), o, lse,
                               to_device<T****>(h.g, 1, 1, h.S, h.Dv), dq, dk, dv, opts);
  return {to_host(dq), to_host(dk), to_host(dv)};
}

/// Expects each call (dense and packed, forward and backward) to refuse the
/// head's sizes under opts (checked before anything runs: the tensors are
/// left as allocated).
void expect_refused(const Head& h, const at::FusedAttentionOptions& opts) {
  const std::string fragment = refusal(h);
  DeviceView<T****> q("q", 1, 1, h.S, h.D), k("k", 1, 1, h.Sk, h.D), v("v", 1, 1, h.Sk, h.Dv),
      o("o", 1, 1, h.S, h.Dv), dq("dq", 1, 1, h.S, h.D), dk("dk", 1, 1, h.Sk, h.D),
      dv("dv", 1, 1, h.Sk, h.Dv);
  DeviceView<T***> lse("lse", 1, 1, h.S);
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts), fragment);
  EXPECT_KDNN_ERROR(at::fused_attention_backward(Space(), q, k, v, o, lse, o, dq, dk, dv, opts),
                    fragment);
  DeviceView<T***> pq("q", h.S, 1, h.D), pk("k", h.Sk, 1, h.D), pv("v", h.Sk, 1, h.Dv),
      po("o", h.S, 1, h.Dv), pdq("dq", h.S, 1, h.D), pdk("dk", h.Sk, 1, h.D),
      pdv("dv", h.Sk, 1, h.Dv);
  DeviceView<T**> plse("lse", 1, h.S);
  const at::PackedSequences<Space> seqs{ints({0, h.S}), ints({0, h.Sk})};
  EXPECT_KDNN_ERROR(at::fused_attention_varlen_forward(Space(), pq, pk, pv, po, plse, seqs, opts),
                    fragment);
  EXPECT_KDNN_ERROR(at::fused_attention_varlen_backward(Space(), pq, pk, pv, po, plse, po, pdq, pdk,
                                                        pdv, seqs, opts),
                    fragment);
}

/// The heads with D, then Dv, one past the largest GPU head size (by 8, a
/// size a round-up form would otherwise take).
std::vector<Head> heads_past_the_gpu_forms() {
  return {random_head(kLargestD + 8, 8), random_head(8, kLargestDv + 8)};
}

TEST(FusedAttentionHeadSizes, PastEveryGpuFormAPinnedGpuFormIsRefused) {
  for (const Head& h : heads_past_the_gpu_forms()) {
    for (const KernelForm form : {KernelForm::gpu, KernelForm::tensor_cores}) {
      SCOPED_TRACE("D=" + std::to_string(h.D) + ", Dv=" + std::to_string(h.Dv) + form_suffix(form));
      expect_refused(h, options(h, form));
    }
  }
}

// On a host backend the host form (pinned, or automatic) runs them: o as
// the reference's, the gradients as central differences; on a GPU backend
// any form is refused.
TEST(FusedAttentionHeadSizes, PastEveryGpuFormTheHostFormRunsOnAHost) {
  for (Head h : heads_past_the_gpu_forms()) {
    SCOPED_TRACE("D=" + std::to_string(h.D) + ", Dv=" + std::to_string(h.Dv));
    if (!kdnn::impl::BackendTraits<Space>::is_host) {
      expect_refused(h, options(h, KernelForm::host));
      expect_refused(h, options(h, KernelForm::automatic));
      continue;
    }
    const at::FusedAttentionOptions opts = options(h, KernelForm::host);
    DeviceView<T****> o("o", 1, 1, h.S, h.Dv);
    DeviceView<T***> lse("lse", 1, 1, h.S);
    EXPECT_ALLCLOSE(forward(h, opts, o, lse), reference_forward(h, opts.scale), 1e-12, 1e-12);
    const auto grads = gradients(h, opts);
    EXPECT_EQ(gradients(h, options(h, KernelForm::automatic)), grads);
    const auto loss = [&] {
      const std::vector<double> out = forward(h, opts, o, lse);
      double l = 0;
      for (std::size_t x = 0; x < out.size(); ++x) l += h.g[x] * out[x];
      return l;
    };
    const double step = 1e-6, tol = 1e-7;
    expect_gradient("dq", h.q, loss, step, grads[0], tol);
    expect_gradient("dk", h.k, loss, step, grads[1], tol);
    expect_gradient("dv", h.v, loss, step, grads[2], tol);
  }
}

}  // namespace
