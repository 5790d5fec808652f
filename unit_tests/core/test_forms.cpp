// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The table of forms (core/impl/forms.hpp): a size list admits its own
// tuples (exact) or the first that covers a call (round_up), a grid holds
// every pair or only its corners, and a table runs the form chosen_form
// picks, at the admitted tuple, with that form's kernels; the fused
// attention's tables hold what their kernels' headers list.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kdnn/attention/impl/fused_attention_impl.hpp"
#include "kdnn/core/impl/forms.hpp"

namespace {

namespace ki = kdnn::impl;
using kdnn::KernelForm;
using Pair = std::pair<int, int>;

/// The tuples of List, in order.
template <class... Tuples>
std::vector<Pair> pairs_of(ki::SizeList<Tuples...>) {
  return {Pair{Tuples::values[0], Tuples::values[1]}...};
}

/// The tuple List admits for (a, b) under match, or (0, 0).
template <class List>
Pair admitted(int a, int b, ki::SizeMatch match) {
  Pair got{0, 0};
  int calls = 0;
  const bool said = List::dispatch(std::array<int, 2>{a, b}, match, [&](auto tuple) {
    ++calls;
    got = {decltype(tuple)::values[0], decltype(tuple)::values[1]};
  });
  EXPECT_EQ(said, calls == 1) << a << ", " << b;
  EXPECT_LE(calls, 1);
  EXPECT_EQ(said, List::admits(std::array<int, 2>{a, b}, match));
  return got;
}

using Axis = ki::CompiledSizes<16, 32, 64>;
using Grid = ki::detail::Grid<Axis, ki::CompiledSizes<8, 128>>;

TEST(Forms, AGridHoldsEveryPairInOrderOrOnlyItsCorners) {
  EXPECT_EQ(pairs_of(Grid::all{}),
            (std::vector<Pair>{{16, 8}, {16, 128}, {32, 8}, {32, 128}, {64, 8}, {64, 128}}));
  EXPECT_EQ(pairs_of(Grid::corners{}), (std::vector<Pair>{{16, 128}, {64, 8}}));
  // The build's choice (config.hpp).
  using Built = ki::SizeGrid<Axis, ki::CompiledSizes<8, 128>>;
  EXPECT_EQ(pairs_of(Built{}),
            KDNN_COMPILED_SIZE_CORNERS ? pairs_of(Grid::corners{}) : pairs_of(Grid::all{}));
  EXPECT_EQ(Grid::all::largest(0), 64);
  EXPECT_EQ(Grid::all::largest(1), 128);
  EXPECT_EQ(ki::SizeList<>::largest(0), 0);
}

TEST(Forms, ExactAdmitsOnlyListedTuplesRoundUpTheFirstThatCovers) {
  using All = Grid::all;
  using Corners = Grid::corners;
  const auto exact = ki::SizeMatch::exact, up = ki::SizeMatch::round_up;
  EXPECT_EQ(admitted<All>(32, 128, exact), (Pair{32, 128}));
  EXPECT_EQ(admitted<All>(33, 128, exact), (Pair{0, 0}));
  EXPECT_EQ(admitted<All>(20, 8, up), (Pair{32, 8}));
  EXPECT_EQ(admitted<All>(20, 9, up), (Pair{32, 128}));
  EXPECT_EQ(admitted<All>(1, 1, up), (Pair{16, 8}));
  EXPECT_EQ(admitted<All>(64, 128, up), (Pair{64, 128}));
  EXPECT_EQ(admitted<All>(65, 8, up), (Pair{0, 0}));  // beyond every tuple
  EXPECT_EQ(admitted<All>(0, 8, up), (Pair{0, 0}));   // no columns to mask
  EXPECT_EQ(admitted<Corners>(20, 8, up), (Pair{64, 8}));
  EXPECT_EQ(admitted<Corners>(16, 100, up), (Pair{16, 128}));
  EXPECT_EQ(admitted<Corners>(20, 100, up), (Pair{0, 0}));
  EXPECT_EQ(admitted<Corners>(32, 8, exact), (Pair{0, 0}));
}

/// A fake form's kernels: records which tuple and precision were visited.
template <int Tag>
struct FakeKernel {
  static constexpr int tag = Tag;
};
template <int Tag>
struct FakeKernels {
  template <class S, class F>
  static void visit(const kdnn::Launch& launch, const F& f) {
    // Two kernels, as a backward's; the second's tag says the precision.
    using First = ki::KernelType<FakeKernel<Tag * 1000 + S::values[0] * 10 + S::values[1]>>;
    if (launch.allow_tf32) {
      f(First{}, ki::KernelType<FakeKernel<1>>{});
    } else {
      f(First{}, ki::KernelType<FakeKernel<0>>{});
    }
  }
};

using Table =
    ki::Forms<ki::Form<KernelForm::tensor_cores, ki::SizeList<ki::Sizes<1, 1>, ki::Sizes<2, 2>>,
                       ki::SizeMatch::exact, FakeKernels<1>>,
              ki::Form<KernelForm::gpu, ki::SizeList<ki::Sizes<2, 2>, ki::Sizes<4, 4>>,
                       ki::SizeMatch::round_up, FakeKernels<2>>>;

TEST(Forms, ATableRunsTheChosenFormAtItsAdmittedTuple) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  const auto run = [](KernelForm asked, int a, int b, bool tf32 = false) {
    kdnn::Launch launch;
    launch.form = asked;
    launch.allow_tf32 = tf32;
    std::string got = "none";
    const bool said = Table::visit(
        Host(), launch, std::array<int, 2>{a, b}, [&](auto first, auto second, const char* form) {
          got = std::string(form) + " " + std::to_string(decltype(first)::type::tag) + "/" +
                std::to_string(decltype(second)::type::tag);
        });
    EXPECT_EQ(said, got != "none");
    EXPECT_EQ(Table::chosen(Host(), asked, std::array<int, 2>{a, b}) != KernelForm::host, said);
    return got;
  };
  EXPECT_EQ(run(KernelForm::tensor_cores, 2, 2), "tensor cores 1022/0");
  EXPECT_EQ(run(KernelForm::tensor_cores, 1, 1, true), "tensor cores 1011/1");
  // No tensor-core tuple: the GPU form, rounded up.
  EXPECT_EQ(run(KernelForm::tensor_cores, 3, 1), "gpu 2044/0");
  EXPECT_EQ(run(KernelForm::gpu, 1, 1), "gpu 2022/0");
  EXPECT_EQ(run(KernelForm::gpu, 5, 1), "none");
  // On a host, automatic and host run the host form.
  EXPECT_EQ(run(KernelForm::automatic, 2, 2), "none");
  EXPECT_EQ(run(KernelForm::host, 2, 2), "none");
  int kernels = 0;
  Table::for_each(kdnn::Launch{}, [&](auto, auto) { ++kernels; });
  EXPECT_EQ(kernels, 4);
  EXPECT_EQ(Table::largest(0), 4);
  EXPECT_EQ(Table::largest(1), 4);
  EXPECT_EQ(ki::Forms<>::largest(0), 0);
}

// The fused attention's tables: the head-size pairs of the lists its
// kernels' headers give (test_compiled_sizes.cpp), every pair or the
// corners.
TEST(Forms, TheFusedAttentionsTablesHoldTheirKernelsHeadSizes) {
  namespace at = kdnn::attention::impl;
  const std::size_t flash = KDNN_COMPILED_SIZE_CORNERS ? 2 : 16;
  const std::size_t mma = KDNN_COMPILED_SIZE_CORNERS ? 2 : 9;
  EXPECT_EQ(at::FlashHeadPairs::count, flash);
  EXPECT_EQ(at::FlashBackwardHeadPairs<float>::count, flash);
  EXPECT_EQ(at::FlashBackwardHeadPairs<double>::count, mma);
  EXPECT_EQ(at::MmaHeadPairs::count, mma);
  EXPECT_EQ(at::FlashHeadPairs::largest(0), 256);
  EXPECT_EQ(at::MmaHeadPairs::largest(1), 128);
  // Past the GPU forms' largest D and Dv only the host form runs; in
  // double the backward's GPU form stops at 128, the forward's does not.
  using Host = Kokkos::DefaultHostExecutionSpace;
  EXPECT_EQ((at::FusedBackwardForms<Host, double>::largest(0)), 128);
  EXPECT_EQ((at::largest_gpu_head_size<Host, double>(0)), 256);
  EXPECT_EQ((at::largest_gpu_head_size<Host, float>(1)), 256);
}

}  // namespace
