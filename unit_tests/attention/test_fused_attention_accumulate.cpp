// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// FusedAttentionBackward::accumulate: the backward adds its dq, dk and dv to
// the outputs' values on entry (what a sum over blocks of keys needs, as
// context parallelism's ring does), in every kernel form and schedule, with
// and without grouped-query heads; without it they are overwritten, whatever
// the outputs held.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "allclose.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "random.hpp"
#include "views.hpp"

namespace {
namespace accumulate_test {  // one name for this file's helpers (unity builds)

using namespace kdnn_test;
namespace at = kdnn::attention;
using Vec = std::vector<double>;

constexpr int B = 2, H = 4, S = 37, Sk = 45, D = 32;

struct Grads {
  Vec dq, dk, dv;
};

/// The causal attention's gradients, written over (accumulate false) or
/// added to (true) the outputs' values `before`.
Grads backward(const at::FusedAttentionOptions& opts, int Hkv, const Grads& before,
               bool accumulate) {
  const auto q = to_device<double****>(normal(std::size_t(B) * H * S * D, 1), B, H, S, D);
  const auto k = to_device<double****>(normal(std::size_t(B) * Hkv * Sk * D, 2), B, Hkv, Sk, D);
  const auto v = to_device<double****>(normal(std::size_t(B) * Hkv * Sk * D, 3), B, Hkv, Sk, D);
  const auto dout = to_device<double****>(normal(std::size_t(B) * H * S * D, 4), B, H, S, D);
  at::AttentionMask<Space> mask;
  mask.causal = true;
  DeviceView<double****> o("o", B, H, S, D);
  DeviceView<double***> lse("lse", B, H, S);
  at::fused_attention_forward(
      Space(), at::FusedAttentionForward<double, Space>{q, k, v, o, lse, mask}, opts);
  const auto dq = to_device<double****>(before.dq, B, H, S, D);
  const auto dk = to_device<double****>(before.dk, B, Hkv, Sk, D);
  const auto dv = to_device<double****>(before.dv, B, Hkv, Sk, D);
  at::FusedAttentionBackward<double, Space> args{q, k, v, o, lse, dout, dq, dk, dv, mask};
  args.accumulate = accumulate;
  at::fused_attention_backward(Space(), args, opts);
  return {to_host(dq), to_host(dk), to_host(dv)};
}

Vec plus(Vec a, const Vec& b) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

void expect_accumulates(const at::FusedAttentionOptions& opts, int Hkv) {
  const Grads zeros{Vec(std::size_t(B) * H * S * D, 0.0), Vec(std::size_t(B) * Hkv * Sk * D, 0.0),
                    Vec(std::size_t(B) * Hkv * Sk * D, 0.0)};
  const Grads before{normal(zeros.dq.size(), 5), normal(zeros.dk.size(), 6),
                     normal(zeros.dv.size(), 7)};
  const Grads fresh = backward(opts, Hkv, zeros, false);
  // Overwritten: the values on entry do not matter.
  const Grads over = backward(opts, Hkv, before, false);
  EXPECT_EQ(over.dq, fresh.dq);
  EXPECT_EQ(over.dk, fresh.dk);
  EXPECT_EQ(over.dv, fresh.dv);
  // Added: the values on entry plus the gradients (the sums' order may
  // differ from the fresh run's by a rounding).
  const Grads added = backward(opts, Hkv, before, true);
  EXPECT_ALLCLOSE(added.dq, plus(before.dq, fresh.dq), 1e-13, 1e-13);
  EXPECT_ALLCLOSE(added.dk, plus(before.dk, fresh.dk), 1e-13, 1e-13);
  EXPECT_ALLCLOSE(added.dv, plus(before.dv, fresh.dv), 1e-13, 1e-13);
}

TEST(FusedAttentionAccumulate, EveryFormAndScheduleAddsToTheOutputs) {
  struct Form {
    const char* name;
    kdnn::KernelForm form;
    at::FusedBackwardSchedule schedule;
  };
  const Form forms[] = {
      {"host, per head", kdnn::KernelForm::host, at::FusedBackwardSchedule::per_head},
      {"host, per key block", kdnn::KernelForm::host, at::FusedBackwardSchedule::per_key_block},
      {"gpu", kdnn::KernelForm::gpu, at::FusedBackwardSchedule::automatic},
      {"tensor cores", kdnn::KernelForm::tensor_cores, at::FusedBackwardSchedule::automatic}};
  for (const Form& f : forms) {
    for (const int Hkv : {H, 2}) {  // dK, dV written by the kernels; summed from shares
      SCOPED_TRACE(std::string(f.name) + ", Hkv = " + std::to_string(Hkv));
      at::FusedAttentionOptions opts;
      opts.scale = 1.0 / std::sqrt(double(D));
      opts.launch.form = f.form;
      opts.backward = f.schedule;
      expect_accumulates(opts, Hkv);
    }
  }
}

}  // namespace accumulate_test
}  // namespace
