// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The fused attention's argument structs: the backward's optional
// workspaces (the rows' δ and grouped-query attention's per-head shares of
// dK and dV) are used when given, so that a call with all three allocates
// nothing and gives bitwise the gradients of a call without them; their
// shapes and overlaps are checked; the packed call honours its struct's
// mask.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocation_counter.hpp"
#include "expect_error.hpp"
#include "kdnn/attention/fused_attention.hpp"
#include "kdnn/attention/fused_attention_varlen.hpp"
#include "random.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;

template <class T>
class FusedAttentionArgs : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(FusedAttentionArgs, Scalars);

TYPED_TEST(FusedAttentionArgs, GroupedBackwardUsesTheCallersWorkspaces) {
  using T = TypeParam;
  const int B = 2, H = 4, Hkv = 2, S = 33, Sk = 47, D = 16, Dv = 8, group = H / Hkv;
  const auto q = to_device<T****>(normal(std::size_t(B) * H * S * D, 1), B, H, S, D);
  const auto k = to_device<T****>(normal(std::size_t(B) * Hkv * Sk * D, 2), B, Hkv, Sk, D);
  const auto v = to_device<T****>(normal(std::size_t(B) * Hkv * Sk * Dv, 3), B, Hkv, Sk, Dv);
  const auto g = to_device<T****>(normal(std::size_t(B) * H * S * Dv, 4), B, H, S, Dv);
  DeviceView<T****> o("o", B, H, S, Dv);
  DeviceView<T***> lse("lse", B, H, S);
  at::AttentionMask<Space> mask;
  mask.causal = true;
  at::FusedAttentionOptions opts;
  opts.scale = 0.25;
  opts.dropout = {0.1, 7, 3};
  at::fused_attention_forward(Space(), at::FusedAttentionForward<T, Space>{q, k, v, o, lse, mask},
                              opts);

  DeviceView<T****> dq("dq", B, H, S, D), dk("dk", B, Hkv, Sk, D), dv("dv", B, Hkv, Sk, Dv);
  at::fused_attention_backward(
      Space(), at::FusedAttentionBackward<T, Space>{q, k, v, o, lse, g, dq, dk, dv, mask}, opts);

  DeviceView<T****> dq2("dq2", B, H, S, D), dk2("dk2", B, Hkv, Sk, D), dv2("dv2", B, Hkv, Sk, Dv);
  DeviceView<T***> delta("delta", B, H, S);
  DeviceView<T****> dk_shares("dk_shares", B, H, Sk, D), dv_shares("dv_shares", B, H, Sk, Dv);
  const at::FusedAttentionBackward<T, Space> with_workspaces{
      q, k, v, o, lse, g, dq2, dk2, dv2, mask, {}, {}, delta, dk_shares, dv_shares};
  at::fused_attention_backward(Space(), with_workspaces, opts);  // warm-up: scratch pools
  Space().fence();
  {
    AllocationCounter counter;
    at::fused_attention_backward(Space(), with_workspaces, opts);
    Space().fence();
    EXPECT_EQ(AllocationCounter::peak, 0) << "allocations " << AllocationCounter::labels;
  }
  EXPECT_EQ(to_host(dq2), to_host(dq));
  EXPECT_EQ(to_host(dk2), to_host(dk));
  EXPECT_EQ(to_host(dv2), to_host(dv));

  // The workspaces hold what they are for: δ the rows' dO·O, the shares
  // what each key/value head's gradient sums in head order.
  const auto ho = to_host(o), hg = to_host(g), hdelta = to_host(delta);
  const auto hdk = to_host(dk), hshares = to_host(dk_shares);
  const auto at4 = [](int i0, int n1, int i1, int n2, int i2, int n3, int i3) {
    return ((std::size_t(i0) * n1 + i1) * n2 + i2) * n3 + i3;
  };
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < S; ++i) {
        double dot = 0;
        for (int d = 0; d < Dv; ++d)
          dot += hg[at4(b, H, h, S, i, Dv, d)] * ho[at4(b, H, h, S, i, Dv, d)];
        EXPECT_NEAR(hdelta[(std::size_t(b) * H + h) * S + i], dot, 1e-5 * (1 + std::abs(dot)))
            << b << " " << h << " " << i;
      }
    }
    for (int kv = 0; kv < Hkv; ++kv) {
      for (int j = 0; j < Sk; ++j) {
        for (int d = 0; d < D; ++d) {
          T sum = T(hshares[at4(b, H, kv * group, Sk, j, D, d)]);
          for (int r = 1; r < group; ++r) sum += T(hshares[at4(b, H, kv * group + r, Sk, j, D, d)]);
          ASSERT_EQ(hdk[at4(b, Hkv, kv, Sk, j, D, d)], double(sum)) << b << " " << kv << " " << j;
        }
      }
    }
  }
}

TEST(FusedAttentionArgsErrors, WorkspacesAreCheckedAndThePackedMaskIsHonoured) {
  DeviceView<float****> q("q", 1, 4, 3, 8), k("k", 1, 2, 5, 8), v("v", 1, 2, 5, 8),
      o("o", 1, 4, 3, 8), g("g", 1, 4, 3, 8), dq("dq", 1, 4, 3, 8), dk("dk", 1, 2, 5, 8),
      dv("dv", 1, 2, 5, 8);
  DeviceView<float***> lse("lse", 1, 4, 3);
  at::fused_attention_forward(Space(), at::FusedAttentionForward<float, Space>{q, k, v, o, lse});
  at::FusedAttentionBackward<float, Space> args{q, k, v, o, lse, g, dq, dk, dv};
  args.dk_shares = DeviceView<float****>("dk_shares", 1, 2, 5, 8);
  EXPECT_KDNN_ERROR(at::fused_attention_backward(Space(), args),
                    "dk_shares has extent(1)=2, expected 4 (H, q's extent(1))");
  args.dk_shares = DeviceView<float****>("dk_shares", 1, 4, 5, 8);
  args.dv_shares = DeviceView<float****>(dq.data(), 1, 4, 5, 8);  // over dq's memory
  EXPECT_KDNN_ERROR(at::fused_attention_backward(Space(), args),
                    "outputs dq and dv_shares overlap");
  args.dv_shares = DeviceView<float****>("dv_shares", 1, 4, 5, 8);
  at::fused_attention_backward(Space(), args);

  // A packed call takes its sequences' lengths from the packing: a mask in
  // its struct with per-entry lengths is refused.
  DeviceView<float***> pq("q", 3, 2, 4), pk("k", 5, 2, 4), pv("v", 5, 2, 4), po("o", 3, 2, 4);
  DeviceView<float**> plse("lse", 2, 3);
  const auto offsets_q = to_device<int*>(std::vector<double>{0, 1, 3}, 3);
  const auto offsets_k = to_device<int*>(std::vector<double>{0, 2, 5}, 3);
  at::FusedAttentionVarlenForward<float, Space> packed{pq, pk,   pv,
                                                       po, plse, {offsets_q, offsets_k}};
  at::fused_attention_varlen_forward(Space(), packed);
  packed.mask.seq_q = to_device<int*>(std::vector<double>{1, 2}, 2);
  EXPECT_KDNN_ERROR(at::fused_attention_varlen_forward(Space(), packed),
                    "mask.seq_q has extent(0)=2, expected none");
}

}  // namespace
