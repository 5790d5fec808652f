// Launch planning: scratch level choice and its limit, vector length and team
// size checks, for both kernel shapes.
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
  const kdnn::Launch any;
  auto small = kdnn::impl::plan_team<Space, NoOp>("op", Space(), 3, any, 1, 64, "block=1");
  EXPECT_EQ(small.level, 0);
  EXPECT_EQ(small.league, 3);
  EXPECT_GE(small.team_size, 1);
  if (max1 > max0) {
    auto large = kdnn::impl::plan_team<Space, NoOp>("op", Space(), 1, any, 1, max0 + 1, "block=2");
    EXPECT_EQ(large.level, 1);
  }
  EXPECT_KDNN_ERROR(
      (kdnn::impl::plan_team<Space, NoOp>("op", Space(), 1, any, 1, max1 + 1, "block=3")),
      "op: block=3 needs " + std::to_string(max1 + 1) + " bytes of team scratch, above the " +
          std::to_string(max1) + "-byte limit");
}

// Level-1 scratch is allocated for every team that can run at once. On an
// H100 under Kokkos 3.4 (132 SMs × 2048 threads) a fused-attention probe
// asked Kokkos for a 66 GB pool (8 MB per one-warp team), which failed inside
// cudaMalloc; a pool larger than the device's memory (80 GB) is now a
// kdnn::Error. Sinkhorn's unrolled backward at n = 4 takes pools of 4.4 and
// 43 GB there in the tests (64960 and 640960 bytes per 4-thread team), which
// ran, and must still run.
TEST(TeamPlan, LevelOneScratchPoolIsLimited) {
  const long long h100 = 132LL * 2048;
  const std::size_t h100_memory = 85017493504;  // cudaMemGetInfo total (twice the 42508746752 seen)
  kdnn::impl::TeamPlan<Space> plan;
  plan.level = 1, plan.team_size = 1, plan.vector_length = 32;
  EXPECT_EQ(kdnn::impl::scratch_pool_bytes(1000, h100, 32), 1000.0 * 8448);
  plan.scratch_bytes = std::size_t(16) << 20;
  EXPECT_KDNN_ERROR(kdnn::impl::check_scratch_pool("op", plan, h100, h100_memory, "blocks of 4"),
                    "op: blocks of 4 needs 16777216 bytes of team scratch (level 1) for each of "
                    "8448 teams of 32 threads that run at once");
  kdnn::impl::check_scratch_pool("op", plan, h100, 0, "blocks of 4");  // no limit (a host)
  plan.level = 0;  // on-chip scratch takes no pool
  kdnn::impl::check_scratch_pool("op", plan, h100, h100_memory, "blocks of 4");
  kdnn::impl::TeamPlan<Space> sinkhorn;
  sinkhorn.level = 1, sinkhorn.team_size = 1, sinkhorn.vector_length = 4;
  sinkhorn.scratch_bytes = 64960;
  EXPECT_EQ(kdnn::impl::scratch_pool_bytes(64960, h100, 4), 64960.0 * 67584);
  kdnn::impl::check_scratch_pool("op", sinkhorn, h100, h100_memory, "n=4");
  sinkhorn.scratch_bytes = 640960;
  kdnn::impl::check_scratch_pool("op", sinkhorn, h100, h100_memory, "n=4");
  // A host: one team per thread.
  EXPECT_EQ(kdnn::impl::scratch_pool_bytes(1000, 2, 1), 2000.0);
  EXPECT_EQ(kdnn::impl::scratch_pool_bytes(1000, 1, 4), 1000.0);
}

kdnn::Launch with_team_and_vector(int team_size, int vector_length) {
  kdnn::Launch l;
  l.team_size = team_size;
  l.vector_length = vector_length;
  return l;
}

TEST(TeamPlan, CooperativeChecksVectorLengthAndTeamSize) {
  const kdnn::Launch any;
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
  EXPECT_KDNN_ERROR(
      (kdnn::impl::plan_system_tiles<Space, NoOp>(
          "op", Space(), 1, 4, request,
          [](int tile) { return tile * (kdnn::impl::scratch_capacity<Space>(1) + 1); }, "n=4",
          "matrix")),
      "op: n=4 needs");
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
