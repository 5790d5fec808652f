// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The fused attention's launches (results independent of the launch shape,
// a GPU launch past level-0 scratch), the memory it allocates, and its
// errors.
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
#include "fused_attention_runs.hpp"
#include "fused_case.hpp"
#include "kdnn/attention/batched_gemm.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/impl/fused_attention_impl.hpp"
#include "mha_reference.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;

TEST(FusedAttentionLaunch, ResultsDoNotDependOnTheLaunchShape) {
  using T = float;
  const int B = 2, H = 2, S = 70, Sk = 45, D = 24, Dv = 16;
  const auto q = to_device<T****>(normal(std::size_t(B) * H * S * D, 601), B, H, S, D);
  const auto k = to_device<T****>(normal(std::size_t(B) * H * Sk * D, 602), B, H, Sk, D);
  const auto v = to_device<T****>(normal(std::size_t(B) * H * Sk * Dv, 603), B, H, Sk, Dv);
  const auto g = to_device<T****>(normal(std::size_t(B) * H * S * Dv, 604), B, H, S, Dv);
  at::AttentionMask<Space> mask;
  mask.causal = true;
  const auto run = [&](const kdnn::Launch& launch, at::FusedBackwardSchedule schedule) {
    at::FusedAttentionOptions opts;
    opts.backward = schedule;
    opts.scale = 0.3;
    opts.dropout = {0.1, 5, 0};
    opts.launch = launch;
    return fused_outputs<T>(q, k, v, g, opts, mask);
  };
  std::vector<kdnn::Launch> launches = {{0, 1, 1}};
  const bool host = kdnn::impl::BackendTraits<Space>::is_host;
  if (!host) launches.push_back({0, 4, 8});
  if (host && Space().concurrency() >= 2) launches.push_back({0, 2, 1});
  for (const auto schedule :
       {at::FusedBackwardSchedule::per_head, at::FusedBackwardSchedule::per_key_block}) {
    const auto reference = run({}, schedule);
    for (const kdnn::Launch& launch : launches) {
      EXPECT_EQ(run(launch, schedule), reference)
          << "team_size=" << launch.team_size << ", vector_length=" << launch.vector_length
          << ", schedule " << int(schedule);
    }
  }
}

// Blocks past on-chip scratch: a GPU launch (forced here) strides a bounded
// league over them in a team workspace (core/impl/team_work.hpp), a host
// launch gives each its team and level-1 scratch; bitwise the same results.
// The backward in double has no GPU form for Dv between 128 and the largest
// GPU head size, so the GPU launch runs the host kernels there (past that
// size a GPU launch is refused: test_fused_attention_head_sizes.cpp).
TEST(FusedAttentionLaunch, GpuLaunchPastLevelZeroMatchesTheDefault) {
  using T = double;
  const int B = 2, H = 3, S = 150, Sk = 130, D = 128, Dv = 200;
  const FusedCase c{"past level 0", B, H, S, Sk, D, Dv, true, {}, {}, {}, {}, 0};
  unsigned seed = 611;
  const auto in = random_inputs<T>(c, seed);  // named below: a lambda takes them
  const auto &q = in[0], &k = in[1], &v = in[2], &g = in[3];
  at::FusedAttentionOptions opts;
  opts.scale = 0.2;
  opts.launch.form = kdnn::KernelForm::gpu;
  ASSERT_EQ((at::impl::backward_form<Space, T>(Space(), opts, D, Dv)), kdnn::KernelForm::host)
      << "no GPU form of the backward may take the case";
  {
    int bq = 0, bk = 0;
    at::impl::fused_block_sizes<Space>(S, Sk, D, Dv, bq, bk);
    const std::size_t bytes = kdnn::impl::layout_bytes([&](kdnn::impl::ScratchCarver& s) {
      at::impl::FusedBackwardKVKernel<Space, T>::carve(s, bq, bk, D, Dv);
    });
    ASSERT_GT(bytes, kdnn::impl::scratch_capacity<Space>(0)) << "the case must be past level 0";
    ASSERT_GT(S, 2 * bq) << "several query blocks per head";
  }
  at::AttentionMask<Space> mask;
  mask.causal = true;
  DeviceView<T****> o("o", B, H, S, Dv);
  DeviceView<T***> lse("lse", B, H, S);
  at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
  const auto gradients = [&](kdnn::KernelForm form, at::FusedBackwardSchedule schedule) {
    at::FusedAttentionOptions with = opts;
    with.launch.form = form;
    with.backward = schedule;
    DeviceView<T****> dq("dq", B, H, S, D), dk("dk", B, H, Sk, D), dv("dv", B, H, Sk, Dv);
    at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, with, mask);
    return std::vector<std::vector<double>>{to_host(dq), to_host(dk), to_host(dv)};
  };
  for (const auto schedule :
       {at::FusedBackwardSchedule::per_head, at::FusedBackwardSchedule::per_key_block}) {
    const auto gpu = gradients(kdnn::KernelForm::gpu, schedule);
    EXPECT_EQ(gpu, gradients(kdnn::KernelForm::host, schedule)) << "schedule " << int(schedule);
    for (const auto& x : gpu) EXPECT_NE(x, std::vector<double>(x.size(), 0.0));
  }
}

// A head dimension whose blocks exceed the backend's team scratch is refused
// with the sizes, before anything runs.
TEST(FusedAttentionErrors, ScratchPastTheLimitIsAClearError) {
  using Kernel = at::impl::FusedForwardKernel<Space, double>;
  const auto bytes = [](int D) {
    int bq = 0, bk = 0;
    at::impl::fused_block_sizes<Space>(1, 1, D, 1, bq, bk);  // S = Sk = 1, as below
    return kdnn::impl::layout_bytes(
        [&](kdnn::impl::ScratchCarver& s) { Kernel::carve(s, bq, bk, D, 1); });
  };
  const char* limit_what = nullptr;  // a GPU's launches: the team workspace's budget
  const std::size_t limit = kdnn::impl::scratch_limit<Space>(
      kdnn::impl::is_gpu_launch<Space>(kdnn::Launch{}), limit_what);
  int D = 64;
  while (bytes(D) <= limit) D *= 2;
  const auto alloc = [](const char* name, int d) {
    return DeviceView<double****>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(name)), 1, 1, 1, d);
  };
  DeviceView<double***> lse("lse", 1, 1, 1);
  // On a GPU backend such a D is past every GPU form, refused as that.
  const bool host = kdnn::impl::BackendTraits<Space>::is_host;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), alloc("q", D), alloc("k", D),
                                                alloc("v", 1), alloc("o", 1), lse),
                    host ? "bytes of team scratch, above the" : "q's head size D=");
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), alloc("q", D), alloc("k", D),
                                                alloc("v", 1), alloc("o", 1), lse),
                    "D=" + std::to_string(D));
}

// The memory claim, measured: beyond its inputs, outputs and the backend's
// team scratch (block-sized, kept between launches) the fused forward +
// backward allocate O(B·H·S) (the row sums δ), the same for every Sk, where
// the unfused path needs [B, H, S, Sk] tensors.
TEST(FusedAttentionMemory, ExtraAllocationsDoNotGrowWithTheKeyLength) {
  using T = float;
  const int B = 2, H = 2, S = 96, D = 16;
  std::vector<std::int64_t> peaks;
  for (int Sk : {64, 1024}) {
    const std::size_t nq = std::size_t(B) * H * S, nk = std::size_t(B) * H * Sk;
    const auto q = to_device<T****>(normal(nq * D, 1), B, H, S, D);
    const auto k = to_device<T****>(normal(nk * D, 2), B, H, Sk, D);
    const auto v = to_device<T****>(normal(nk * D, 3), B, H, Sk, D);
    const auto g = to_device<T****>(normal(nq * D, 4), B, H, S, D);
    DeviceView<T****> o("o", B, H, S, D), dq("dq", B, H, S, D), dk("dk", B, H, Sk, D),
        dv("dv", B, H, Sk, D);
    DeviceView<T***> lse("lse", B, H, S);
    at::AttentionMask<Space> mask;
    mask.causal = true;
    at::FusedAttentionOptions opts;
    opts.dropout = {0.1, 3, 0};
    // Warm-up: backends keep their team-scratch pools between launches.
    at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
    at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, opts, mask);
    Space().fence();
    {
      AllocationCounter counter;
      {  // the counter sees allocations: a control of known size
        DeviceView<T*> control("control", 1000);
      }
      EXPECT_GE(AllocationCounter::peak, std::int64_t(1000 * sizeof(T)));
      AllocationCounter::current = AllocationCounter::peak = 0;
      AllocationCounter::labels.clear();
      at::fused_attention_forward(Space(), q, k, v, o, lse, opts, mask);
      at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq, dk, dv, opts, mask);
      Space().fence();
      peaks.push_back(AllocationCounter::peak);
      EXPECT_LE(peaks.back(), std::int64_t(nq * sizeof(T)) + 4096)
          << "Sk=" << Sk << ", allocations " << AllocationCounter::labels;
    }

    // With the row sums in a workspace the caller owns, the backward
    // allocates nothing and gives bitwise the same gradients.
    DeviceView<T***> delta("delta", B, H, S);
    DeviceView<T****> dq2("dq2", B, H, S, D), dk2("dk2", B, H, Sk, D), dv2("dv2", B, H, Sk, D);
    at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq2, dk2, dv2, delta, opts, mask);
    Space().fence();
    {
      AllocationCounter counter;
      at::fused_attention_backward(Space(), q, k, v, o, lse, g, dq2, dk2, dv2, delta, opts, mask);
      Space().fence();
      EXPECT_EQ(AllocationCounter::peak, 0)
          << "Sk=" << Sk << ", allocations " << AllocationCounter::labels;
    }
    EXPECT_EQ(to_host(dq2), to_host(dq)) << "Sk=" << Sk;
    EXPECT_EQ(to_host(dk2), to_host(dk)) << "Sk=" << Sk;
    EXPECT_EQ(to_host(dv2), to_host(dv)) << "Sk=" << Sk;
  }
  EXPECT_EQ(peaks[0], peaks[1]);
}

// check_scores: a scale with which scale·q·k can pass float's range is an
// error naming it (unchecked, such scores are inf and the softmax NaN); what
// fits runs; a non-finite q or k is check_finite's.
TEST(FusedAttentionErrors, ScoresPastTheRangeAreRefusedWhenChecked) {
  DeviceView<float****> q("q", 1, 2, 3, 4), k("k", 1, 2, 5, 4), v("v", 1, 2, 5, 6),
      o("o", 1, 2, 3, 6);
  DeviceView<float***> lse("lse", 1, 2, 3);
  Kokkos::deep_copy(q, 3.0f);  // every score is 36·scale
  Kokkos::deep_copy(k, 3.0f);
  Kokkos::deep_copy(v, 1.0f);
  at::FusedAttentionOptions opts;
  opts.check_scores = true;
  opts.scale = 1e37;  // scores 3.6e38 > FLT_MAX
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "opts.scale=1e+37 with max|q|=3, max|k|=3 and D=4 could take a score past");
  opts.scale = -1e37;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "opts.scale=-1e+37 with max|q|=3");
  opts.scale = 1e30;
  at::fused_attention_forward(Space(), q, k, v, o, lse, opts);
  for (double x : to_host(o)) EXPECT_EQ(x, 1.0);  // every row averages ones

  DeviceView<double****> qd("q", 1, 2, 3, 4), kd("k", 1, 2, 5, 4), vd("v", 1, 2, 5, 6),
      od("o", 1, 2, 3, 6);
  DeviceView<double***> lsed("lse", 1, 2, 3);
  Kokkos::deep_copy(qd, 3.0);
  Kokkos::deep_copy(kd, 3.0);
  opts.scale = 1e37;  // within double's range
  at::fused_attention_forward(Space(), qd, kd, vd, od, lsed, opts);

  // A NaN or an infinity is check_finite's, not check_scores': it propagates
  // unless check_finite refuses it; check_scores still guards the finite
  // values beside it.
  opts.scale = 0.5;
  Kokkos::deep_copy(Kokkos::subview(q, 0, 1, 2, 3), std::numeric_limits<float>::quiet_NaN());
  at::fused_attention_forward(Space(), q, k, v, o, lse, opts);
  const auto out = to_host(o);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const bool row_1_2 = i / 6 == 1 * 3 + 2;  // o[0, 1, 2, :]: the row of the NaN
    EXPECT_EQ(std::isnan(out[i]), row_1_2) << "element " << i;
  }
  opts.scale = 1e37;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "opts.scale=1e+37 with max|q|=3");
  opts.scale = 0.5;
  opts.check_finite = true;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "q[0, 1, 2, 3]=nan, expected finite values (check_finite)");
  Kokkos::deep_copy(q, 3.0f);
  Kokkos::deep_copy(Kokkos::subview(k, 0, 0, 4, 0), -std::numeric_limits<float>::infinity());
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "k[0, 0, 4, 0]=-inf, expected finite values (check_finite)");
}

TEST(FusedAttentionErrors, BadInputIsAKdnnError) {
  DeviceView<double****> q("q", 1, 2, 3, 4), k("k", 1, 2, 5, 4), v("v", 1, 2, 5, 6),
      o("o", 1, 2, 3, 6);
  DeviceView<double***> lse("lse", 1, 2, 3);
  DeviceView<double****> k_bad("k", 1, 2, 5, 3), o_bad("o", 1, 2, 3, 5);
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k_bad, v, o, lse),
                    "k has extent(3)=3, expected 4 (D, q's extent(3))");
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o_bad, lse),
                    "o has extent(3)=5, expected 6 (Dv, v's extent(3))");
  // Key/value heads: a divisor of q's heads, the same for k and v.
  DeviceView<double****> q3("q", 1, 3, 3, 4), o3("o", 1, 3, 3, 6), v1("v", 1, 1, 5, 6);
  DeviceView<double***> lse3("lse", 1, 3, 3);
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q3, k, v, o3, lse3),
                    "k has extent(1)=2, expected a number of key/value heads that divides H=3");
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v1, o, lse),
                    "v has extent(1)=1, expected 2 (Hkv, k's extent(1))");
  at::FusedAttentionOptions opts;
  opts.dropout.p = 1;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "opts.dropout.p=1, expected a value in [0, 1)");
  opts.dropout.p = 0;
  opts.softcap = -1;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "opts.softcap=-1, expected 0 (none) or a value > 0");
  opts.softcap = 1e-320;
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "whose inverse is finite in double");
  opts.softcap = 0;
  opts.backward = static_cast<at::FusedBackwardSchedule>(7);
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v, o, lse, opts),
                    "opts.backward=7, expected FusedBackwardSchedule::automatic");
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), q, k, v,
                                                DeviceView<double****>(q.data(), 1, 2, 3, 6), lse),
                    "output o overlaps input q");

  // A finite double that is +inf as a float: an error in float, fine in double.
  DeviceView<float****> qf("q", 1, 2, 3, 4), kf("k", 1, 2, 5, 4), vf("v", 1, 2, 5, 6),
      of("o", 1, 2, 3, 6), gf("g", 1, 2, 3, 6), dqf("dq", 1, 2, 3, 4), dkf("dk", 1, 2, 5, 4),
      dvf("dv", 1, 2, 5, 6);
  DeviceView<float***> lsef("lse", 1, 2, 3);
  opts = at::FusedAttentionOptions();
  opts.scale = 1e39;
  const char* message =
      "opts.scale=1e+39, expected a value finite in float (|opts.scale| <= 3.40282e+38)";
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), qf, kf, vf, of, lsef, opts), message);
  EXPECT_KDNN_ERROR(
      at::fused_attention_backward(Space(), qf, kf, vf, of, lsef, gf, dqf, dkf, dvf, opts),
      message);
  DeviceView<float****> sf("s", 1, 2, 3, 5), pf("p", 1, 2, 3, 5);
  EXPECT_KDNN_ERROR(at::softmax_forward(Space(), sf, pf, {at::SoftmaxMode::accurate, 1e39}),
                    "scale=1e+39, expected a value finite in float");
  at::fused_attention_forward(Space(), q, k, v, o, lse, opts);  // double: finite

  // The caller's δ workspace: [B, H, S], and not aliasing an input or output.
  opts = at::FusedAttentionOptions();
  DeviceView<float***> delta_bad("delta", 1, 2, 4), delta("delta", 1, 2, 3);
  EXPECT_KDNN_ERROR(at::fused_attention_backward(Space(), qf, kf, vf, of, lsef, gf, dqf, dkf, dvf,
                                                 delta_bad, opts),
                    "delta has extent(2)=4, expected 3 (same as lse)");
  const DeviceView<float***> delta_on_lse(lsef.data(), 1, 2, 3);
  EXPECT_KDNN_ERROR(at::fused_attention_backward(Space(), qf, kf, vf, of, lsef, gf, dqf, dkf, dvf,
                                                 delta_on_lse, opts),
                    "output delta overlaps input lse");
  const DeviceView<float***> delta_on_dq(dqf.data(), 1, 2, 3);
  EXPECT_KDNN_ERROR(at::fused_attention_backward(Space(), qf, kf, vf, of, lsef, gf, dqf, dkf, dvf,
                                                 delta_on_dq, opts),
                    "outputs dq and delta overlap");
  at::fused_attention_backward(Space(), qf, kf, vf, of, lsef, gf, dqf, dkf, dvf, delta, opts);

  // 2^32 heads of one query and one key: B·H·blocks overflows int (the
  // kernels' index type). Views over a few bytes: the sizes are refused
  // before anything is read.
  float tiny[8] = {};
  const std::size_t n = 65536;
  const kdnn::Tensor4<const float, Space> big(tiny, n, n, 1, 1);
  const kdnn::Tensor4<float, Space> big_o(tiny + 2, n, n, 1, 1);
  const kdnn::Tensor3<float, Space> big_lse(tiny + 4, n, n, 1);
  EXPECT_KDNN_ERROR(at::fused_attention_forward(Space(), big, big, big, big_o, big_lse),
                    "B=65536, H=65536, S=1, Sk=1, D=1, Dv=1 needs 4294967296 teams");
  const kdnn::Tensor3<const float, Space> big_lse_in(tiny + 6, n, n, 1);
  EXPECT_KDNN_ERROR(at::fused_attention_backward(Space(), big, big, big, big, big_lse_in, big,
                                                 big_o, big_o, big_o),
                    "expected at most 2^31 - 1 (B·H·blocks)");
}

}  // namespace
