// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Where a work item of a fused attention launch lies. Every launch of the
// fused kernels has one item per (b, h, block of rows) — blocks of queries
// for the forward and the backward's dQ, blocks of keys for dK and dV —
// numbered batch entry first, then head, the block fastest; each kernel
// decodes its item here.
#include <Kokkos_Core.hpp>

namespace kdnn::attention::impl {

struct RowBlock {
  int b, h, bh;      ///< batch entry, head, and b·H + h
  int start, count;  ///< the block's first row and its rows (fewer than a block at the end)
};

/// Item `item` of a launch over `heads` heads and blocks of `size` rows of
/// `extent` (> 0: a launch over no rows has no items).
KOKKOS_INLINE_FUNCTION RowBlock row_block(int item, int heads, int extent, int size) {
  const int blocks = (extent + size - 1) / size;
  const int bh = item / blocks, start = item % blocks * size;
  return {bh / heads, bh % heads, bh, start, extent - start < size ? extent - start : size};
}

}  // namespace kdnn::attention::impl
