// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Where a work item of a fused attention launch lies. Every launch of the
// fused kernels has one item per (b, h, block of rows) — blocks of queries
// for the forward and the backward's dQ, blocks of keys for dK and dV.
// Dense tensors have the same blocks in every entry, numbered batch entry
// first, then head, the block fastest. Packed sequences have as many blocks
// as each sequence's rows need (none for an empty one), listed once on the
// host in a table of (b, first row, rows), entries in order and each
// entry's blocks in order; item t·H + h is head h of row t. Either way a
// (b, h)'s blocks come in increasing item order, which the tensor-core
// backward's in-order dQ turns rely on.
#include <Kokkos_Core.hpp>
#include <string>

#include "kdnn/attention/impl/entry_rows.hpp"
#include "kdnn/core/error.hpp"
#include "kdnn/core/impl/host_filled.hpp"

namespace kdnn::attention::impl {

struct RowBlock {
  int b, h, bh;      ///< batch entry, head, and b·H + h
  int start, count;  ///< the block's first row and its rows (fewer than a block at the end)
};

/// Item `item` of a dense launch over `heads` heads and blocks of `size`
/// rows of `extent` (> 0: a launch over no rows has no items).
KOKKOS_INLINE_FUNCTION RowBlock row_block(int item, int heads, int extent, int size) {
  const int blocks = (extent + size - 1) / size;
  const int bh = item / blocks, start = item % blocks * size;
  return {bh / heads, bh % heads, bh, start, extent - start < size ? extent - start : size};
}

/// The items of one launch, as its kernel reads them.
template <class ExecSpace>
struct RowBlocks {
  using Table = Kokkos::View<const int* [3], typename ExecSpace::memory_space>;
  Table table;  ///< packed: (b, first row, rows) per block; dense: empty
  int heads = 1, extent = 0, size = 1;
  int items = 0;  ///< the launch's items

  KOKKOS_INLINE_FUNCTION RowBlock operator()(int item) const {
    if (table.extent(0) == 0) return row_block(item, heads, extent, size);
    const int t = item / heads, h = item % heads, b = table(t, 0);
    return {b, h, b * heads + h, table(t, 1), table(t, 2)};
  }
};

/// The items of a launch over `rows` and `heads` heads in blocks of `size`
/// rows; a packed launch's table is copied to the device on `space`.
/// Refuses a launch of 2^31 items or more (the kernels index them in int).
template <class ExecSpace>
RowBlocks<ExecSpace> row_blocks(const char* op, const ExecSpace& space, const EntryRows& rows,
                                int heads, int size) {
  RowBlocks<ExecSpace> out;
  out.heads = heads, out.extent = rows.extent, out.size = size;
  long long blocks = 0;  // per head
  if (rows.offsets.extent(0) == 0) {
    blocks = (long long)rows.entries * ((rows.extent + size - 1) / size);
  } else {
    for (int b = 0; b < rows.entries; ++b) {
      blocks += (rows.offsets(b + 1) - rows.offsets(b) + size - 1) / size;
    }
  }
  const long long items = blocks * heads;
  if (items > 2147483647LL) {
    fail(op, ": ", items, " blocks of ", size, " rows over ", heads,
         " heads, expected at most 2^31 - 1 (the launch's items)");
  }
  out.items = int(items);
  if (rows.offsets.extent(0) == 0 || blocks == 0) return out;
  using Table = Kokkos::View<int* [3], typename ExecSpace::memory_space>;
  out.table = kdnn::impl::filled_on_host(
      space,
      Table(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                               std::string("kdnn::attention::row_blocks")),
            std::size_t(blocks)),
      [&](const auto& host) {
        std::size_t t = 0;
        for (int b = 0; b < rows.entries; ++b) {
          const int length = rows.offsets(b + 1) - rows.offsets(b);
          for (int start = 0; start < length; start += size, ++t) {
            host(t, 0) = b;
            host(t, 1) = start;
            host(t, 2) = length - start < size ? length - start : size;
          }
        }
      });
  return out;
}

}  // namespace kdnn::attention::impl
