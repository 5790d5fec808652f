// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Launch planning: scratch level choice and its limit, vector length and team
// size checks, for both kernel forms.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>

#include "expect_error.hpp"
#include "kdnn/core/impl/team_plan.hpp"
#include "views.hpp"

namespace {

using kdnn_test::Space;
using Member = Kokkos::TeamPolicy<Space>::member_type;

struct NoOp {
  KOKKOS_INLINE_FUNCTION void operator()(const Member&) const {}
};

TEST(TeamPlan, CooperativeChoosesScratchLevel) {
  const std::size_t max0 = kdnn::impl::scratch_capacity<Space>(0);
  const std::size_t max1 = kdnn::impl::scratch_capacity<Space>(1);
  const kdnn::Launch any{};
  auto small = kdnn::impl::plan_team<Space, NoOp>("op", Space(), 3, any, 1, 64, "block=1");
  EXPECT_EQ(small.level, 0);
  EXPECT_EQ(small.league, 3);
  EXPECT_GE(small.team_size, 1);
  if (max1 > max0) {
    auto large = kdnn::impl::plan_team<Space, NoOp>("op", Space(), 1, any, 1, max0 + 1, "block=2");
    EXPECT_EQ(large.level, 1);
  }
  // The limit: level 1's on a host launch, the team workspace's budget on a
  // GPU launch (every launch on a GPU backend, a GPU form on a host).
  for (const auto form : {kdnn::KernelForm::automatic, kdnn::KernelForm::gpu}) {
    kdnn::Launch request;
    request.form = form;
    const char* what = nullptr;
    const std::size_t limit =
        kdnn::impl::scratch_limit<Space>(kdnn::impl::is_gpu_launch<Space>(request), what);
    EXPECT_EQ(limit,
              kdnn::impl::is_gpu_launch<Space>(request) ? kdnn::impl::kTeamWorkspaceBudget : max1);
    EXPECT_KDNN_ERROR(
        (kdnn::impl::plan_team<Space, NoOp>("op", Space(), 1, request, 1, limit + 1, "block=3")),
        "op: block=3 needs " + std::to_string(limit + 1) + " bytes of team scratch, above the " +
            std::to_string(limit) + what);
  }
}

// Level-1 scratch is allocated for every team that can run at once. On an
// H100 under Kokkos 3.4 (132 SMs × 2048 threads) a fused-attention probe
// asked Kokkos for a 66 GB pool (8 MB per one-warp team) and Sinkhorn's
// unrolled backward at n = 4 for 4.4 and 43 GB (64960 and 640960 bytes per
// 4-thread team). A GPU launch takes a team workspace instead, bounded by
// kTeamWorkspaceBudget (256 MiB).
TEST(TeamPlan, WorkspaceSlotsAreBounded) {
  using kdnn::impl::workspace_slots;
  const long long h100 = 132LL * 2048;
  const std::size_t budget = kdnn::impl::kTeamWorkspaceBudget;
  EXPECT_EQ(budget, std::size_t(256) << 20);
  EXPECT_EQ(workspace_slots(1 << 20, std::size_t(8) << 20, 32, h100), 32);  // 256 MiB
  EXPECT_EQ(workspace_slots(1 << 20, 64960, 4, h100), int(budget / 64960));
  EXPECT_EQ(workspace_slots(1 << 20, 640960, 4, h100), int(budget / 640960));
  EXPECT_EQ(workspace_slots(1 << 20, 1024, 32, h100), 8448);  // what can run at once
  EXPECT_EQ(workspace_slots(5, 1024, 32, h100), 5);           // no more than the items
  EXPECT_EQ(workspace_slots(0, 1024, 32, h100), 1);
  EXPECT_EQ(workspace_slots(100, budget, 32, h100), 1);  // one team fills the budget
  EXPECT_EQ(workspace_slots(100, 1024, 1, 2), 2);        // two host threads
  EXPECT_EQ(workspace_slots(INT_MAX, 16, 1, 1LL << 40, std::size_t(1) << 40), INT_MAX);
  EXPECT_EQ(workspace_slots(INT_MAX, 16, 1, 1LL << 40), int(budget / 16));
}

kdnn::Launch gpu_launch() {
  kdnn::Launch l;
  l.form = kdnn::KernelForm::gpu;
  return l;
}

// Past level 0, a GPU launch (here forced on this backend) takes a team
// workspace: a league of `slots` teams, no Kokkos scratch, the budget as
// the limit; a host launch takes level 1 with Kokkos' limit.
TEST(TeamPlan, GpuLaunchTakesAWorkspacePastLevelZero) {
  const std::size_t max0 = kdnn::impl::scratch_capacity<Space>(0);
  const std::size_t budget = kdnn::impl::kTeamWorkspaceBudget;
  auto small = kdnn::impl::plan_team<Space, NoOp>("op", Space(), 7, gpu_launch(), 1, 64, "x");
  EXPECT_EQ(small.level, 0);
  EXPECT_EQ(small.slots, 0);
  auto large =
      kdnn::impl::plan_team<Space, NoOp>("op", Space(), 1000, gpu_launch(), 1, max0 + 1, "x");
  EXPECT_EQ(large.level, 1);
  EXPECT_EQ(large.league, 1000);
  EXPECT_EQ(large.slots, kdnn::impl::workspace_slots(1000, large.slot_stride(),
                                                     large.team_size * large.vector_length,
                                                     Space().concurrency()));
  EXPECT_EQ(large.policy(Space()).league_size(), large.slots);
  EXPECT_EQ(large.policy(Space()).scratch_size(1), 0u);
  EXPECT_EQ(large.slot_stride() % kdnn::impl::kScratchAlign, 0u);
  EXPECT_KDNN_ERROR((kdnn::impl::plan_team<Space, NoOp>("op", Space(), 1, gpu_launch(), 1,
                                                        budget + 1, "blocks of 9")),
                    "op: blocks of 9 needs " + std::to_string(budget + 1) +
                        " bytes of team scratch, above the " + std::to_string(budget) +
                        "-byte budget of a GPU launch's team workspace");
  EXPECT_KDNN_ERROR((kdnn::impl::plan_system_tiles<Space, NoOp>(
                        "op", Space(), 4, 4, gpu_launch(),
                        [&](int tile) { return tile * (budget + 16); }, "n=4", "matrix")),
                    "op: n=4 needs " + std::to_string(budget + 16) +
                        " bytes of team scratch per matrix, above the " + std::to_string(budget) +
                        "-byte budget");
  if (kdnn::impl::BackendTraits<Space>::is_host) {
    auto host =
        kdnn::impl::plan_team<Space, NoOp>("op", Space(), 1000, kdnn::Launch{}, 1, max0 + 1, "x");
    EXPECT_EQ(host.level, 1);
    EXPECT_EQ(host.slots, 0);
    EXPECT_EQ(host.policy(Space()).league_size(), 1000);
  }
}

/// Each work item fills its team's scratch with its number, then (after a
/// barrier) checks it and counts itself: out(item) ends at 1 if every item
/// ran exactly once with scratch no other running team wrote.
struct FillScratch {
  kdnn_test::DeviceView<int*> out;
  int words = 0;
  kdnn::impl::TeamWork work;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    work.for_each(team, [&](int item, void* scratch) {
      int* s = static_cast<int*>(scratch);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, words), [&](int i) { s[i] = item; });
      team.team_barrier();
      int wrong = 0;
      Kokkos::parallel_reduce(
          Kokkos::TeamThreadRange(team, words), [&](int i, int& w) { w += s[i] != item; }, wrong);
      Kokkos::single(Kokkos::PerTeam(team), [&]() { out(item) += 1 + 1000 * wrong; });
    });
  }
};

TEST(TeamPlan, StridedItemsEachRunOnceInTheirOwnScratch) {
  const std::size_t max0 = kdnn::impl::scratch_capacity<Space>(0);
  for (const bool gpu : {false, true}) {
    SCOPED_TRACE(gpu ? "GPU launch" : "backend's default");
    const int items = 1001;
    FillScratch kernel;
    kernel.out = kdnn_test::DeviceView<int*>("out", items);
    kernel.words = int(max0 / sizeof(int)) + 5;  // past level 0
    const auto plan = kdnn::impl::plan_team<Space, FillScratch>("op", Space(), items,
                                                                gpu ? gpu_launch() : kdnn::Launch{},
                                                                1, kernel.words * sizeof(int), "x");
    EXPECT_EQ(plan.slots > 0, gpu || !kdnn::impl::BackendTraits<Space>::is_host);
    plan.launch("TeamPlan::strided", Space(), kernel);
    const auto out = kdnn_test::to_host(kernel.out);
    for (int i = 0; i < items; ++i) ASSERT_EQ(out[i], 1) << "item " << i;
  }
}

/// Each item waits until every lower item has finished, then finishes:
/// the strictest chain a kernel whose items wait on lower ones can build.
/// Without claims in order, a team could wait on an item that no running
/// team holds (a host thread's later chunk, a GPU block started early).
struct Chain {
  kdnn_test::DeviceView<int*> order;  ///< the place each item finished in
  kdnn_test::DeviceView<int> done;
  kdnn::impl::TeamWork work;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    work.for_each(team, [&](int item, void*) {
      Kokkos::single(Kokkos::PerTeam(team), [&]() {
        while (Kokkos::atomic_fetch_add(&done(), 0) < item) {
        }
        order(item) = Kokkos::atomic_fetch_add(&done(), 1);
      });
    });
  }
};

TEST(TeamPlan, ItemsClaimedInOrderMayWaitOnLowerOnes) {
  for (const bool gpu : {false, true}) {
    SCOPED_TRACE(gpu ? "GPU launch" : "backend's default");
    const int items = 1001;
    Chain kernel;
    kernel.order = kdnn_test::DeviceView<int*>("order", items);
    kernel.done = kdnn_test::DeviceView<int>("done");
    const kdnn_test::DeviceView<int> claims("claims");
    const auto plan = kdnn::impl::plan_team<Space, Chain>(
        "op", Space(), items, gpu ? gpu_launch() : kdnn::Launch{}, 1, 64, "x");
    plan.launch("TeamPlan::chain", Space(), kernel, claims.data());
    const auto order = kdnn_test::to_host(kernel.order);
    for (int i = 0; i < items; ++i) ASSERT_EQ(order[i], i) << "item " << i;
  }
}

kdnn::Launch with_team_and_vector(int team_size, int vector_length) {
  kdnn::Launch l;
  l.team_size = team_size;
  l.vector_length = vector_length;
  return l;
}

TEST(TeamPlan, CooperativeChecksVectorLengthAndTeamSize) {
  const kdnn::Launch any{};
  EXPECT_KDNN_ERROR((kdnn::impl::plan_team<Space, NoOp>("op", Space(), 1, any, 3, 0, "x")),
                    "op: launch.vector_length=3, expected a power of two");
  EXPECT_KDNN_ERROR(
      (kdnn::impl::plan_team<Space, NoOp>("op", Space(), 1, with_team_and_vector(0, 3), 1, 0, "x")),
      "op: launch.vector_length=3, expected a power of two");
  const int vmax = Kokkos::TeamPolicy<Space>::vector_length_max();
  EXPECT_KDNN_ERROR((kdnn::impl::plan_team<Space, NoOp>("op", Space(), 1, any, 2 * vmax, 0, "x")),
                    "expected at most " + std::to_string(vmax));
  EXPECT_KDNN_ERROR((kdnn::impl::plan_team<Space, NoOp>(
                        "op", Space(), 1, with_team_and_vector(1 << 20, 0), 1, 0, "x")),
                    "op: launch.team_size=1048576, expected at most");
  EXPECT_KDNN_ERROR((kdnn::impl::plan_team<Space, NoOp>("op", Space(), 1,
                                                        with_team_and_vector(-1, 0), 1, 0, "x")),
                    "op: launch.team_size=-1, expected >= 0");
  auto plan =
      kdnn::impl::plan_team<Space, NoOp>("op", Space(), 2, with_team_and_vector(1, 1), 1, 0, "x");
  EXPECT_EQ(plan.team_size, 1);
  EXPECT_EQ(plan.vector_length, 1);
  Kokkos::parallel_for("TeamPlan::run", plan.policy(Space()), NoOp{});
  Space().fence();
}

/// A register-tiled team of 64 threads (core/impl/register_team.hpp).
struct RegisterTeam {
  static constexpr int NT = 64;
  KOKKOS_INLINE_FUNCTION void operator()(const Member&) const {}
};

// A register-tiled team picks its own team size and vector length, and a
// request's are still checked as the other forms check them, so that a
// request is valid or not whichever form runs.
TEST(TeamPlan, RegisterTeamChecksTheRequestItDoesNotUse) {
  const auto plan_with = [](const kdnn::Launch& l) {
    return kdnn::impl::plan_register_team<Space, RegisterTeam>("op", Space(), 3, l, 0, "x");
  };
  EXPECT_KDNN_ERROR(plan_with(with_team_and_vector(0, 3)),
                    "op: launch.vector_length=3, expected a power of two");
  EXPECT_KDNN_ERROR(plan_with(with_team_and_vector(1 << 20, 0)),
                    "op: launch.team_size=1048576, expected at most");
  EXPECT_KDNN_ERROR(plan_with(with_team_and_vector(-1, 0)),
                    "op: launch.team_size=-1, expected >= 0");
  const auto plan = plan_with(with_team_and_vector(1, 1));
  EXPECT_EQ(plan.team_size, kdnn::impl::BackendTraits<Space>::is_gpu ? RegisterTeam::NT : 1);
  EXPECT_EQ(plan.vector_length, 1);
  EXPECT_EQ(plan.league, 3);
}

TEST(TeamPlan, SystemTilesDefaultsPerBackend) {
  kdnn::Launch request;
  auto plan = kdnn::impl::plan_system_tiles<Space, NoOp>(
      "op", Space(), 100, 16, request, [](int tile) { return tile * std::size_t(256); }, "n=16",
      "matrix");
  const int warp = kdnn::impl::BackendTraits<Space>::warp_width();
  if (kdnn::impl::BackendTraits<Space>::is_host) {
    EXPECT_EQ(warp, 1);
    EXPECT_EQ(plan.tile, 1);
    EXPECT_EQ(plan.vector_length, 1);
  } else {
    EXPECT_EQ(plan.vector_length, 16 < warp ? 16 : warp);
    EXPECT_EQ(plan.tile * plan.vector_length, warp);  // one warp per team
  }
  EXPECT_EQ(plan.league, (100 + plan.tile - 1) / plan.tile);
  EXPECT_EQ(plan.scratch_bytes, plan.tile * std::size_t(256));
  const char* what = nullptr;
  const std::size_t limit =
      kdnn::impl::scratch_limit<Space>(kdnn::impl::is_gpu_launch<Space>(request), what);
  EXPECT_KDNN_ERROR((kdnn::impl::plan_system_tiles<Space, NoOp>(
                        "op", Space(), 1, 4, request, [&](int tile) { return tile * (limit + 1); },
                        "n=4", "matrix")),
                    "op: n=4 needs " + std::to_string(limit + 1) +
                        " bytes of team scratch per matrix, above the " + std::to_string(limit) +
                        what);
}

TEST(TeamPlan, SystemTilesCoverBatchesNearTwoToThe31) {
  // ceil(batch / tile) without forming batch + tile − 1 (which overflows int).
  for (const int tile : {1, 3, 32}) {
    kdnn::Launch request;
    request.tile = tile;
    request.team_size = 1;
    const auto plan = kdnn::impl::plan_system_tiles<Space, NoOp>(
        "op", Space(), INT_MAX, 4, request, [](int t) { return t * std::size_t(64); }, "n=4",
        "matrix");
    EXPECT_EQ(plan.league, int((std::int64_t(INT_MAX) + tile - 1) / tile)) << tile;
  }
}

}  // namespace
