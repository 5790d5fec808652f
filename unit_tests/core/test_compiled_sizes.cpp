// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The one run-time to compile-time size dispatch of the GPU forms: a listed
// size runs with its own constant, once; any other size runs nothing and
// says so (no fall-through to a largest size). Every family's list is
// checked here against the sizes its documentation promises.
#include <gtest/gtest.h>

#include <vector>

#include "kdnn/attention/impl/fused_attention_impl.hpp"
#include "kdnn/core/impl/compiled_sizes.hpp"
#include "kdnn/sinkhorn/impl/sinkhorn_impl.hpp"
#include "kdnn/ssm/impl/causal_conv1d_impl.hpp"
#include "kdnn/ssm/impl/ssd_gpu_chunks.hpp"

namespace {

using Sizes = kdnn::impl::CompiledSizes<2, 3, 8>;

/// The sizes for which List::dispatch runs, each with its own constant,
/// over d in [lo, hi].
template <class List>
std::vector<int> dispatched(int lo, int hi) {
  std::vector<int> ran;
  for (int d = lo; d <= hi; ++d) {
    int calls = 0, value = -1;
    const bool said = List::dispatch(d, [&](auto c) {
      ++calls;
      value = decltype(c)::value;
    });
    EXPECT_EQ(said, List::contains(d)) << d;
    EXPECT_EQ(calls, said ? 1 : 0) << d;
    if (said) {
      EXPECT_EQ(value, d);
      ran.push_back(d);
    }
  }
  return ran;
}

TEST(CompiledSizes, RunsTheListedSizesOnlyEachWithItsConstant) {
  static_assert(Sizes::contains(3) && !Sizes::contains(4), "contains is a constant expression");
  EXPECT_EQ(dispatched<Sizes>(-2, 10), (std::vector<int>{2, 3, 8}));
  EXPECT_EQ(dispatched<kdnn::impl::CompiledSizes<>>(-2, 10), std::vector<int>{});
}

// Each family's list, as its header documents it.
TEST(CompiledSizes, EachFamilysList) {
  namespace at = kdnn::attention::impl;
  EXPECT_EQ(dispatched<at::FlashHeadSizes>(0, 512), (std::vector<int>{32, 64, 128, 256}));
  EXPECT_EQ(dispatched<at::FlashBackwardHeadSizes<float>>(0, 512),
            (std::vector<int>{32, 64, 128, 256}));
  EXPECT_EQ(dispatched<at::FlashBackwardHeadSizes<double>>(0, 512),
            (std::vector<int>{32, 64, 128}));
  EXPECT_EQ(dispatched<kdnn::sinkhorn::impl::ThreadMatrixSizes>(0, 64),
            (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(dispatched<kdnn::sinkhorn::impl::LaneFormSizes>(0, 64), (std::vector<int>{8, 16, 32}));
  EXPECT_EQ(dispatched<kdnn::ssm::impl::SsdGpuSizes>(0, 512), (std::vector<int>{64, 128}));
  EXPECT_EQ(dispatched<kdnn::ssm::impl::RegisterWidths>(0, 16), (std::vector<int>{2, 3, 4}));
}

}  // namespace
