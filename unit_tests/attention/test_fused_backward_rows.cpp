// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The fused attention backward's row loads (FusedBackwardData::load_rows,
// attention/impl/fused_backward_data.hpp): a query tile's rows, and whether
// any of them sees a key of a key block, which decides whether the host
// kernel skips the pair of tiles. A causal tile wholly above the diagonal
// must say "none" (a reduction whose identity leaked into the answer once
// made every causal backward compute every pair: the same results, twice
// the work).
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>

#include "kdnn/attention/fused_attention.hpp"  // the public header first, as every user
#include "kdnn/attention/impl/fused_backward_data.hpp"

namespace {

using HostExec = Kokkos::DefaultHostExecutionSpace;
using Data = kdnn::attention::impl::FusedBackwardData<HostExec, float>;

/// `any` of load_rows for query rows [i0, i0 + rows) and keys [j_lo, j_hi)
/// of a causal mask over S queries and keys, with first/last checked.
int rows_see_keys(int S, int i0, int rows, int j_lo, int j_hi) {
  Kokkos::View<float***, HostExec> lse("lse", 1, 1, S), delta("delta", 1, 1, S);
  kdnn::attention::AttentionMask<HostExec> mask;
  mask.causal = true;
  Data data;
  data.lse = lse, data.delta = delta;
  data.visible = kdnn::attention::impl::VisibleKeys<HostExec>(mask, S, S);
  data.bq = rows;
  Kokkos::View<int*, HostExec> first("first", rows), last("last", rows);
  Kokkos::View<float*, HostExec> row_lse("row_lse", rows), row_delta("row_delta", rows);
  int any = -1;
  Kokkos::parallel_reduce(
      Kokkos::TeamPolicy<HostExec>(1, 1),
      KOKKOS_LAMBDA(const Kokkos::TeamPolicy<HostExec>::member_type& team, int& out) {
        int seen = 0;
        data.load_rows(team, 0, 0, i0, rows, first.data(), last.data(), row_lse.data(),
                       row_delta.data(), j_lo, j_hi, seen);
        out = seen;
      },
      any);
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(first(r), 0) << "row " << i0 + r;
    EXPECT_EQ(last(r), i0 + r + 1) << "row " << i0 + r;
  }
  return any;
}

TEST(FusedBackwardRows, CausalTileAboveTheDiagonalSeesNoKey) {
  EXPECT_EQ(rows_see_keys(256, 0, 128, 128, 256), 0);
  EXPECT_EQ(rows_see_keys(256, 0, 16, 16, 32), 0);
}

TEST(FusedBackwardRows, TilesOnAndBelowTheDiagonalSeeKeys) {
  EXPECT_EQ(rows_see_keys(256, 128, 128, 128, 256), 1);  // on the diagonal
  EXPECT_EQ(rows_see_keys(256, 128, 128, 0, 128), 1);    // below it
  EXPECT_EQ(rows_see_keys(256, 0, 16, 15, 32), 1);       // row 15 sees key 15
}

}  // namespace
