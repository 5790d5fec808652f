// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#pragma once
// The rows of the fused attention's batch entries. Dense tensors
// [B, H, S, ·] give every entry S rows. Packed sequences (flash-attn's
// varlen layout, [T, H, ·] with offsets cu_seqlens [N + 1]) are read as one
// flat entry [1, H, T, ·] for what works row by row (δ, the group sums of
// GQA, fills) and, by the kernels, as N entries of their own lengths, at
// most `extent` rows each: entry_rows below.
#include <Kokkos_Core.hpp>

#include "kdnn/core/impl/strided_rows.hpp"

namespace kdnn::attention::impl {

/// `entries` entries of `extent` rows each, or, with `offsets` (checked),
/// packed sequences of offsets(b + 1) − offsets(b) ≤ extent rows, whose
/// offsets `device` holds on the device.
struct EntryRows {
  int entries = 0, extent = 0;
  Kokkos::View<const int*, Kokkos::HostSpace> offsets;  ///< [entries + 1]; empty: dense
  const int* device = nullptr;                          ///< the same offsets on the device

  bool packed() const { return offsets.extent(0) > 0; }
};

/// The kernels' view of `flat` ([B, H, S, ·], or [1, H, T, ·] when `rows`
/// is packed): entry b's rows.
template <class View>
kdnn::impl::StridedRows4<typename View::value_type> entry_rows(const View& flat,
                                                               const EntryRows& rows) {
  kdnn::impl::StridedRows4<typename View::value_type> out(flat);
  if (rows.packed()) {
    out.s0 = 0;  // every entry in the one packed dimension
    out.n[0] = std::size_t(rows.entries);
    out.n[2] = std::size_t(rows.extent);
    out.rows_at = rows.device;
  }
  return out;
}

/// The same for one value per row ([B, H, S] or [1, H, T]).
template <class View>
kdnn::impl::StridedRows3<typename View::value_type> entry_values(const View& flat,
                                                                 const EntryRows& rows) {
  kdnn::impl::StridedRows3<typename View::value_type> out(flat);
  if (rows.packed()) {
    out.s0 = 0;
    out.n[0] = std::size_t(rows.entries);
    out.n[2] = std::size_t(rows.extent);
    out.rows_at = rows.device;
  }
  return out;
}

}  // namespace kdnn::attention::impl
