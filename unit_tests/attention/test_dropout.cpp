// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Dropout: the mask equals one computed on the host from Philox directly (so
// it is the same on every backend), is reproducible and keyed by seed and
// offset, keeps 1 − p of the elements within 4σ, scales by 1/(1 − p), and
// the backward applies the same mask.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "expect_error.hpp"
#include "kdnn/attention/dropout.hpp"
#include "kdnn/core/impl/philox.hpp"
#include "views.hpp"

namespace {

using namespace kdnn_test;
namespace at = kdnn::attention;

/// keep(k) as documented in dropout.hpp, on the host.
bool host_keep(std::size_t k, const at::DropoutOptions& o) {
  const std::uint64_t g = k / 4;
  const auto w =
      kdnn::impl::philox4x32_10({{std::uint32_t(g), std::uint32_t(g >> 32), std::uint32_t(o.offset),
                                  std::uint32_t(o.offset >> 32)}},
                                std::uint32_t(o.seed), std::uint32_t(o.seed >> 32));
  return w.v[k % 4] >= std::uint32_t(std::nearbyint(o.p * 4294967296.0));
}

TEST(Dropout, MaskIsPhiloxOfSeedOffsetAndIndex) {
  const int B = 2, H = 3, S = 7, Sk = 9;  // 378 elements: not a multiple of 4
  const auto x = normal(std::size_t(B) * H * S * Sk, 1);
  at::DropoutOptions o{0.3, 0x1234567890abcdefull, 77};
  DeviceView<double****> y("y", B, H, S, Sk);
  at::dropout_forward(Space(), to_device<double****>(x, B, H, S, Sk), y, o);
  const auto got = to_host(y);
  for (std::size_t k = 0; k < x.size(); ++k) {
    const double expected = host_keep(k, o) ? x[k] * (1.0 / (1.0 - o.p)) : 0.0;
    ASSERT_EQ(got[k], expected) << "element " << k;
  }
}

TEST(Dropout, SameKeySameMaskOtherKeyOtherMask) {
  const std::vector<double> ones(4096, 1.0);
  auto mask = [&](at::DropoutOptions o) {
    DeviceView<float****> y("y", 1, 1, 64, 64);
    at::dropout_forward(Space(), to_device<float****>(ones, 1, 1, 64, 64), y, o);
    return to_host(y);
  };
  const at::DropoutOptions a{0.5, 1, 0}, other_seed{0.5, 2, 0}, other_offset{0.5, 1, 1};
  EXPECT_EQ(mask(a), mask(a));
  EXPECT_NE(mask(a), mask(other_seed));
  EXPECT_NE(mask(a), mask(other_offset));
}

TEST(Dropout, KeepRateWithinFourSigmaAndScaleIsExactInExpectation) {
  const std::size_t n = 1 << 18;
  for (double p : {0.1, 0.5, 0.9}) {
    DeviceView<double****> y("y", 1, 1, 512, 512);
    at::dropout_forward(Space(), to_device<double****>(std::vector<double>(n, 1.0), 1, 1, 512, 512),
                        y, {p, 42, 0});
    const auto v = to_host(y);
    std::size_t kept = 0;
    for (double e : v) {
      if (e != 0) {
        ++kept;
        ASSERT_EQ(e, 1.0 / (1.0 - p));
      }
    }
    const double sigma = std::sqrt(n * p * (1 - p));
    EXPECT_LT(std::abs(double(kept) - n * (1 - p)), 4 * sigma) << "p=" << p;
  }
}

TEST(Dropout, ZeroProbabilityIsTheIdentity) {
  const auto x = normal(60, 3);
  DeviceView<float****> y("y", 1, 3, 4, 5);
  const auto X = to_device<float****>(x, 1, 3, 4, 5);
  at::dropout_forward(Space(), X, y, {0.0, 9, 9});
  EXPECT_EQ(to_host(y), to_host(X));
}

TEST(Dropout, BackwardAppliesTheForwardMask) {
  const auto x = normal(300, 4), g = normal(300, 5);
  const at::DropoutOptions o{0.25, 7, 3};
  DeviceView<double****> y("y", 1, 2, 10, 15), dx("dx", 1, 2, 10, 15);
  at::dropout_forward(Space(), to_device<double****>(x, 1, 2, 10, 15), y, o);
  at::dropout_backward(Space(), to_device<double****>(g, 1, 2, 10, 15), dx, o);
  const auto yh = to_host(y), dxh = to_host(dx);
  for (std::size_t k = 0; k < x.size(); ++k) {
    // y is linear in x, dy/dx_k = keep/(1 − p): dx_k = g_k·y_k/x_k.
    EXPECT_DOUBLE_EQ(dxh[k], yh[k] == 0 ? 0.0 : g[k] / (1 - o.p)) << k;
  }
}

TEST(Dropout, BadInputIsAnError) {
  DeviceView<float****> x("x", 1, 2, 3, 4), y("y", 1, 2, 3, 4), z("z", 1, 2, 3, 5);
  EXPECT_KDNN_ERROR(at::dropout_forward(Space(), x, y, {1.0, 0, 0}),
                    "attention::dropout_forward: p=1, expected a value in [0, 1)");
  EXPECT_KDNN_ERROR(at::dropout_forward(Space(), x, y, {-0.1, 0, 0}), "p=-0.1");
  EXPECT_KDNN_ERROR(at::dropout_forward(Space(), x, y, {NAN, 0, 0}), "p=nan");
  EXPECT_KDNN_ERROR(at::dropout_backward(Space(), x, z, {0.5, 0, 0}),
                    "attention::dropout_backward: dx has extent(3)=5, expected 4 (same as dy)");
  EXPECT_KDNN_ERROR(at::dropout_forward(Space(), y, y, {0.5, 0, 0}), "output y overlaps input x");
}

}  // namespace
