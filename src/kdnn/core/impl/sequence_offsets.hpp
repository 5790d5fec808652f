// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The offsets of packed variable-length sequences (flash-attn's and mamba's
// cu_seqlens): S + 1 int32 values, the first 0, never decreasing, the last
// the number of packed steps. Sequence s holds steps [cu[s], cu[s + 1]);
// an empty sequence (cu[s] = cu[s + 1]) holds none.
#include <Kokkos_Core.hpp>
#include <cstddef>

#include "kdnn/core/error.hpp"

namespace kdnn::impl {

/// Copies `cu` to the host on `space` (after the caller's pending writes to
/// it), checks it against `total` packed steps (`total_what` says where
/// that number comes from) and returns the copy. Throws kdnn::Error naming
/// `name` and the first bad offset.
template <class ExecSpace, class View>
Kokkos::View<int*, Kokkos::HostSpace> host_sequence_offsets(const char* op, const char* name,
                                                            const ExecSpace& space, const View& cu,
                                                            std::size_t total,
                                                            const char* total_what) {
  static_assert(unsigned(View::rank) == 1, "host_sequence_offsets: a rank-1 View");
  if (cu.extent(0) == 0) {
    fail(op, ": ", name, " has extent(0)=0, expected S + 1 >= 1 offsets (S sequences)");
  }
  Kokkos::View<int*, Kokkos::HostSpace> host("kdnn::sequence_offsets", cu.extent(0));
  Kokkos::deep_copy(space, host, cu);
  space.fence();
  if (host(0) != 0) fail(op, ": ", name, "[0]=", host(0), ", expected 0");
  for (std::size_t s = 1; s < host.extent(0); ++s) {
    if (host(s) < host(s - 1)) {
      fail(op, ": ", name, "[", s, "]=", host(s), " < ", name, "[", s - 1, "]=", host(s - 1),
           ", expected offsets that never decrease");
    }
  }
  const std::size_t last = host.extent(0) - 1;
  if (std::size_t(host(last)) != total) {
    fail(op, ": ", name, "[", last, "]=", host(last), ", expected ", total, " (", total_what, ")");
  }
  return host;
}

}  // namespace kdnn::impl
