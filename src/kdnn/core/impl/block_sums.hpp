// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// Deterministic reductions over many rows: a kernel writes one partial sum
// per block of rows into partial [blocks, M]; sum_blocks adds the blocks in
// block order (in double) and hands each of the M totals to `store`. The
// result does not depend on the thread mapping or on run order (no atomics).
#include <Kokkos_Core.hpp>
#include <cstddef>

namespace kdnn::impl {

/// store(j, total_j) for j < M, total_j = Σ_blk partial(blk, j) summed in
/// block order. `store` is a device-callable functor.
template <class ExecSpace, class Partial, class Store>
void sum_blocks(const ExecSpace& space, const char* label, const Partial& partial,
                const Store& store) {
  const int blocks = int(partial.extent(0)), M = int(partial.extent(1));
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<ExecSpace>(space, 0, M), KOKKOS_LAMBDA(int j) {
        double total = 0;
        for (int blk = 0; blk < blocks; ++blk) total += double(partial(blk, j));
        store(j, total);
      });
}

}  // namespace kdnn::impl
